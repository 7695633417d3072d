"""`modelhost.media`: how every endpoint reads image, audio and video inputs, as a spec.

Remote fetches run against a real HTTP server on 127.0.0.1 (so they are refused unless a test allows
127.0.0.0/8, exactly as a public deployment would refuse its own loopback). Media files are made in
memory with PIL, soundfile and PyAV.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import ipaddress
import json
import os
import shutil
import socket
import ssl
import struct
import subprocess
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import av
import httpx
import numpy as np
import pytest
import soundfile as sf  # type: ignore[import-untyped]
from PIL import Image

from modelhost.config import Settings
from modelhost.errors import InvalidMedia
from modelhost.media import decode
from modelhost.media.decode import audio_from_samples, decode_audio, decode_video, resample
from modelhost.media.image import decode_image
from modelhost.media.sources import MediaPolicy, decode_base64, load_media, media_kinds, read_local
from modelhost.outbound import Bounds, address_allowed, fetch_url, tls
from tests.helpers import assert_error, bearer, new_account

# ---------------------------------------------------------------- media files made in memory


def png_bytes(size: tuple[int, int] = (20, 20), mode: str = "RGBA") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size, (10, 200, 30, 255) if mode == "RGBA" else 128).save(buffer, format="PNG")
    return buffer.getvalue()


def jpeg_bytes(size: tuple[int, int] = (20, 20)) -> bytes:
    buffer = io.BytesIO()
    Image.new("L", size, 90).save(buffer, format="JPEG")
    return buffer.getvalue()


def tone(rate: int, seconds: float, channels: int = 1) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    mono = 0.5 * np.sin(2 * np.pi * 440 * t)
    return np.stack([mono, np.zeros_like(mono)], axis=1) if channels == 2 else mono


def sound_bytes(fmt: str, rate: int = 8000, seconds: float = 1.0, channels: int = 1) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, tone(rate, seconds, channels), rate, format=fmt)
    return buffer.getvalue()


def pyav_audio_bytes(codec: str, container_format: str, rate: int = 16000, seconds: float = 1.0) -> bytes:
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=container_format) as container:
        stream = container.add_stream(codec, rate=rate)
        assert isinstance(stream, av.AudioStream)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(
            tone(rate, seconds).astype(np.float32)[None, :], format="flt", layout="mono"
        )
        frame.sample_rate, frame.pts = rate, 0
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    return buffer.getvalue()


def mp4_bytes(frames: int = 16, width: int = 64, height: int = 48, fps: int = 8) -> bytes:
    """Frame i is a flat grey of level 15*i, so tests can tell which frames were sampled."""
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(frames):
            pixels = np.full((height, width, 3), 15 * i, dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buffer.getvalue()


# ---------------------------------------------------------------- a local HTTP server

PNG = png_bytes()
HUGE = 2_000_000


class _Handler(BaseHTTPRequestHandler):
    stop: threading.Event

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        # The client gives up on huge and slow answers, as it should.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self._route(url.path, query)

    def _route(self, path: str, query: dict[str, str]) -> None:
        if path == "/image.png":
            self._answer(PNG)
        elif path == "/echo-host":
            self._answer(self.headers["Host"].encode())
        elif path == "/redirect":
            self._redirect(query.get("to", "/image.png"))
        elif path.startswith("/chain/"):
            left = int(path.rsplit("/", 1)[1])
            self._redirect(f"/chain/{left - 1}") if left > 0 else self._answer(PNG)
        elif path == "/huge":
            self._stream(HUGE, announce=True)
        elif path == "/huge-unannounced":
            self._stream(HUGE, announce=False)
        elif path == "/slow":
            self.stop.wait(10)
            self._answer(PNG)
        elif path == "/trickle":
            self.send_response(200)
            self.end_headers()
            for _ in range(100):
                if self.stop.wait(0.1):
                    break
                self.wfile.write(b"x")
                self.wfile.flush()
        else:
            self.send_error(404)

    def _answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _redirect(self, location: str) -> None:
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _stream(self, size: int, *, announce: bool) -> None:
        self.send_response(200)
        if announce:
            self.send_header("Content-Length", str(size))
        self.end_headers()
        for _ in range(size // 65536 + 1):
            self.wfile.write(b"\0" * 65536)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def serving(tls: ssl.SSLContext | None = None) -> Iterator[int]:
    """Runs the test server on 127.0.0.1 and yields its port."""
    stop = threading.Event()
    handler = type("Handler", (_Handler,), {"stop": stop})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    if tls is not None:
        httpd.socket = tls.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield int(httpd.server_address[1])
    stop.set()
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """Base URL of the test server, e.g. http://127.0.0.1:43121."""
    with serving() as port:
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, ssl.SSLContext]]:
    """An https server whose certificate names only `media.test`, and a client context trusting it."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl program to make a test certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    make_certificate = (
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1"
        " -subj /CN=media.test -addext subjectAltName=DNS:media.test"
    )
    subprocess.run(
        [*make_certificate.split(), "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(cert, key)
    with serving(server_context) as port:
        yield port, ssl.create_default_context(cafile=str(cert))


def fake_dns(monkeypatch: pytest.MonkeyPatch, answers: dict[str, list[str]]) -> None:
    """The event loop resolves the names in `answers` (one answer list per lookup, used up in turn)."""

    async def getaddrinfo(host: str, port: int, *args: object, **kwargs: object) -> object:
        if not answers.get(host):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answers[host].pop(0), port))]

    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", getaddrinfo)


LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"),)


def fetch_policy(
    allowed: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = (),
    *,
    max_bytes: int = 1_000_000,
    max_timeout: float = 10.0,
    max_redirects: int = 3,
) -> Bounds:
    return Bounds(
        networks=allowed,
        max_bytes=max_bytes,
        seconds=max_timeout,
        idle_seconds=max_timeout,
        requests=max_redirects + 1,
    )


def media_policy(root: Path | None = None, *, max_bytes: int = 1_000_000) -> MediaPolicy:
    return MediaPolicy(fetch=fetch_policy(LOOPBACK), media_root=root, max_bytes=max_bytes)


# ---------------------------------------------------------------- which addresses may be fetched


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "::1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "fe80::1",
        "::ffff:127.0.0.1",
        "::ffff:10.0.0.1",
        "2002:a00:1::",  # 6to4 wrapping 10.0.0.1
        "64:ff9b::a9fe:a9fe",  # NAT64 wrapping 169.254.169.254
        "0.0.0.0",
        "::",
        "224.0.0.1",
        "ff02::1",
        "100.64.0.1",  # carrier-grade NAT
        "240.0.0.1",
        "fc00::1",
    ],
)
def test_non_public_addresses_are_refused(address: str) -> None:
    assert not address_allowed(ipaddress.ip_address(address), ())


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700::1111"])
def test_public_addresses_are_accepted(address: str) -> None:
    assert address_allowed(ipaddress.ip_address(address), ())


def test_an_allowed_network_lets_its_private_addresses_through() -> None:
    allowed = (ipaddress.ip_network("10.0.0.0/8"),)
    assert address_allowed(ipaddress.ip_address("10.9.8.7"), allowed)
    assert address_allowed(ipaddress.ip_address("::ffff:10.9.8.7"), allowed)
    assert not address_allowed(ipaddress.ip_address("192.168.0.1"), allowed)


def test_policy_from_settings_parses_allowed_networks() -> None:
    settings = Settings(media_allow_networks=["10.0.0.0/8", "fd00::/8"], media_max_redirects=2)
    policy = MediaPolicy.from_settings(settings)
    assert policy.fetch.networks == (
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("fd00::/8"),
    )
    assert policy.fetch.requests == 3  # the URL and two redirects
    assert policy.media_root is None


# ---------------------------------------------------------------- fetching URLs


async def test_fetch_refuses_loopback_by_default(server: str) -> None:
    with pytest.raises(InvalidMedia, match="non-public") as caught:
        await fetch_url(f"{server}/image.png", fetch_policy(), timeout=None, param="image")
    assert caught.value.param == "image"


async def test_fetch_refuses_a_hostname_that_resolves_to_loopback(server: str) -> None:
    url = server.replace("127.0.0.1", "localhost")
    with pytest.raises(InvalidMedia, match="non-public"):
        await fetch_url(f"{url}/image.png", fetch_policy(), timeout=None, param="image")


async def test_fetch_reaches_loopback_when_the_operator_allows_it(server: str) -> None:
    body = await fetch_url(f"{server}/image.png", fetch_policy(LOOPBACK), timeout=None, param="image")
    assert body == PNG


async def test_fetch_connects_to_the_vetted_address_but_keeps_the_host_name(server: str) -> None:
    url = server.replace("127.0.0.1", "localhost")
    body = await fetch_url(f"{url}/echo-host", fetch_policy(LOOPBACK), timeout=None, param="image")
    assert body == url.removeprefix("http://").encode()


async def test_dns_rebinding_cannot_switch_the_target(server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The host is resolved once; a second lookup (by the HTTP client) would get a different answer."""
    port = int(server.rsplit(":", 1)[1])
    fake_dns(monkeypatch, {"rebind.test": ["127.0.0.1"]})  # a second lookup finds nothing
    body = await fetch_url(
        f"http://rebind.test:{port}/echo-host", fetch_policy(LOOPBACK), timeout=5, param="image"
    )
    assert body == f"rebind.test:{port}".encode()


