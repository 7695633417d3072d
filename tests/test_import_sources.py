"""Where imports fetch from, as a spec: the HTTPS source (file URLs or one archive), safe archive
unpacking, and the Hugging Face Hub source, each against local servers (tests/remote_servers.py) on
127.0.0.1 with a test CA's certificate. The servers are on loopback, so the tests allow 127.0.0.0/8
exactly as an operator allows a network (MODELHOST_MEDIA_ALLOW_NETWORKS); some show the refusal
without it. No modelhost server is needed: the runner that stages these files is tested with the
imports' API.
"""

from __future__ import annotations

import hashlib
import io
import ipaddress
import re
import tarfile
import tracemalloc
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from modelhost.config import Settings
from modelhost.errors import InvalidRequest
from modelhost.imports import archive, remote
from modelhost.imports.archive import ArchiveLimits, unpack, unpack_async
from modelhost.imports.https import HttpsSource, https_headers, parse_https_source
from modelhost.imports.hub import HubSource, parse_hub_source, select_files
from modelhost.imports.remote import import_bounds
from modelhost.imports.sources import ImportFailed, ImportSource, RemoteFile
from tests import hostile_archives as hostile
from tests.remote_servers import RemoteServer, TestCA

LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"),)
WEIGHTS = bytes(range(256)) * 40  # 10 KB that a resumed read can be checked against


def settings(*, allowed: bool = True) -> Settings:
    """The server's settings as an operator who allows loopback (the test servers') would set them."""
    return Settings(
        data_dir=Path("unused"),
        media_allow_networks=["127.0.0.0/8"] if allowed else [],
        import_read_timeout_seconds=5,
        max_upload_file_bytes=10_000_000,
    )


def https(source: Any, *, allowed: bool = True, **options: Any) -> HttpsSource:
    return HttpsSource(source, settings=settings(allowed=allowed), **options)


