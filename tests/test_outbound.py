"""Outbound requests (issue 70, the structural rule): everything this server fetches for a tenant goes
through `modelhost.outbound`, whose every entry point takes a `Bounds` and applies each of its limits.

Two generated tests keep it so:
- every module of modelhost is read (its AST): one that constructs an HTTP client or opens a network
  connection, outside the outbound package and the short list of operator-side clients below (each
  with its reason), fails the test: a tenant fetch added later without the rule is caught here;
- every entry point of the outbound package (found by its signature: a `bounds: Bounds` without a
  default) is run against real hostile servers, one bound at a time: the answer too large, too slow,
  on a refused address, asking for one more request (a redirect, a page). An entry point added without
  its row here fails the test.
"""

from __future__ import annotations

import ast
import asyncio
import importlib
import inspect
import pkgutil
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import closing
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import uvicorn

import modelhost
import modelhost.outbound
from modelhost.outbound import Bounds, FetchFailed, fetch_url, open_url, parse_networks, vet
from modelhost.outbound.mcp import SessionFailed, mcp_session
from modelhost.outbound.s3 import S3Keys, s3_client
from tests.helpers import source_trees
from tests.live import HOST, _bound_socket
from tests.mcp_server import McpTestServer, mcp_server

# Operator-side clients: what they reach is the operator's (or the user's own machine), never an
# address a tenant chose. Each must still construct a client (a stale entry fails too).
OPERATOR_SIDE = {
    "modelhost.auth.oidc": "the operator's OpenID provider (MODELHOST_OIDC_ISSUER)",
    "modelhost.artifacts.s3": "the operator's blob store bucket (MODELHOST_S3_BUCKET)",
    "modelhost.cli.client": "the CLI, on the user's machine, to the server it was pointed at",
    "modelhost.cli.quickstart": "the CLI's quickstart, to the server it has just started",
    "modelhost.engines.llamacpp_server": "a replica's own llama.cpp server, on loopback",
    "modelhost.tracing": "the operator's OpenTelemetry collector (OTEL_EXPORTER_OTLP_ENDPOINT)",
    "modelhost.runtime.supervisor.ray_backend": "the operator's Ray cluster (MODELHOST_RAY_ADDRESS)",
    "modelhost.server": "the server's own listening socket: it accepts connections, never opens one",
}
# Calls that open a connection or build a client, by qualified name: a whole module, or names in one.
WHOLE_MODULES = (
    "requests",
    "aiohttp",
    "urllib.request",
    "urllib3",
    "http.client",
    "websockets",
    "grpc",
    "boto3",
    "botocore.httpsession",
    "mcp.client",
    "opentelemetry.exporter",
)
NAMES = {
    **{
        module: {"Client", "AsyncClient", "HTTPTransport", "AsyncHTTPTransport", "get", "post", "put"}
        | {"patch", "delete", "head", "options", "request", "stream"}
        for module in ("httpx", "httpx2")
    },
    "mcp": {"Client"},
    "socket": {"create_connection"},
    "asyncio": {"open_connection"},
    "ray": {"init"},
    "huggingface_hub": {"hf_hub_download", "snapshot_download", "HfApi", "get_session", "model_info"},
}


def _modules() -> Iterator[tuple[str, ast.Module]]:
    for path, tree in source_trees():
        parts = ("modelhost", *path.with_suffix("").parts)
        yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), tree


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else f"?.{node.attr}"
    return None


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Each name a module binds by import, as the qualified name it stands for."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def connections(tree: ast.Module) -> list[str]:
    """`line: qualified call` of each client built or connection opened in `tree`."""
    aliases, found = _aliases(tree), list[tuple[int, str]]()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or (dotted := _dotted(node.func)) is None:
            continue
        head, _, rest = dotted.partition(".")
        # a name bound by an import, qualified; any other (a variable, `self`) only by its last part
        name = aliases[head] + (f".{rest}" if rest else "") if head in aliases else f"?.{dotted}"
        module, _, last = name.rpartition(".")
        keywords = {k.arg for k in node.keywords}
        opens = (
            any(name == m or name.startswith(f"{m}.") for m in WHOLE_MODULES)
            or last in NAMES.get(module, ())
            or (last == "create_connection")  # an event loop's, say
            or (name == "socket.socket" and "fileno" not in keywords and not _unix(node))
        )
        if opens and not (name == "asyncio.open_connection" and "sock" in keywords):
            found.append((node.lineno, name))
    return [f"{line}: {name}" for line, name in sorted(found)]


