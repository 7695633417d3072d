"""Stand-ins for where models live, for the import tests: an HTTPS file server and a Hub-compatible
server, both on 127.0.0.1 with a certificate of a CA made by the test, each a thread of the test
process (cheap to start).

- `TestCA(folder)`: a CA and a certificate for 127.0.0.1 / localhost; `ca_file` is what a client
  trusts (`SSL_CERT_FILE`, which modelhost's fetches read: `outbound.tls.tls_context`).
- `RemoteServer(ca)`: serves `files` at `/files/<path>` (with `Range: bytes=a-`; at `/whole/<path>`
  ignoring it; at `/gated/<path>` once the test sets `gate`), `/redirect?to=URL`, `/status/<code>`,
  `/trickle` (ten bytes, one each 0.1 s),
  `/stall` (one byte, then silence), `/flaky/<path>` (a 503, then half the file and a cut connection,
  then the file with ranges), and the Hub routes of the repositories added with
  `add_hub_repo`: the listing huggingface_hub's `model_info(..., files_metadata=True)` asks for
  (`/api/models/{repo}/revision/{rev}`, `siblings` with `size`, `blobId` and `lfs: {sha256, size,
  pointerSize}`) and `/{repo}/resolve/{rev}/{path}`, which redirects LFS files (safetensors) to
  another server, as the Hub does to its CDN. `requests` records (path, headers) of each request.

An end-to-end import is then a few lines: a server process with `SSL_CERT_FILE=ca.ca_file`,
`HF_ENDPOINT=hub.base` and `MODELHOST_MEDIA_ALLOW_NETWORKS=127.0.0.0/8`.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import ipaddress
import json
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


class TestCA:
    """A certificate authority made here, and one server certificate it signed for 127.0.0.1."""

    __test__ = False  # not a test class, whatever its name

    def __init__(self, folder: Path) -> None:
        now = datetime.datetime.now(datetime.UTC)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "modelhost test CA")])
        ca_cert = (
            _builder(ca_name, ca_name, ca_key.public_key(), now)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        key = ec.generate_private_key(ec.SECP256R1())
        names = x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        )
        cert = (
            _builder(
                x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]),
                ca_name,
                key.public_key(),
                now,
            )
            .add_extension(names, critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
            )
            .sign(ca_key, hashes.SHA256())
        )
        self.ca_file = folder / "ca.pem"
        self.ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
        self._cert_file, self._key_file = folder / "server.pem", folder / "server.key"
        self._cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self._key_file.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self._cert_file, self._key_file)
        return context


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, now: datetime.datetime
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


@dataclass
class HubRepo:
    """A repository the Hub stand-in serves: its files at one commit, LFS files on `cdn`."""

    files: dict[str, bytes]
    commit: str
    cdn: RemoteServer
    token: str | None = None  # when set, the repository is gated: only this bearer token reads it
    revisions: tuple[str, ...] = ("main",)

    def lfs(self, path: str) -> bool:
        return path.endswith(".safetensors")

    def listing(self, repo_id: str) -> dict[str, object]:
        siblings = []
        for path, data in sorted(self.files.items()):
            sibling: dict[str, object] = {"rfilename": path, "size": len(data), "blobId": _git_oid(data)}
            if self.lfs(path):
                sibling["lfs"] = {
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "size": len(data),
                    "pointerSize": 134,
                }
            siblings.append(sibling)
        return {"id": repo_id, "modelId": repo_id, "sha": self.commit, "private": False, "siblings": siblings}


@dataclass
class RemoteServer:
    """One HTTPS server in a thread of the test process (see the module's docstring)."""

    ca: TestCA
    files: dict[str, bytes] = field(default_factory=dict)
    hub_repos: dict[str, HubRepo] = field(default_factory=dict)
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    flaky_tries: dict[str, int] = field(default_factory=dict)
    gate: threading.Event = field(default_factory=threading.Event)  # what `/gated/<path>` waits for

    def __post_init__(self) -> None:
        server = self
        handler = type("Handler", (_Handler,), {"server_state": server})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self._httpd.socket = self.ca.server_context().wrap_socket(self._httpd.socket, server_side=True)
        self.base = f"https://127.0.0.1:{self._httpd.server_address[1]}"
        threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True).start()

    def url(self, path: str) -> str:
        return f"{self.base}/files/{path}"

    def add_hub_repo(
        self, repo_id: str, files: dict[str, bytes], cdn: RemoteServer, *, token: str | None = None
    ) -> HubRepo:
        commit = hashlib.sha1(json.dumps(sorted(files)).encode() + b"".join(files.values())).hexdigest()
        repo = HubRepo(files, commit, cdn, token)
        for path, data in files.items():
            if repo.lfs(path):
                cdn.files[f"lfs/{hashlib.sha256(data).hexdigest()}"] = data
        self.hub_repos[repo_id] = repo
        return repo

    def close(self) -> None:
        self.stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()