def hub_source(source: str, *, allowed: bool = True, **options: Any) -> HubSource:
    return HubSource(source, settings=settings(allowed=allowed), **options)


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCA]:
    """The test CA, trusted by this module's fetches through SSL_CERT_FILE (as an operator's CA is)."""
    made = TestCA(tmp_path_factory.mktemp("ca"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SSL_CERT_FILE", str(made.ca_file))
        yield made


@pytest.fixture(autouse=True)
def no_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """One try per request, unless a test asks for retries: a failure is then told at once."""
    monkeypatch.setattr(remote, "RETRY_DELAYS", ())


@pytest.fixture(scope="module")
def files(ca: TestCA) -> Iterator[RemoteServer]:
    server = RemoteServer(ca)
    yield server
    server.close()


@pytest.fixture(scope="module")
def cdn(ca: TestCA) -> Iterator[RemoteServer]:
    """Where the Hub stand-in redirects LFS files: another origin, as the Hub's CDN is."""
    server = RemoteServer(ca)
    yield server
    server.close()


async def read_all(source: ImportSource, file: RemoteFile, offset: int = 0) -> bytes:
    return b"".join([chunk async for chunk in source.read(file, offset)])


async def failure(awaitable: object) -> ImportFailed:
    with pytest.raises(ImportFailed) as caught:
        await awaitable  # type: ignore[misc]
    return caught.value


# ---------------------------------------------------------------- HTTPS: what a source may be


def test_one_archive_url_is_one_file_to_unpack() -> None:
    entries = parse_https_source("https://example.com/models/tiny.tar.gz?sig=abc")
    assert [(e.url, e.path, e.archive) for e in entries] == [
        ("https://example.com/models/tiny.tar.gz?sig=abc", "tiny.tar.gz", True)
    ]


def test_one_file_url_is_one_file() -> None:
    [entry] = parse_https_source("https://example.com/m/model.safetensors")
    assert (entry.path, entry.archive) == ("model.safetensors", False)


def test_a_list_gives_each_file_its_path_and_stated_checksum() -> None:
    entries = parse_https_source(
        [
            "https://example.com/a/config.json",
            {"url": "https://example.com/blob/123", "path": "model.safetensors", "sha256": "AB" * 32},
        ]
    )
    assert [(e.path, e.sha256, e.archive) for e in entries] == [
        ("config.json", None, False),
        ("model.safetensors", "ab" * 32, False),
    ]


@pytest.mark.parametrize(
    ("source", "param"),
    [
        ("http://example.com/model.tar", "source"),
        ("https://user:secret@example.com/model.tar", "source"),
        ([], "source"),
        (["https://a.example/x/config.json", "https://b.example/y/config.json"], "source[1].path"),
        (["https://example.com/dir/"], "source[0].path"),
        ([{"url": "https://example.com/x", "path": "../x"}], "source[0].path"),
        ([{"url": "https://example.com/x", "sha256": "abc"}], "source[0].sha256"),
        ([{"url": "https://example.com/x", "md5": "abc"}], "source[0]"),
        (["ftp://example.com/x"], "source[0]"),
        ([{"url": "http://example.com/x"}], "source[0].url"),
    ],
)
def test_malformed_https_sources_are_refused_naming_the_entry(source: object, param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_https_source(source)  # type: ignore[arg-type]
    assert caught.value.param == param


def test_credentials_become_request_headers() -> None:
    assert https_headers({"bearer_token": "t0k"}) == {"Authorization": "Bearer t0k"}
    assert https_headers({"headers": {"X-Api-Key": "k"}}) == {"X-Api-Key": "k"}
    with pytest.raises(InvalidRequest):
        https_headers({"headers": {"X-Bad": "a\r\nInjected: 1"}})


# ---------------------------------------------------------------- HTTPS: fetching


async def test_listed_urls_are_fetched_with_their_sizes_and_stated_checksums(files: RemoteServer) -> None:
    files.files |= {"m/config.json": b"{}", "m/model.safetensors": WEIGHTS}
    wrong = "0" * 64  # carried as stated: the runner checks the bytes against it
    source = https([files.url("m/config.json"), {"url": files.url("m/model.safetensors"), "sha256": wrong}])
    listed = await source.list_files()
    assert [(f.path, f.size, f.sha256, f.archive) for f in listed] == [
        ("config.json", 2, None, False),
        ("model.safetensors", len(WEIGHTS), wrong, False),
    ]
    assert await read_all(source, listed[1]) == WEIGHTS
    assert source.description == f"{files.url('m/config.json')} and 1 more"


async def test_a_resumed_read_asks_for_the_rest_only(files: RemoteServer) -> None:
    files.files["m/model.safetensors"] = WEIGHTS
    source = https([files.url("m/model.safetensors")])
    [listed] = await source.list_files()
    assert await read_all(source, listed, offset=6000) == WEIGHTS[6000:]
    assert files.requests[-1][1].get("Range") == "bytes=6000-"


async def test_a_broken_transfer_is_tried_again_from_where_it_stopped(
    files: RemoteServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote, "RETRY_DELAYS", (0.0, 0.0))
    files.files["flaky.safetensors"] = WEIGHTS
    url = f"{files.base}/flaky/flaky.safetensors"
    source = https([{"url": url, "path": "model.safetensors"}])
    assert await read_all(source, RemoteFile("model.safetensors", url)) == WEIGHTS  # a 503, a cut, the rest
    assert files.requests[-1][1]["Range"] == f"bytes={len(WEIGHTS) // 2}-"


async def test_a_server_that_ignores_ranges_is_read_from_the_offset_anyway(files: RemoteServer) -> None:
    files.files["m/model.safetensors"] = WEIGHTS
    source = https([{"url": f"{files.base}/whole/m/model.safetensors", "path": "model.safetensors"}])
    [listed] = await source.list_files()
    assert await read_all(source, listed, offset=6000) == WEIGHTS[6000:]


async def test_the_read_timeout_is_an_idle_timeout_not_a_deadline(files: RemoteServer) -> None:
    """A download that keeps moving outlasts the timeout; one that goes silent fails after it."""
    timeout = settings().model_copy(update={"import_read_timeout_seconds": 0.5})
    moving = HttpsSource([{"url": f"{files.base}/trickle", "path": "x"}], settings=timeout)
    assert await read_all(moving, RemoteFile("x", f"{files.base}/trickle")) == b"x" * 10  # about 1 s
    silent = HttpsSource([{"url": f"{files.base}/stall", "path": "x"}], settings=timeout)
    caught = await failure(read_all(silent, RemoteFile("x", f"{files.base}/stall")))
    assert (caught.code, caught.message) == ("source_unreachable", "Timed out after 0.5 s fetching `x`")


async def test_include_and_exclude_choose_among_listed_urls(files: RemoteServer) -> None:
    files.files |= {"m/config.json": b"{}", "m/model.safetensors": WEIGHTS}
    urls = [files.url("m/config.json"), files.url("m/model.safetensors")]
    assert [f.path for f in await https(urls, exclude=["*.json"]).list_files()] == ["model.safetensors"]
    assert (await failure(https(urls, include=["*.bin"]).list_files())).code == "source_not_found"


async def test_an_archive_url_is_listed_as_one_archive(files: RemoteServer) -> None:
    files.files["tiny.tgz"] = b"\x1f\x8b not really"
    [listed] = await https(files.url("tiny.tgz")).list_files()
    assert (listed.path, listed.archive, listed.size) == ("tiny.tgz", True, 13)


async def test_credentials_go_to_the_original_host_only(files: RemoteServer, cdn: RemoteServer) -> None:
    cdn.files["signed/model.safetensors"] = WEIGHTS
    redirecting = f"{files.base}/redirect?to={cdn.url('signed/model.safetensors')}"
    source = https(
        [{"url": redirecting, "path": "model.safetensors"}], credentials={"bearer_token": "s3cret"}
    )
    [listed] = await source.list_files()
    assert await read_all(source, listed) == WEIGHTS
    assert files.requests[-1][1]["Authorization"] == "Bearer s3cret"
    assert "Authorization" not in cdn.requests[-1][1]


@pytest.mark.parametrize(
    ("status", "code"),
    [(404, "source_not_found"), (410, "source_not_found"), (401, "source_denied"), (403, "source_denied"),
     (500, "source_unreachable"), (429, "source_unreachable")],
)  # fmt: skip
async def test_http_errors_fail_with_a_stable_code(files: RemoteServer, status: int, code: str) -> None:
    source = https([{"url": f"{files.base}/status/{status}", "path": "x"}])
    caught = await failure(source.list_files())
    assert caught.code == code
    assert f"HTTP {status}" in caught.message


async def test_a_loopback_server_is_refused_unless_the_operator_allows_its_network(
    files: RemoteServer,
) -> None:
    files.files["config.json"] = b"{}"
    source = https([files.url("config.json")], allowed=False)
    caught = await failure(source.list_files())
    assert caught.code == "address_refused"
    assert "MODELHOST_MEDIA_ALLOW_NETWORKS" in caught.message


@pytest.mark.parametrize(
    "target", ["https://10.0.0.1/x", "https://169.254.169.254/latest/", "http://127.0.0.1:1/x"]
)
async def test_a_redirect_to_a_private_address_or_to_plain_http_is_refused(
    files: RemoteServer, target: str
) -> None:
    source = https([{"url": f"{files.base}/redirect?to={target}", "path": "x"}])
    assert (await failure(source.list_files())).code == "address_refused"


async def test_tls_trusts_the_ca_of_ssl_cert_file_only(
    files: RemoteServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import certifi

    files.files["config.json"] = b"{}"
    monkeypatch.setenv("SSL_CERT_FILE", certifi.where())  # a bundle without the test CA
    source = https([files.url("config.json")])
    caught = await failure(source.list_files())
    assert (caught.code, "CERTIFICATE_VERIFY_FAILED" in caught.message) == ("source_unreachable", True)


def test_the_import_bounds_take_the_media_networks_and_the_upload_and_import_limits(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path,
        media_allow_networks=["10.0.0.0/8"],
        max_upload_file_bytes=123,
        import_read_timeout_seconds=7,
        import_deadline_seconds=99,
    )
    made = import_bounds(settings)
    assert (made.networks, made.max_bytes, made.idle_seconds, made.seconds) == (
        (ipaddress.ip_network("10.0.0.0/8"),),
        123,
        7,
        99,
    )


# ---------------------------------------------------------------- archives

LIMITS = ArchiveLimits(max_members=100, max_bytes=10_000_000)


def make_tar(path: Path, members: Sequence[tarfile.TarInfo | tuple[str, bytes]], mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as tar:  # type: ignore[call-overload]
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                tar.addfile(member)
            else:
                info = tarfile.TarInfo(member[0])
                info.size = len(member[1])
                tar.addfile(info, io.BytesIO(member[1]))
    return path


def make_zip(path: Path, members: Sequence[tuple[str | zipfile.ZipInfo, bytes]]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members:
            zf.writestr(name, data)
    return path


def unpacked(path: Path, limits: ArchiveLimits = LIMITS) -> dict[str, bytes]:
    found = {}
    for member in unpack(path, limits):
        data = member.stream.read()
        assert len(data) == member.size
        found[member.path] = data
    return found


def tar_entry(name: str, kind: bytes, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info


MODEL = [("model/config.json", b"{}"), ("model/sub/model.safetensors", WEIGHTS)]


@pytest.mark.parametrize("kind", ["tar", "tar.gz", "zip"])
def test_an_archive_unpacks_with_its_one_top_folder_stripped(tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"m.{kind}"
    if kind == "zip":
        make_zip(path, [("model/", b""), *MODEL])
    else:
        make_tar(path, [tar_entry("model", tarfile.DIRTYPE), *MODEL], "w:gz" if kind == "tar.gz" else "w")
    assert unpacked(path) == {"config.json": b"{}", "sub/model.safetensors": WEIGHTS}


async def test_the_runner_reads_an_archive_without_blocking_the_event_loop(tmp_path: Path) -> None:
    path = make_tar(tmp_path / "m.tgz", MODEL)
    found = {
        name: (size, b"".join([c async for c in chunks]))
        async for name, size, chunks in unpack_async(path, LIMITS)
    }
    assert found == {"config.json": (2, b"{}"), "sub/model.safetensors": (len(WEIGHTS), WEIGHTS)}


def test_files_at_the_top_keep_their_paths(tmp_path: Path) -> None:
    path = make_tar(tmp_path / "m.tgz", [("./config.json", b"{}"), ("./tok/vocab.txt", b"a")])
    assert unpacked(path) == {"config.json": b"{}", "tok/vocab.txt": b"a"}


@pytest.mark.parametrize(
    ("members", "says"),
    [
        ([("/etc/passwd", b"x")], "absolute"),
        ([("model/../../x", b"x")], "leading out"),
        ([tar_entry("model/link", tarfile.SYMTYPE, "/etc/passwd")], "link"),
        ([("a", b"x"), tar_entry("model/hard", tarfile.LNKTYPE, "a")], "link"),
        ([tar_entry("model/dev", tarfile.CHRTYPE)], "device"),
        ([tar_entry("model/fifo", tarfile.FIFOTYPE)], "device, fifo"),
        ([("m/a", b"1"), ("m/a", b"2")], "same path twice"),
        ([("m/.modelhost-x", b"1")], "cannot be a file"),
        ([(f"m/{i}", b"") for i in range(5)], "more than 4 members"),
    ],
)
def test_a_hostile_tar_is_refused_before_any_file_is_given(tmp_path: Path, members: list, says: str) -> None:  # type: ignore[type-arg]
    path = make_tar(tmp_path / "bad.tgz", members)
    with pytest.raises(ImportFailed, match=says) as caught:
        unpacked(path, ArchiveLimits(max_members=4, max_bytes=1_000_000))
    assert caught.value.code == "unsafe_archive"


def test_a_zip_with_a_path_leading_out_is_refused(tmp_path: Path) -> None:
    path = make_zip(tmp_path / "bad.zip", [("model/config.json", b"{}"), ("model/../../evil", b"x")])
    with pytest.raises(ImportFailed, match="leading out") as caught:
        unpacked(path)
    assert caught.value.code == "unsafe_archive"


def test_a_zip_with_a_symlink_is_refused(tmp_path: Path) -> None:
    link = zipfile.ZipInfo("model/link")
    link.external_attr = 0o120777 << 16
    path = make_zip(tmp_path / "bad.zip", [("model/config.json", b"{}"), (link, b"/etc/passwd")])
    with pytest.raises(ImportFailed, match="link"):
        unpacked(path)


@pytest.mark.parametrize("kind", ["tar.gz", "zip"])
def test_an_archive_expanding_past_the_bound_is_refused(tmp_path: Path, kind: str) -> None:
    zeros = [("m/zeros", bytes(2_000_000))]
    path = make_zip(tmp_path / "b.zip", zeros) if kind == "zip" else make_tar(tmp_path / "b.tgz", zeros)
    with pytest.raises(ImportFailed, match="expands to more than 1000000 bytes"):
        unpacked(path, ArchiveLimits(max_members=10, max_bytes=1_000_000))


@pytest.mark.parametrize("kind", ["tar.gz", "zip"])
def test_a_compression_bomb_is_refused_by_its_ratio(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(archive, "RATIO_FLOOR_BYTES", 100_000)  # rather than inflating 64 MB here
    zeros = [("m/zeros", bytes(3_000_000))]  # some 3 KB compressed: a ratio of about 1000
    path = make_zip(tmp_path / "b.zip", zeros) if kind == "zip" else make_tar(tmp_path / "b.tgz", zeros)
    with pytest.raises(ImportFailed, match="100 times") as caught:
        unpacked(path)
    assert caught.value.code == "unsafe_archive"


def test_a_file_that_is_not_an_archive_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.tar"
    path.write_bytes(b"<html>not found</html>" * 40)
    with pytest.raises(ImportFailed) as caught:
        unpacked(path)
    assert caught.value.code == "unsafe_archive"


# ---------------------------------------------------------------- hostile archives (issue 58)


def refusal(archive_bytes: bytes, tmp_path: Path, suffix: str = "tgz", **limits: int) -> tuple[str, int, int]:
    """(message, bytes given to the stager, peak Python memory) of unpacking a hostile archive, which
    must be refused with `unsafe_archive`."""
    path = tmp_path / f"hostile.{suffix}"
    path.write_bytes(archive_bytes)
    given = 0
    tracemalloc.start()
    try:
        with pytest.raises(ImportFailed) as caught:
            for member in unpack(path, ArchiveLimits(**{"max_members": 100, "max_bytes": 10**12, **limits})):
                while chunk := member.stream.read(1024**2):
                    given += len(chunk)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert caught.value.code == "unsafe_archive", caught.value.message
    return caught.value.message, given, peak


@pytest.mark.parametrize("build", [hostile.sparse_tar_gz, hostile.pax_sparse_tar_gz], ids=["gnu", "pax"])
def test_a_sparse_member_is_refused_before_its_holes_are_made(tmp_path: Path, build: Any) -> None:
    """Found on main: 269 bytes of .tar.gz staged 200 MiB of zeros, against a bound of 64 MiB."""
    message, given, _ = refusal(build(200 * 1024**2), tmp_path)
    assert "sparse file" in message and given == 0


@pytest.mark.parametrize(
    "build", [hostile.long_name_tar_gz, hostile.pax_header_tar_gz], ids=["long-name", "pax"]
)
def test_long_name_and_pax_headers_are_bounded_before_they_are_read(tmp_path: Path, build: Any) -> None:
    """Found on main: a 61 KB archive with a 60 MiB long-name header cost 181 MiB before it was judged."""
    archive_bytes = build(32 * 1024**2)
    assert len(archive_bytes) < 64 * 1024
    message, given, peak = refusal(archive_bytes, tmp_path)
    assert f"(at most {archive.MAX_HEADER_BYTES})" in message and given == 0
    assert peak < 8 * 1024**2  # the 1 MiB read buffers, never the header


def test_a_chain_of_headers_before_one_member_is_refused(tmp_path: Path) -> None:
    """On main each header read the next by calling itself: 600 of them (2.6 KB) raised RecursionError."""
    message, _, _ = refusal(hostile.chained_headers_tar_gz(600), tmp_path)
    assert f"more than {archive.MAX_HEADERS_PER_MEMBER} headers" in message


def test_a_zip_directory_is_judged_by_its_end_record_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unread(*_: object) -> None:
        raise AssertionError("the central directory was read")

    five = hostile.zip_with_entries(5)
    with monkeypatch.context() as never:
        never.setattr(archive.zipfile, "ZipFile", unread)
        message, _, _ = refusal(five, tmp_path, "zip", max_members=4)
    assert "more than 4 members" in message
    message, _, _ = refusal(hostile.zip_with_extra_fields(3, 60_000), tmp_path, "zip")
    assert f"at most {archive.ZIP_DIRECTORY_BYTES_PER_ENTRY} each" in message


def test_a_zip64_directory_is_counted_from_its_zip64_end_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(zipfile, "ZIP_FILECOUNT_LIMIT", 1)  # a zip64 end record from three entries
    path = make_zip(tmp_path / "m.zip", [("model/a.json", b"1"), ("model/b.json", b"2"), ("model/c", b"3")])
    assert unpacked(path, ArchiveLimits(max_members=3, max_bytes=1000)) == {
        "a.json": b"1",
        "b.json": b"2",
        "c": b"3",
    }


# ---------------------------------------------------------------- the Hub


@pytest.mark.parametrize(
    ("source", "parsed"),
    [("hf://org/name", ("org/name", "main")), ("hf://org/name@v1.0", ("org/name", "v1.0")),
     ("hf://org/name@refs/pr/1", ("org/name", "refs/pr/1"))],
)  # fmt: skip
def test_hub_sources_name_a_repository_and_a_revision(source: str, parsed: tuple[str, str]) -> None:
    assert parse_hub_source(source) == parsed


@pytest.mark.parametrize(
    "source", ["hf://", "hf://org/na me", "hf://a/b/c", "hf://org/name@", "s3://org/name"]
)
def test_malformed_hub_sources_are_refused(source: str) -> None:
    with pytest.raises(InvalidRequest):
        parse_hub_source(source)


REPO_FILES = [
    "config.json", "model.safetensors", "model.safetensors.index.json", "tokenizer.json", "vocab.txt",
    "tokenizer.model", "chat_template.jinja", "README.md", ".gitattributes", "pytorch_model.bin",
    "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack", "model.Q4_K_M.gguf",
    "onnx/model.onnx", "onnx/config.json", "openvino/openvino_model.xml", "original/params.json",
    "1_Pooling/config.json", "unet/diffusion_pytorch_model.safetensors",
    "unet/diffusion_pytorch_model.fp16.safetensors", "rust_model.ot",
]  # fmt: skip


def test_the_default_selection_is_what_inspection_needs() -> None:
    assert select_files(REPO_FILES, None, None) == [
        "config.json", "model.safetensors", "model.safetensors.index.json", "tokenizer.json", "vocab.txt",
        "tokenizer.model", "chat_template.jinja", "1_Pooling/config.json",
        "unet/diffusion_pytorch_model.safetensors",
    ]  # fmt: skip


def test_include_replaces_the_default_selection_and_exclude_trims_it() -> None:
    assert select_files(REPO_FILES, ["*.gguf", "config.json"], None) == ["config.json", "model.Q4_K_M.gguf"]
    assert select_files(REPO_FILES, None, ["unet/*", "*.txt", "*.model", "*.jinja", "1_Pooling/*"]) == [
        "config.json", "model.safetensors", "model.safetensors.index.json", "tokenizer.json",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def tiny_model(recipes: Path) -> dict[str, bytes]:
    """The text-classification tiny model's files, plus what a Hub repository holds beside them."""
    folder = recipes / "t15_text_classification"
    found = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    return found | {"pytorch_model.bin": b"pickle", "onnx/model.onnx": b"onnx", "README.md": b"# tiny"}


@pytest.fixture(scope="module")
def hub(ca: TestCA, cdn: RemoteServer, tiny_model: dict[str, bytes]) -> Iterator[RemoteServer]:
    """The Hub stand-in, named by HF_ENDPOINT as an operator names a mirror; no operator token."""
    server = RemoteServer(ca)
    server.add_hub_repo("org/tiny", tiny_model, cdn)
    server.add_hub_repo("org/gated", tiny_model, cdn, token="hf_gated")
    server.add_hub_repo("org/gguf-only", {"config.json": b"{}", "tiny.Q4_0.gguf": b"GGUF"}, cdn)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_ENDPOINT", server.base)
        patch.delenv("HF_TOKEN", raising=False)
        yield server
    server.close()


async def test_a_hub_repository_lists_its_default_files_at_one_commit(
    hub: RemoteServer, tiny_model: dict[str, bytes]
) -> None:
    source = hub_source("hf://org/tiny")  # at HF_ENDPOINT
    listed = {f.path: f for f in await source.list_files()}
    assert sorted(listed) == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    weights = listed["model.safetensors"]
    assert weights.sha256 == hashlib.sha256(tiny_model["model.safetensors"]).hexdigest()
    assert weights.size == len(tiny_model["model.safetensors"])
    commit = hub.hub_repos["org/tiny"].commit
    assert weights.locator == f"{hub.base}/org/tiny/resolve/{commit}/model.safetensors"
    assert (listed["config.json"].size, listed["config.json"].sha256) == (
        len(tiny_model["config.json"]),
        None,
    )
    assert source.description == "hf://org/tiny@main"


async def test_hub_files_are_read_through_the_cdn_redirect_and_resume(
    hub: RemoteServer, cdn: RemoteServer, tiny_model: dict[str, bytes]
) -> None:
    source = hub_source("hf://org/gated@main", credentials={"token": "hf_gated"})
    listed = {f.path: f for f in await source.list_files()}
    weights = tiny_model["model.safetensors"]
    assert await read_all(source, listed["model.safetensors"]) == weights
    assert await read_all(source, listed["model.safetensors"], offset=100) == weights[100:]
    assert await read_all(source, listed["config.json"]) == tiny_model["config.json"]
    assert hub.requests[-1][1]["Authorization"] == "Bearer hf_gated"
    assert "Authorization" not in cdn.requests[-1][1]  # the token never reaches the CDN


async def test_hub_include_and_exclude_choose_the_files(hub: RemoteServer) -> None:
    source = hub_source("hf://org/tiny", include=["*.bin", "*.json"], exclude=["tok*"])
    assert sorted(f.path for f in await source.list_files()) == ["config.json", "pytorch_model.bin"]


@pytest.mark.parametrize(
    ("source", "token", "code", "says"),
    [
        ("hf://org/missing", None, "source_not_found", "no such repository"),
        ("hf://org/tiny@v9", None, "source_not_found", "no such revision"),
        ("hf://org/gated", None, "source_denied", "gated"),
        ("hf://org/gated", "hf_wrong", "source_denied", "gated"),
        ("hf://org/gguf-only", None, "source_not_found", r"no safetensors weights \(it offers .gguf\)"),
    ],
)
async def test_hub_failures_say_why(
    hub: RemoteServer, source: str, token: str | None, code: str, says: str
) -> None:
    credentials = {"token": token} if token else None
    caught = await failure(hub_source(source, credentials=credentials).list_files())
    assert caught.code == code
    assert re.search(says, caught.message), caught.message


async def test_a_hub_on_a_private_address_is_refused_by_default(hub: RemoteServer) -> None:
    caught = await failure(hub_source("hf://org/tiny", allowed=False).list_files())
    assert caught.code == "address_refused"


def test_the_stand_in_answers_huggingface_hub_itself(
    hub: RemoteServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Hub stand-in is read by huggingface_hub's own client as the Hub is: the routes and JSON the
    source reads are the ones the library reads."""
    import huggingface_hub
    from huggingface_hub import HfApi

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    huggingface_hub.close_session()  # a fresh client that reads SSL_CERT_FILE
    try:
        info = HfApi(endpoint=hub.base, token=False).model_info("org/tiny", files_metadata=True)
    finally:
        huggingface_hub.close_session()
    weights = next(s for s in info.siblings or [] if s.rfilename == "model.safetensors")
    assert info.sha == hub.hub_repos["org/tiny"].commit
    assert weights.lfs is not None and weights.lfs.size == weights.size