def _unix(call: ast.Call) -> bool:
    return bool(call.args) and (_dotted(call.args[0]) or "").endswith("AF_UNIX")


def test_only_the_outbound_package_and_named_operator_side_clients_open_connections() -> None:
    found = {name: hits for name, tree in _modules() if (hits := connections(tree))}
    outside = {
        name: hits
        for name, hits in found.items()
        if name not in OPERATOR_SIDE
        and name != "modelhost.outbound"
        and not name.startswith("modelhost.outbound.")
    }
    assert outside == {}, (
        "These modules open connections outside modelhost.outbound: fetch through it (a tenant's URL), "
        f"or name the module in OPERATOR_SIDE with why no tenant chooses where it connects: {outside}"
    )
    stale = sorted(set(OPERATOR_SIDE) - set(found))
    assert stale == [], f"OPERATOR_SIDE names modules that open no connection any more: {stale}"
    assert any(name.startswith("modelhost.outbound.") for name in found)  # the walk sees what it should


def test_the_walk_catches_each_way_of_opening_a_connection() -> None:
    """The rule's own test: each spelling below is found (a client under another name included)."""
    source = """
import httpx as h
import socket, asyncio, boto3
from urllib.request import urlopen
from mcp.client.streamable_http import streamable_http_client as connect
async def f(loop):
    h.AsyncClient()
    urlopen("http://x")
    socket.create_connection(("x", 1))
    await asyncio.open_connection("x", 1)
    await loop.create_connection(object, "x", 1)
    boto3.session.Session().client("s3")
    socket.socket()
    connect("http://x")
    socket.socket(fileno=3)  # an inherited socket: not a new connection
    socket.socket(socket.AF_UNIX)  # a local socket
    await asyncio.open_connection(sock=None)
"""
    assert [hit.split(": ")[1] for hit in connections(ast.parse(source))] == [
        "httpx.AsyncClient",
        "urllib.request.urlopen",
        "socket.create_connection",
        "asyncio.open_connection",
        "?.loop.create_connection",
        "boto3.session.Session",
        "socket.socket",
        "mcp.client.streamable_http.streamable_http_client",
    ]


# ---------------------------------------------------------------- each entry point, each bound

BIG = 8 * 1024**2  # a hostile answer's size; the bounds below allow 1 MiB
LISTING_PAGE = (
    b'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
    b"<Name>pages</Name><Prefix></Prefix><KeyCount>0</KeyCount><MaxKeys>1000</MaxKeys>"
    b"<IsTruncated>true</IsTruncated><NextContinuationToken>more</NextContinuationToken></ListBucketResult>"
)