async def test_https_checks_the_certificate_against_the_host_name_not_the_address(
    tls_server: tuple[int, ssl.SSLContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    port, trusting = tls_server
    monkeypatch.setattr(tls, "tls_context", lambda: trusting)
    fake_dns(monkeypatch, {"media.test": ["127.0.0.1"]})
    body = await fetch_url(
        f"https://media.test:{port}/echo-host", fetch_policy(LOOPBACK), timeout=5, param="x"
    )
    assert body == f"media.test:{port}".encode()


async def test_https_refuses_a_certificate_for_another_name(
    tls_server: tuple[int, ssl.SSLContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    port, trusting = tls_server
    monkeypatch.setattr(tls, "tls_context", lambda: trusting)
    fake_dns(monkeypatch, {"other.test": ["127.0.0.1"]})
    with pytest.raises(InvalidMedia, match="CERTIFICATE_VERIFY_FAILED"):
        await fetch_url(f"https://other.test:{port}/image.png", fetch_policy(LOOPBACK), timeout=5, param="x")


async def test_redirects_are_followed(server: str) -> None:
    body = await fetch_url(f"{server}/redirect", fetch_policy(LOOPBACK), timeout=None, param="image")
    assert body == PNG


@pytest.mark.parametrize("target", ["http://10.0.0.1/x", "http://169.254.169.254/latest/meta-data/"])
async def test_each_redirect_hop_is_checked_again(server: str, target: str) -> None:
    with pytest.raises(InvalidMedia, match="non-public") as caught:
        await fetch_url(f"{server}/redirect?to={target}", fetch_policy(LOOPBACK), timeout=None, param="image")
    assert caught.value.param == "image"


async def test_a_redirect_to_another_scheme_is_refused(server: str) -> None:
    with pytest.raises(InvalidMedia, match="Unsupported scheme 'file'"):
        await fetch_url(
            f"{server}/redirect?to=file:///etc/passwd", fetch_policy(LOOPBACK), timeout=None, param="image"
        )


async def test_up_to_max_redirects_are_followed(server: str) -> None:
    policy = fetch_policy(LOOPBACK, max_redirects=3)
    assert await fetch_url(f"{server}/chain/3", policy, timeout=None, param="image") == PNG


async def test_more_than_max_redirects_are_refused(server: str) -> None:
    policy = fetch_policy(LOOPBACK, max_redirects=3)
    with pytest.raises(InvalidMedia, match="Too many redirects"):
        await fetch_url(f"{server}/chain/4", policy, timeout=None, param="image")


@pytest.mark.parametrize("path", ["/huge", "/huge-unannounced"])
async def test_a_body_over_max_bytes_is_refused(server: str, path: str) -> None:
    policy = fetch_policy(LOOPBACK, max_bytes=100_000)
    with pytest.raises(InvalidMedia, match="too large"):
        await fetch_url(f"{server}{path}", policy, timeout=None, param="image")


@pytest.mark.parametrize("path", ["/slow", "/trickle"])
async def test_the_request_timeout_bounds_the_whole_fetch(server: str, path: str) -> None:
    started = time.monotonic()
    with pytest.raises(InvalidMedia, match=r"Timed out after 0\.5 s"):
        await fetch_url(f"{server}{path}", fetch_policy(LOOPBACK), timeout=0.5, param="image")
    assert time.monotonic() - started < 5


async def test_the_request_timeout_is_capped_by_the_server_maximum(server: str) -> None:
    started = time.monotonic()
    with pytest.raises(InvalidMedia, match="Timed out"):
        await fetch_url(f"{server}/slow", fetch_policy(LOOPBACK, max_timeout=0.5), timeout=60, param="image")
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.com/a.png", "gopher://example.com/"])
async def test_unsupported_schemes_are_refused(url: str) -> None:
    with pytest.raises(InvalidMedia, match="Unsupported scheme") as caught:
        await fetch_url(url, fetch_policy(), timeout=None, param="inputs[1]")
    assert caught.value.param == "inputs[1]"
    with pytest.raises(InvalidMedia, match="Unsupported scheme"):
        await load_media(url, media_policy(), param="inputs[1]", timeout=None, allow_paths=True)


async def test_an_error_status_is_reported_clearly(server: str) -> None:
    with pytest.raises(InvalidMedia, match="HTTP 404") as caught:
        await fetch_url(f"{server}/missing.png", fetch_policy(LOOPBACK), timeout=None, param="image")
    assert caught.value.status_code == 400
    assert caught.value.code == "invalid_media"


async def test_an_unresolvable_host_is_refused_cleanly() -> None:
    with pytest.raises(InvalidMedia, match="Could not resolve"):
        await fetch_url("http://no-such-host.invalid/a.png", fetch_policy(), timeout=2, param="image")


async def test_a_refused_connection_is_refused_cleanly() -> None:
    with socket.socket() as probe:  # a port nobody listens on once closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(InvalidMedia, match="Could not connect"):
        await fetch_url(f"http://127.0.0.1:{port}/a.png", fetch_policy(LOOPBACK), timeout=2, param="image")


# ---------------------------------------------------------------- base64 and data URIs


def test_base64_is_decoded() -> None:
    assert decode_base64(base64.b64encode(PNG).decode(), param="image", max_bytes=10**6) == PNG


def test_base64_wrapped_over_lines_is_decoded() -> None:
    assert decode_base64(base64.encodebytes(PNG).decode(), param="image", max_bytes=10**6) == PNG


async def test_a_data_uri_gives_its_payload() -> None:
    uri = "data:image/png;base64," + base64.b64encode(PNG).decode()
    assert await load_media(uri, media_policy(), param="image", timeout=None) == PNG


async def test_a_data_uri_that_is_not_base64_is_refused() -> None:
    with pytest.raises(InvalidMedia, match="not a base64 data URI"):
        await load_media("data:text/plain,hello", media_policy(), param="image", timeout=None)


@pytest.mark.parametrize("value", ["not base64!", "aGVsbG8", "aGVs*G8=", "aGVsbG8=-_"])
def test_invalid_base64_is_refused_with_its_field(value: str) -> None:
    with pytest.raises(InvalidMedia, match="not valid base64") as caught:
        decode_base64(value, param="inputs[2]", max_bytes=10**6)
    assert caught.value.param == "inputs[2]"


def test_oversized_base64_is_refused() -> None:
    with pytest.raises(InvalidMedia, match="too large"):
        decode_base64(base64.b64encode(b"x" * 11).decode(), param="image", max_bytes=10)
    assert decode_base64(base64.b64encode(b"x" * 10).decode(), param="image", max_bytes=10) == b"x" * 10


async def test_urls_are_fetched_through_the_fetch_policy(server: str) -> None:
    assert await load_media(f"{server}/image.png", media_policy(), param="image", timeout=None) == PNG


async def test_image_inputs_never_read_local_paths(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(PNG)
    with pytest.raises(InvalidMedia, match="not valid base64"):
        await load_media("a.png", media_policy(tmp_path), param="image", timeout=None)


# ---------------------------------------------------------------- local paths (video inputs)


@pytest.fixture
def media_root(tmp_path: Path) -> Path:
    root = tmp_path / "media"
    (root / "clips").mkdir(parents=True)
    (root / "clips" / "a.mp4").write_bytes(b"video bytes")
    (tmp_path / "secret.txt").write_text("outside the root")
    return root


def test_local_paths_are_disabled_without_a_media_root() -> None:
    with pytest.raises(InvalidMedia, match="MODELHOST_MEDIA_ROOT") as caught:
        read_local("clips/a.mp4", media_policy(None), param="inputs")
    assert caught.value.param == "inputs"


@pytest.mark.parametrize("path", ["clips/a.mp4", "./clips/a.mp4", "clips/../clips/a.mp4"])
def test_a_file_under_the_root_is_read(media_root: Path, path: str) -> None:
    assert read_local(path, media_policy(media_root), param="inputs") == b"video bytes"


def test_an_absolute_path_under_the_root_is_read(media_root: Path) -> None:
    path = str(media_root / "clips" / "a.mp4")
    assert read_local(path, media_policy(media_root), param="inputs") == b"video bytes"


@pytest.mark.parametrize("path", ["../secret.txt", "clips/../../secret.txt", "/etc/passwd"])
def test_paths_leading_out_of_the_root_are_refused(media_root: Path, path: str) -> None:
    with pytest.raises(InvalidMedia, match="outside the media root"):
        read_local(path, media_policy(media_root), param="inputs")


def test_a_symlink_pointing_out_of_the_root_is_refused(media_root: Path) -> None:
    os.symlink(media_root.parent / "secret.txt", media_root / "clips" / "link.mp4")
    with pytest.raises(InvalidMedia, match="outside the media root"):
        read_local("clips/link.mp4", media_policy(media_root), param="inputs")


def test_a_missing_file_is_refused(media_root: Path) -> None:
    with pytest.raises(InvalidMedia, match="no such file"):
        read_local("clips/missing.mp4", media_policy(media_root), param="inputs")


def test_a_directory_is_refused(media_root: Path) -> None:
    with pytest.raises(InvalidMedia, match="not a regular file"):
        read_local("clips", media_policy(media_root), param="inputs")


def test_a_file_over_max_bytes_is_refused(media_root: Path) -> None:
    with pytest.raises(InvalidMedia, match="too large"):
        read_local("clips/a.mp4", media_policy(media_root, max_bytes=5), param="inputs")


async def test_video_inputs_may_be_paths(media_root: Path) -> None:
    policy = media_policy(media_root)
    for value in ["clips/a.mp4", str(media_root / "clips" / "a.mp4")]:
        assert (
            await load_media(value, policy, param="inputs", timeout=None, allow_paths=True) == b"video bytes"
        )


async def test_base64_starting_with_a_slash_is_still_base64_for_video_inputs(media_root: Path) -> None:
    payload = base64.b64encode(b"\xff\xd8\xff" * 2000).decode()  # "/9j/...", like any JPEG
    assert payload.startswith("/")
    data = await load_media(payload, media_policy(media_root), param="inputs", timeout=None, allow_paths=True)
    assert data == b"\xff\xd8\xff" * 2000


# ---------------------------------------------------------------- images


@pytest.mark.parametrize(
    "data", [png_bytes(), jpeg_bytes(), png_bytes(mode="P")], ids=["png", "jpeg", "palette"]
)
def test_images_decode_to_rgb(data: bytes) -> None:
    image = decode_image(data, max_pixels=10_000, param="image")
    assert image.mode == "RGB"
    assert image.size == (20, 20)


def test_a_truncated_image_is_refused() -> None:
    with pytest.raises(InvalidMedia, match="not a readable image") as caught:
        decode_image(png_bytes((200, 200), mode="RGBA")[:-200], max_pixels=10**6, param="inputs[0]")
    assert caught.value.param == "inputs[0]"


def test_bytes_that_are_not_an_image_are_refused() -> None:
    with pytest.raises(InvalidMedia, match="not a readable image"):
        decode_image(b"hello, this is text", max_pixels=10**6, param="image")


def test_an_image_over_max_pixels_is_refused_before_decoding() -> None:
    with pytest.raises(InvalidMedia, match=r"too large: 20×20 pixels"):
        decode_image(png_bytes((20, 20)), max_pixels=100, param="image")


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def test_a_small_file_claiming_huge_dimensions_is_refused_at_once() -> None:
    header = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0)  # 8-bit RGB
    bomb = b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", header) + png_chunk(b"IDAT", zlib.compress(b"\0" * 64))
    assert len(bomb) < 100
    with pytest.raises(InvalidMedia, match="too large"):
        decode_image(bomb + png_chunk(b"IEND", b""), max_pixels=40_000_000, param="image")


# ---------------------------------------------------------------- audio


def test_wav_is_resampled_to_the_target_rate() -> None:
    samples = decode_audio(
        sound_bytes("WAV", rate=8000, seconds=1.0), target_rate=16000, max_seconds=10, param="x"
    )
    assert samples.dtype == np.float32
    assert samples.shape == (16000,)
    assert 0.45 < float(np.abs(samples).max()) < 0.55


@pytest.mark.parametrize("fmt", ["FLAC", "OGG"])
def test_flac_and_ogg_decode(fmt: str) -> None:
    samples = decode_audio(sound_bytes(fmt, rate=16000), target_rate=16000, max_seconds=10, param="x")
    assert samples.shape == (16000,)


def test_mp3_decodes() -> None:
    samples = decode_audio(
        pyav_audio_bytes("libmp3lame", "mp3"), target_rate=16000, max_seconds=10, param="x"
    )
    assert abs(samples.shape[0] - 16000) <= 1152
    assert 0.3 < float(np.abs(samples).max()) < 0.7


def test_mp3_decodes_through_pyav_when_libsndfile_cannot(monkeypatch: pytest.MonkeyPatch) -> None:
    def unreadable(*args: object, **kwargs: object) -> None:
        raise sf.LibsndfileError(0, "Format not recognised")

    monkeypatch.setattr(sf, "SoundFile", unreadable)
    samples = decode_audio(
        pyav_audio_bytes("libmp3lame", "mp3"), target_rate=16000, max_seconds=10, param="x"
    )
    assert abs(samples.shape[0] - 16000) <= 2 * 1152


def test_formats_libsndfile_lacks_decode_through_pyav() -> None:
    samples = decode_audio(pyav_audio_bytes("aac", "mp4"), target_rate=8000, max_seconds=10, param="x")
    assert abs(samples.shape[0] - 8000) <= 1024  # AAC adds encoder priming samples


def test_stereo_is_mixed_to_mono() -> None:
    samples = decode_audio(
        sound_bytes("WAV", rate=16000, channels=2), target_rate=16000, max_seconds=10, param="x"
    )
    assert samples.shape == (16000,)
    assert 0.2 < float(np.abs(samples).max()) < 0.3  # the mean of the tone and a silent channel


@pytest.mark.parametrize(
    "data", [sound_bytes("WAV", seconds=2.0), pyav_audio_bytes("aac", "mp4", seconds=2.0)]
)
def test_audio_longer_than_max_seconds_is_refused(data: bytes) -> None:
    with pytest.raises(InvalidMedia, match="too long"):
        decode_audio(data, target_rate=16000, max_seconds=1.5, param="inputs")


def test_audio_without_a_declared_duration_is_cut_off_while_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decode, "_seconds", lambda container, stream: None)
    with pytest.raises(InvalidMedia, match="too long"):
        decode_audio(
            pyav_audio_bytes("aac", "mp4", seconds=2.0), target_rate=16000, max_seconds=1.5, param="x"
        )


@pytest.mark.parametrize("data", [b"", b"garbage" * 100, png_bytes()], ids=["empty", "garbage", "image"])
def test_bytes_that_are_not_audio_are_refused(data: bytes) -> None:
    with pytest.raises(InvalidMedia) as caught:
        decode_audio(data, target_rate=16000, max_seconds=10, param="inputs")
    assert caught.value.param == "inputs"


def test_samples_are_validated_and_resampled() -> None:
    samples = audio_from_samples(
        [0.0, 0.5, -0.5, 0.25] * 100, 8000, target_rate=16000, max_seconds=1, param="x"
    )
    assert samples.dtype == np.float32
    assert samples.shape == (800,)


@pytest.mark.parametrize(
    ("samples", "rate", "message"),
    [
        ([0.1, float("nan"), 0.2], 16000, "NaN or infinite"),
        ([0.1, float("inf")], 16000, "NaN or infinite"),
        ([], 16000, "empty"),
        ([[0.1, 0.2], [0.3, 0.4]], 16000, "flat list of numbers"),
        (["0.1", "0.2"], 16000, "flat list of numbers"),
        ([0.1, None], 16000, "flat list of numbers"),
        ([0.1, 0.2], 0, "between 1 and"),
        ([0.1, 0.2], 400_000, "between 1 and"),
        ([0.0] * 20_000, 16000, "too long"),
    ],
)
def test_bad_samples_are_refused(samples: list[object], rate: int, message: str) -> None:
    with pytest.raises(InvalidMedia, match=message):
        audio_from_samples(samples, rate, target_rate=16000, max_seconds=1, param="inputs")  # type: ignore[arg-type]


def test_resample_keeps_duration_and_dtype() -> None:
    out = resample(np.zeros(44100, dtype=np.float32), 44100, 16000)
    assert out.shape == (16000,)
    assert out.dtype == np.float32


# ---------------------------------------------------------------- video


@pytest.fixture(scope="module")
def video() -> bytes:
    return mp4_bytes(frames=16, fps=8)


def test_video_frames_are_sampled_like_transformers(video: bytes) -> None:
    frames = decode_video(
        video, num_frames=4, frame_sampling_rate=2, max_pixels=10_000, max_seconds=10, param="inputs"
    )
    assert [frame.shape for frame in frames] == [(48, 64, 3)] * 4
    assert all(frame.dtype == np.uint8 for frame in frames)
    # linspace(0, 7, 4) -> frames 0, 2, 4, 7, whose grey levels are 15 * index
    assert [round(float(frame.mean()) / 15) for frame in frames] == [0, 2, 4, 7]


def test_a_short_video_is_padded_with_its_last_frame() -> None:
    frames = decode_video(
        mp4_bytes(frames=3), num_frames=4, frame_sampling_rate=2, max_pixels=10_000, max_seconds=10, param="x"
    )
    assert len(frames) == 4
    assert [round(float(frame.mean()) / 15) for frame in frames] == [0, 2, 2, 2]


@pytest.mark.parametrize("data", [b"garbage" * 100, sound_bytes("WAV")], ids=["garbage", "audio"])
def test_bytes_that_are_not_a_video_are_refused(data: bytes) -> None:
    with pytest.raises(InvalidMedia) as caught:
        decode_video(
            data, num_frames=4, frame_sampling_rate=1, max_pixels=10_000, max_seconds=10, param="inputs"
        )
    assert caught.value.param == "inputs"


def test_a_video_longer_than_max_seconds_is_refused(video: bytes) -> None:
    with pytest.raises(InvalidMedia, match=r"too long: 2.0 s"):
        decode_video(
            video, num_frames=4, frame_sampling_rate=2, max_pixels=10_000, max_seconds=0.5, param="x"
        )


def test_a_video_without_a_declared_duration_is_cut_off_while_decoding(
    video: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(decode, "_seconds", lambda container, stream: None)
    with pytest.raises(InvalidMedia, match="too long"):
        decode_video(
            video, num_frames=4, frame_sampling_rate=2, max_pixels=10_000, max_seconds=0.5, param="x"
        )


def test_video_frames_over_max_pixels_are_refused(video: bytes) -> None:
    with pytest.raises(InvalidMedia, match="too large"):
        decode_video(video, num_frames=4, frame_sampling_rate=2, max_pixels=100, max_seconds=10, param="x")


async def test_concurrent_fetches_time_out_together_rather_than_one_after_another(server: str) -> None:
    """A fetch never blocks the event loop, so each slow one only costs its own deadline."""
    started = time.monotonic()
    results = await asyncio.gather(
        *(
            fetch_url(f"{server}/slow", fetch_policy(LOOPBACK), timeout=0.5, param=f"inputs[{i}]")
            for i in range(3)
        ),
        return_exceptions=True,
    )
    assert all(isinstance(result, InvalidMedia) for result in results)
    assert time.monotonic() - started < 5


def test_a_malformed_allowed_network_stops_the_server_at_start_not_each_request(tmp_path: Path) -> None:
    from modelhost.container import Services
    from tests.conftest import make_settings

    settings = make_settings(
        tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}", media_allow_networks=["10.0.0/8x"]
    )
    with pytest.raises(ValueError, match=r"10\.0\.0/8x"):
        Services.build(settings)


# ---------------------------------------------------------------- raw bodies: media told from JSON by bytes


def image_bytes(fmt: str) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (10, 20, 30)).save(buffer, format=fmt)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("make", "kinds"),
    [
        (lambda: png_bytes(), {"image"}),
        (lambda: jpeg_bytes(), {"image"}),
        (lambda: image_bytes("WEBP"), {"image"}),
        (lambda: image_bytes("GIF"), {"image"}),
        (lambda: image_bytes("BMP"), {"image"}),
        (lambda: image_bytes("TIFF"), {"image"}),
        (lambda: sound_bytes("WAV"), {"audio"}),
        (lambda: sound_bytes("FLAC"), {"audio"}),
        (lambda: pyav_audio_bytes("libmp3lame", "mp3"), {"audio"}),
        (lambda: sound_bytes("OGG"), {"audio", "video"}),  # Ogg and MP4 hold either
        (lambda: mp4_bytes(frames=2), {"audio", "video"}),
        (lambda: b'{"inputs": "aGk="}', set()),
        (lambda: b' \n [1, 2]', set()),
        (lambda: b'"text"', set()),
        (lambda: b"plain text", set()),
        (lambda: b"", set()),
    ],
    ids=["png", "jpeg", "webp", "gif", "bmp", "tiff", "wav", "flac", "mp3", "ogg", "mp4", "json-object",
         "json-array", "json-string", "text", "empty"],
)  # fmt: skip
def test_media_is_told_from_json_by_its_first_bytes(make: Callable[[], bytes], kinds: set[str]) -> None:
    assert media_kinds(make()) == kinds


ZERO_SHOT = "/v1/classifications/zero-shot/image"


async def test_a_raw_image_body_is_taken_by_its_bytes_whatever_the_content_type(
    client: httpx.AsyncClient,
) -> None:
    key = bearer((await new_account(client))["api_key"])
    for content_type in ("application/octet-stream", None, "text/plain", "application/json"):
        headers = {**key, **({"Content-Type": content_type} if content_type else {})}
        # the body is the image, the query string the other fields: each error names a query parameter
        missing = await client.post(ZERO_SHOT, content=PNG, params={"model": "nope"}, headers=headers)
        assert_error(missing, 400, param="candidate_labels")
        query = {"model": "nope", "candidate_labels": "cat"}
        unknown = await client.post(ZERO_SHOT, content=PNG, params=query, headers=headers)
        assert_error(unknown, 404, code="model_not_found")
    wav = {**key, "Content-Type": "application/octet-stream"}
    audio = await client.post(
        "/v1/classifications/audio", content=sound_bytes("WAV"), params={"model": "x"}, headers=wav
    )
    assert_error(audio, 404, code="model_not_found")


async def test_json_stays_json_whatever_the_content_type(client: httpx.AsyncClient) -> None:
    key = bearer((await new_account(client))["api_key"])
    body = json.dumps({"model": "nope", "image": base64.b64encode(PNG).decode(), "candidate_labels": ["a"]})
    for content_type in ("application/octet-stream", None, "text/plain"):
        headers = {**key, **({"Content-Type": content_type} if content_type else {})}
        response = await client.post(ZERO_SHOT, content=body.encode(), headers=headers)
        assert_error(response, 404, code="model_not_found")


async def test_a_raw_body_that_is_neither_json_nor_the_routes_media_is_a_clear_400(
    client: httpx.AsyncClient,
) -> None:
    headers = {**bearer((await new_account(client))["api_key"]), "Content-Type": "application/octet-stream"}
    text = await client.post(ZERO_SHOT, content=b"plain text", params={"model": "nope"}, headers=headers)
    assert "neither JSON nor a recognised image" in assert_error(text, 400, code="invalid_body")["message"]
    wav = await client.post(ZERO_SHOT, content=sound_bytes("WAV"), params={"model": "nope"}, headers=headers)
    assert "takes image" in assert_error(wav, 400, code="invalid_media", param="image")["message"]
