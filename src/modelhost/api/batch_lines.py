"""A batch line sent through a gateway's own app, in-process: the same routes, validation, billing and
errors as the request sent over HTTP, without the socket.

The scope carries the batch creator's principal (and, for an eval run of one version of a rollout,
that version: `PINNED_VERSION`) (so the key check finds it there, as for any request
whose key was checked) and `BATCH_LINE` (low priority, no per-minute limits: `api.deps`). Neither can
come from outside: an HTTP request's scope starts empty of them. With tracing on it carries the line's
span as its `traceparent`, as a client's request would carry the client's.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from starlette.types import ASGIApp, Message

from modelhost import tracing
from modelhost.api.deps import BATCH_LINE, PINNED_VERSION, PRINCIPAL
from modelhost.auth.principal import Principal
from modelhost.batches.runner import LineCall


def line_caller(app: ASGIApp) -> LineCall:
    """`LineCall` over `app`, in this process: (status, request ID, the answer's bytes) of a POST of
    `body` to `endpoint` (the embedded server's; a server's supervisor sends its lines to a gateway
    process instead, which runs them with `run_line`)."""

    async def call(
        principal: Principal, endpoint: str, body: dict[str, Any], pinned: str | None = None
    ) -> tuple[int, str, bytes]:
        return await run_line(app, principal, endpoint, orjson.dumps(body), tracing.parent(), pinned)

    return call


async def run_line(
    app: ASGIApp,
    principal: Principal,
    endpoint: str,
    payload: bytes,
    traceparent: str | None,
    pinned: str | None = None,
) -> tuple[int, str, bytes]:
    """(status, request ID, the answer's bytes) of a POST of `payload` (a line's JSON body) to
    `endpoint` through `app`, as `principal`. `traceparent`: the line's span (`batches.runner`), which
    its request continues, as a client's request would continue the client's. `pinned`: the version
    (artifact) of its deployment it runs on (`api.deps.PINNED_VERSION`)."""
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": endpoint,
        "raw_path": endpoint.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
        ],
        "client": ("batch", 0),
        "server": ("modelhost", 0),
        PRINCIPAL: principal,
        BATCH_LINE: True,
    }
    if pinned:
        scope[PINNED_VERSION] = pinned
    if traceparent:
        scope["headers"].append((b"traceparent", traceparent.encode()))
    delivered = False
    never = asyncio.Event()  # the caller never leaves: `await_or_disconnect` waits on this forever
    status, request_id, chunks = 500, "", []

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": payload, "more_body": False}
        await never.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal status, request_id
        if message["type"] == "http.response.start":
            status = message["status"]
            request_id = dict(message.get("headers", [])).get(b"x-request-id", b"").decode()
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, request_id, b"".join(chunks) or b"null"
