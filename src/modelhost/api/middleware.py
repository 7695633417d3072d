"""Pure ASGI middleware: body size limit and Prometheus request metrics."""

from __future__ import annotations

import time
from collections.abc import Callable

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from modelhost.api.errors import error_response
from modelhost.errors import InvalidRequest, PayloadTooLarge
from modelhost.metrics import Counter, Histogram

REQUESTS = Counter(
    "modelhost_http_requests_total", "HTTP requests by route and status.", ["method", "route", "status"]
)
LATENCY = Histogram(
    "modelhost_http_request_duration_seconds",
    "HTTP request latency by route.",
    ["method", "route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)


class BodySizeLimit:
    """Refuses bodies over the limit: at once by `Content-Length`, else while streaming."""

    def __init__(self, app: ASGIApp, limit_for: Callable[[Scope], int]) -> None:
        self.app = app
        self.limit_for = limit_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                await error_response(InvalidRequest("Invalid Content-Length header."))(scope, receive, send)
                return
            if int(declared) > limit:
                await error_response(_too_large(limit))(scope, receive, send)
                return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # An HTTPException passes through FastAPI's body parsing unchanged (other
                    # exceptions become a 400 there); the error handler maps it to our 413 body.
                    raise HTTPException(413, _too_large(limit).message)
            return message

        await self.app(scope, counting_receive, send)


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"Request body exceeds the limit of {limit} bytes.")


class RequestMetrics:
    """Counts and times requests, labelled by route template (not raw path: bounded cardinality)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            method = scope.get("method", "")
            REQUESTS.labels(method, template, str(status)).inc()
            LATENCY.labels(method, template).observe(time.perf_counter() - started)