def _git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    server_state: RemoteServer

    def do_GET(self) -> None:
        state = self.server_state
        url = urlsplit(self.path)
        state.requests.append((url.path, dict(self.headers.items())))
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, ssl.SSLError):
            self._route(unquote(url.path), {k: v[0] for k, v in parse_qs(url.query).items()})

    def _route(self, path: str, query: dict[str, str]) -> None:
        state = self.server_state
        if path.startswith("/files/"):
            data = state.files.get(path.removeprefix("/files/"))
            self._file(data) if data is not None else self._answer(404, b"Not found")
        elif path.startswith("/gated/"):  # served once the test opens `gate`
            data = state.files.get(path.removeprefix("/gated/"))
            state.gate.wait(60)
            self._file(data) if data is not None else self._answer(404, b"Not found")
        elif path.startswith("/whole/"):
            data = state.files.get(path.removeprefix("/whole/"))
            self._answer(200, data) if data is not None else self._answer(404, b"Not found")
        elif path.startswith("/flaky/"):
            self._flaky(path.removeprefix("/flaky/"))
        elif path in ("/trickle", "/stall"):
            self._slowly(10 if path == "/trickle" else 1, stall=path == "/stall")
        elif path == "/redirect":
            self._redirect(query["to"])
        elif path.startswith("/status/"):
            self._answer(int(path.rsplit("/", 1)[1]), b"as asked")
        elif path.startswith("/api/models/"):
            self._hub_listing(path.removeprefix("/api/models/"))
        elif "/resolve/" in path:
            self._hub_resolve(path)
        else:
            self._answer(404, b"Not found")

    def _hub_listing(self, rest: str) -> None:
        repo_id, _, revision = rest.partition("/revision/")
        revision = revision or "main"  # `model_info` without a revision asks `/api/models/{repo}`
        repo = self._hub_repo(repo_id)
        if repo is None:
            return
        if revision not in repo.revisions and revision != repo.commit:
            self._answer(404, b'{"error": "Invalid rev id"}', {"X-Error-Code": "RevisionNotFound"})
            return
        body = json.dumps(repo.listing(repo_id)).encode()
        self._answer(200, body, {"Content-Type": "application/json"})

    def _hub_resolve(self, path: str) -> None:
        repo_id, _, rest = path.strip("/").partition("/resolve/")
        repo = self._hub_repo(repo_id)
        if repo is None:
            return
        revision, _, file = rest.partition("/")
        data = repo.files.get(file)
        if (revision != repo.commit and revision not in repo.revisions) or data is None:
            self._answer(404, b"Entry not found", {"X-Error-Code": "EntryNotFound"})
        elif repo.lfs(file):
            self._redirect(
                repo.cdn.url(f"lfs/{hashlib.sha256(data).hexdigest()}"), {"X-Repo-Commit": repo.commit}
            )
        else:
            self._file(data, {"X-Repo-Commit": repo.commit})

    def _hub_repo(self, repo_id: str) -> HubRepo | None:
        repo = self.server_state.hub_repos.get(repo_id)
        if repo is None:  # the Hub's answer to a caller without a token, whether or not the repo exists
            self._answer(401, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"})
        elif repo.token is not None and self.headers.get("Authorization") != f"Bearer {repo.token}":
            self._answer(
                403, b'{"error": "Access to this model is restricted"}', {"X-Error-Code": "GatedRepo"}
            )
            return None
        return repo

    def _file(self, data: bytes, headers: dict[str, str] | None = None) -> None:
        """The file, or from `Range: bytes=a-` on."""
        ranged = self.headers.get("Range", "")
        start = int(ranged.removeprefix("bytes=").rstrip("-")) if ranged.startswith("bytes=") else 0
        extra = dict(headers or {})
        if ranged:
            extra["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        self._answer(206 if ranged else 200, data[start:], {"Accept-Ranges": "bytes", **extra})

    def _flaky(self, path: str) -> None:
        state, data = self.server_state, self.server_state.files[path]
        tries = state.flaky_tries[path] = state.flaky_tries.get(path, 0) + 1
        if tries == 1:
            self._answer(503, b"busy")
        elif tries == 2:
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.close_connection = True
        else:
            self._file(data)

    def _slowly(self, count: int, *, stall: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(count + int(stall)))
        self.end_headers()
        for _ in range(count):
            self.wfile.write(b"x")
            self.wfile.flush()
            if self.server_state.stop.wait(0.1):
                return
        if stall:
            self.server_state.stop.wait(5)

    def _redirect(self, location: str, headers: dict[str, str] | None = None) -> None:
        self._answer(302, b"", {"Location": location, **(headers or {})})

    def _answer(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass
