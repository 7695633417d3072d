"""A real OpenID provider for the tests (tests/oidc/provider.mjs: panva's oidc-provider on Node.js), with
its people and their groups; `update()` makes a change to its people (a group given or taken, a person
deleted) seen at once, its sessions and refresh tokens kept; `rotate()` restarts it signing with a new key
(JWKS rotation)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from joserfc.jwk import RSAKey

HERE = Path(__file__).parent / "oidc"
CLIENT_ID, CLIENT_SECRET = "modelhost", "test-client-secret-0123456789"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def available() -> str | None:
    """Why the provider cannot run here (no Node.js, or its package not installed), or None."""
    if shutil.which("node") is None:
        return "no node on PATH"
    if not (HERE / "node_modules" / "oidc-provider").is_dir():
        return "tests/oidc/node_modules is missing: run scripts/setup.sh dev (npm ci in tests/oidc)"
    return None


def signing_key() -> dict[str, Any]:
    key = RSAKey.generate_key(2048, parameters={"use": "sig", "alg": "RS256"}, private=True, auto_kid=True)
    return dict(key.as_dict(private=True))


@dataclass
class OidcProvider:
    folder: Path
    redirect_uris: list[str]
    users: dict[str, dict[str, Any]]
    port: int = field(default_factory=free_port)
    key: dict[str, Any] = field(default_factory=signing_key)
    process: subprocess.Popen[bytes] | None = None

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.update()
        log = (self.folder / "provider.log").open("ab")
        self.process = subprocess.Popen(
            ["node", str(HERE / "provider.mjs"), str(self.folder / "provider.json")], stdout=log, stderr=log
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{self.issuer}/.well-known/openid-configuration", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert self.process.poll() is None, (self.folder / "provider.log").read_text()
            assert time.monotonic() < deadline, "the OpenID provider did not start"
            time.sleep(0.1)

    def update(self) -> None:
        """Write its configuration: `users` as they are now (the running provider reads its people from
        it at each use)."""
        config = {
            "port": self.port,
            "issuer": self.issuer,
            "jwks": {"keys": [self.key]},
            "users": self.users,
            "clients": [
                {
                    "client_id": CLIENT_ID,
                    "client_secret": CLIENT_SECRET,
                    "redirect_uris": self.redirect_uris,
                    "post_logout_redirect_uris": [
                        uri.rsplit("/v1/", 1)[0] + "/console" for uri in self.redirect_uris
                    ],
                    "grant_types": [
                        "authorization_code",
                        "refresh_token",
                        "urn:ietf:params:oauth:grant-type:device_code",
                    ],
                    "response_types": ["code"],
                    "token_endpoint_auth_method": "client_secret_basic",
                }
            ],
        }
        written = self.folder / "provider.json.new"
        written.write_text(json.dumps(config))
        written.replace(self.folder / "provider.json")  # whole, never half-written when it is read

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)
            self.process = None

    def rotate(self) -> None:
        """Sign with a new key from now on (a new `kid` in its JWKS)."""
        self.stop()
        self.key = signing_key()
        self.start()