class Hostile:
    """An HTTP server whose every answer crosses one bound: `/big` (8 MiB, no length), `/trickle` (a
    byte every 0.1 s for 20 s), `/loop` (a redirect to itself), `/ok`; and an S3 endpoint whose buckets
    do the same to a listing (`big`, `slow`, `pages`: a next page for ever, `ok`). `requests` counts."""

    def __init__(self) -> None:
        self.requests = 0
        self.authorization: str | None = None  # the last request's `Authorization` (who signed it)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.requests += 1
        self.authorization = dict(scope["headers"]).get(b"authorization", b"").decode() or None
        kind = scope["path"].strip("/")
        xml = [(b"content-type", b"application/xml")]
        if kind in ("loop",):
            await send({"type": "http.response.start", "status": 302, "headers": [(b"location", b"/loop")]})
            await send({"type": "http.response.body", "body": b""})
        elif kind in ("big", "trickle", "slow"):
            await send({"type": "http.response.start", "status": 200, "headers": xml})
            if kind == "big":
                for _ in range(BIG // 65536):
                    await send({"type": "http.response.body", "body": b"<" * 65536, "more_body": True})
            else:
                for _ in range(200):
                    await send({"type": "http.response.body", "body": b" ", "more_body": True})
                    await asyncio.sleep(0.1)
            await send({"type": "http.response.body", "body": b""})
        else:
            token = str(self.requests).encode()  # a new token on each page: botocore stops at a repeat
            body = LISTING_PAGE.replace(b">more<", b">" + token + b"<")
            body = body if kind == "pages" else body.replace(b">true<", b">false<")
            await send({"type": "http.response.start", "status": 200, "headers": xml})
            await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def hostile() -> Iterator[tuple[str, Hostile]]:
    app = Hostile()
    with closing(_bound_socket()) as sock:
        server = uvicorn.Server(uvicorn.Config(app, host=HOST, log_level="warning", lifespan="off"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.02)
        yield f"http://{HOST}:{sock.getsockname()[1]}", app
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def mcp() -> Iterator[McpTestServer]:
    with mcp_server(hostile_tools=True) as served:
        yield served


LOOPBACK = parse_networks(["127.0.0.0/8"])
LOOSE = Bounds(networks=LOOPBACK, max_bytes=1024**2, seconds=30, idle_seconds=30, requests=4)
# Each bound tightened in turn, and what the failure must say.
CASES = {
    "bytes": (LOOSE, ("too large", "larger than")),
    "time": (replace(LOOSE, seconds=1.0), ("Timed out after 1 s", "no answer within the 1 s")),
    "addresses": (replace(LOOSE, networks=()), ("non-public address",)),
    "requests": (
        replace(LOOSE, requests=3),
        ("Too many redirects", "more than 3 requests", "more than 3 listing"),
    ),
}
PATHS = {"bytes": "big", "time": "trickle", "addresses": "ok", "requests": "loop"}
BUCKETS = {"bytes": "big", "time": "slow", "addresses": "ok", "requests": "pages"}


async def _fetch_url(bounds: Bounds, bound: str, web: str, mcp: McpTestServer) -> None:
    await fetch_url(f"{web}/{PATHS[bound]}", bounds, timeout=None, param="url")


async def _open_url(bounds: Bounds, bound: str, web: str, mcp: McpTestServer) -> None:
    async with open_url(f"{web}/{PATHS[bound]}", bounds, param="url") as answer:
        async for _ in answer.aiter_bytes():
            pass


async def _mcp_session(bounds: Bounds, bound: str, web: str, mcp: McpTestServer) -> None:
    """The MCP server's addresses are vetted against the bounds' networks; then, by the bound tried: a
    100 MiB result, a tool that answers after a minute, a listing that pages for ever."""
    server = await vet(mcp.url, bounds.networks, param="url")
    mcp.pages = 10**6 if bound == "requests" else None
    async with mcp_session(server, {}, bounds) as client:
        if bound == "bytes":
            await client.call_tool("huge_result", {})
        elif bound == "time":
            await client.call_tool("stall", {})
        cursor: str | None = None
        for _ in range(100):
            cursor = (await client.list_tools(cursor=cursor)).next_cursor
            if not cursor:
                return


async def _s3_client(bounds: Bounds, bound: str, web: str, mcp: McpTestServer) -> None:
    """The outbound S3 client listing a bucket of the hostile S3 (at its address: path-style)."""

    def listing() -> None:
        keys = S3Keys("k", "s", None)
        client = s3_client(bounds, endpoint_url=web, region="us-east-1", signed_by=keys)
        for _ in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKETS[bound]):
            pass

    await asyncio.to_thread(listing)


ENTRY_POINTS: dict[str, Callable[[Bounds, str, str, McpTestServer], Awaitable[None]]] = {
    "modelhost.outbound.http.fetch_url": _fetch_url,
    "modelhost.outbound.http.open_url": _open_url,
    "modelhost.outbound.mcp.mcp_session": _mcp_session,
    "modelhost.outbound.s3.s3_client": _s3_client,
}


def _entry_points() -> set[str]:
    """Every public function of the outbound package that takes a `Bounds`, each without a default."""
    found = set()
    for info in pkgutil.iter_modules(modelhost.outbound.__path__, "modelhost.outbound."):
        module = importlib.import_module(info.name)
        for name, function in inspect.getmembers(module, inspect.isfunction):
            if name.startswith("_") or function.__module__ != module.__name__:
                continue
            taking = [p for p in inspect.signature(function).parameters.values() if p.annotation == "Bounds"]
            if taking:
                assert all(p.default is inspect.Parameter.empty for p in taking), f"{name}: Bounds defaulted"
                found.add(f"{module.__name__}.{name}")
    return found


def test_every_entry_point_of_the_outbound_package_is_tried_against_each_bound() -> None:
    assert _entry_points() == set(ENTRY_POINTS)


@pytest.mark.parametrize("bound", CASES)
@pytest.mark.parametrize("entry_point", ENTRY_POINTS)
async def test_each_entry_point_enforces_each_bound(
    entry_point: str, bound: str, hostile: tuple[str, Hostile], mcp: McpTestServer
) -> None:
    bounds, said = CASES[bound]
    web, server = hostile
    before = server.requests
    with pytest.raises((FetchFailed, SessionFailed)) as failed:
        await ENTRY_POINTS[entry_point](bounds, bound, web, mcp)
    assert any(words in str(failed.value) for words in said), failed.value
    if bound == "addresses":
        assert server.requests == before  # refused before any connection


def test_a_requests_own_timeout_only_ever_shortens_the_bounds() -> None:
    assert LOOSE.within(None) == LOOSE.within(0) == LOOSE.within(60) == LOOSE
    assert (LOOSE.within(2).seconds, LOOSE.within(2).idle_seconds) == (2, 2)
    with pytest.raises(ValueError):
        replace(LOOSE, max_bytes=0)


# ---------------------------------------------------------------- an S3 import, whoever signs its requests

SIGNERS = {  # who signs an import's requests (issue 70, S2): `credentials`, the lent buckets, the signature
    "nobody": (None, "", None),
    "the operator, who lent the bucket": (None, "big,pages", "Credential=operator-key/"),
    "the tenant's keys": (
        {"aws_access_key_id": "tenant-key", "aws_secret_access_key": "s"},
        "",
        "Credential=tenant-key/",
    ),
}
IMPORT_CASES = {  # the bound, the bucket that crosses it, the failure's code and words
    "bytes": ("big", "too_large", "too large"),
    "requests": ("pages", "too_large", "more than 3 listing pages"),
    "addresses": ("ok", "address_refused", "non-public address"),
}


@pytest.mark.parametrize("bound", IMPORT_CASES)
@pytest.mark.parametrize("signer", SIGNERS)
async def test_every_request_of_an_s3_import_goes_through_the_bounds_whoever_signs_it(
    signer: str,
    bound: str,
    hostile: tuple[str, Hostile],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found on main: only a tenant's `endpoint_url` went through the outbound sender; an import from
    the operator's endpoint or AWS (unsigned, lent, or with the tenant's keys) read a listing page of any
    size, followed pages for ever and connected to whatever address the bucket's name resolved to.

    The operator's endpoint (AWS_ENDPOINT_URL) is the hostile S3 here, on loopback, which the operator
    chose (its address is allowed); for `addresses` there is none, so the bucket is at AWS, whose names
    resolve to 127.0.0.1 (a resolver the tenant does not control cannot do it, but the rule is the same:
    no address is connected to unvetted)."""
    from modelhost.imports import s3_connections
    from modelhost.imports.s3 import S3Source
    from modelhost.imports.sources import ImportFailed
    from tests.conftest import make_settings

    web, server = hostile
    bucket, code, said = IMPORT_CASES[bound]
    credentials, lent, signature = SIGNERS[signer]
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "operator-key")  # the operator's chain
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "operator-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setattr(s3_connections, "ANSWER_MAX_BYTES", 1024**2)  # the hostile answer is 8 MiB
    monkeypatch.setattr(s3_connections, "MAX_PAGES", 3)
    if bound == "addresses":
        real = socket.getaddrinfo

        def aws_at_loopback(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
            if str(host).endswith(".amazonaws.com"):
                return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", int(port or 0)))]
            return real(host, port, *args, **kwargs)

        monkeypatch.setattr(socket, "getaddrinfo", aws_at_loopback)
    else:
        monkeypatch.setenv("AWS_ENDPOINT_URL", web)
    settings = make_settings(tmp_path, "sqlite://", import_operator_credentials_buckets=lent)
    source = S3Source(
        f"s3://{bucket}", include=None, exclude=None, credentials=credentials, settings=settings
    )
    before = server.requests
    with pytest.raises(ImportFailed) as failed:
        await asyncio.wait_for(source.list_files(), 30)
    assert failed.value.code == code and said in failed.value.message, failed.value
    if bound == "addresses":
        assert server.requests == before
    else:  # signed as S2 decided, whatever carries the request
        assert server.authorization is None if signature is None else signature in server.authorization
