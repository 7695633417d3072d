"""Pure ASGI middleware: what every request gets (its ID, rate-limit headers and release, metrics), the
API key first, the body size limit."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from modelhost import tracing
from modelhost.api.admission import Admission, admission_of
from modelhost.api.deps import (
    ADMITTED,
    ARTIFACT_HEADER,
    PRINCIPAL,
    SERVED_ARTIFACT,
    Guard,
    admit,
    guard_of,
    release_admission,
    trusted_caller,
)
from modelhost.api.errors import error_response
from modelhost.api.fastlane import routes_of
from modelhost.auth import anonymous
from modelhost.auth.limits import Admitted, start_counting
from modelhost.errors import InvalidRequest, ModelhostError, PayloadTooLarge, TooManyAnonymousRequests
from modelhost.logs import HEADER, REQUEST_ID, TRACE_ID, request_id_for
from modelhost.metrics import TALLY, Counter, Histogram

REQUESTS = Counter(
    "modelhost_http_requests_total", "HTTP requests by route and status.", ["method", "route", "status"]
)
LATENCY = Histogram(
    "modelhost_http_request_duration_seconds",
    "HTTP request latency by route.",
    ["method", "route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
# Inference requests by the version (artifact) of the deployment that answered: a canary is compared on
# these (docs/deploy.md)
VERSION_REQUESTS = Counter(
    "modelhost_version_requests_total",
    "Inference requests by deployment, the artifact (version) that served them, and status.",
    ["deployment", "artifact_id", "status"],
)
VERSION_LATENCY = Histogram(
    "modelhost_version_request_duration_seconds",
    "Inference request latency by deployment and the artifact (version) that served them.",
    ["deployment", "artifact_id"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)


@dataclass(frozen=True, slots=True)
class Guarded:
    """What the key check knows of a route: its key check (None: a public route), how a keyed request
    to it is admitted (`api.admission`), and what a request without a key costs the anonymous throttle."""

    route: APIRoute
    guard: Guard | None
    admission: Admission
    anonymous_cost: int


class HttpMiddleware:
    """Pure ASGI middleware that acts on HTTP requests (`http`); lifespan events pass through."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self.http(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError


@dataclass
class Guards:
    """Which key check each route declares, found as the router would find the route: exact paths by
    one dictionary lookup, paths with parameters by their patterns in the routes' order."""

    exact: dict[tuple[str, str], Guarded] = field(default_factory=dict)
    patterns: list[tuple[re.Pattern[str], str, Guarded]] = field(default_factory=list)

    @classmethod
    def of(cls, app: FastAPI) -> Guards:
        guards = cls()
        for route, path in routes_of(app):
            guard = guard_of(route.dependant)
            cost = int((route.openapi_extra or {}).get(anonymous.COST, 1))
            for method in route.methods or set():
                guarded = Guarded(route, guard, admission_of(method, path, guard), cost)
                if "{" in path:
                    guards.patterns.append((compile_path(path)[0], method, guarded))
                else:
                    guards.exact.setdefault((method, path), guarded)
        return guards

    def find(self, method: str, path: str) -> Guarded | None:
        found = self.exact.get((method, path))
        if found is not None:
            return found
        for pattern, route_method, guarded in self.patterns:
            if method == route_method and pattern.match(path):
                return guarded
        return None


class KeyFirst(HttpMiddleware):
    """The API key is checked before anything reads the body or the query string: a request without a
    valid key for its route is a 401 whatever else is wrong with it (FastAPI would parse a JSON body,
    and our raw-media and form bodies would be read, before the route's dependencies run). The check is
    the route's own dependency (`api.deps.require_*`), so there is one auth path; the principal it
    finds stays in the scope for the route.

    Here too, in one place for every route, the two rules that come with the key: a keyed request to a
    route that stores data or starts work is admitted (credits, spend caps, rate limits: `api.admission`,
    `api.deps.admit`), and a request no key checks (public routes, signed links, paths that match no
    route) is counted against its client address (`auth.anonymous`): 429 past its share."""

    def __init__(self, app: ASGIApp, fastapi: FastAPI) -> None:
        super().__init__(app)
        self._fastapi = fastapi
        self._guards: Guards | None = None

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._guards is None:  # built on first use: every route has been added by then
            self._guards = Guards.of(self._fastapi)
        found = self._guards.find(scope["method"], scope["path"])
        try:
            principal = None
            if found is not None and found.guard is not None:
                request = Request(scope)
                principal = await found.guard(request)
                if principal is not None and found.admission is not Admission.NONE:
                    await admit(request, principal, billed=found.admission is Admission.ADMIT)
            if principal is None:
                _throttle(scope, found.anonymous_cost if found is not None else 1)
        except ModelhostError as exc:
            if found is not None:
                scope["route"] = found.route  # what the metrics label
            await error_response(exc, scope["path"])(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _throttle(scope: Scope, cost: int) -> None:
    """A request no key checked: charged to its client address (`auth.anonymous`), 429 past it."""
    client = scope.get("client")
    wait = scope["app"].state.services.anonymous.charge(client[0] if client else "", cost)
    if wait is not None:
        raise TooManyAnonymousRequests(
            f"Too many requests without a key from this address; retry in {wait} s.",
            headers={"Retry-After": str(wait)},
        )


class BodySizeLimit(HttpMiddleware):
    """Refuses bodies over the limit: at once by `Content-Length`, else while streaming."""

    def __init__(self, app: ASGIApp, limit_for: Callable[[Scope], int]) -> None:
        super().__init__(app)
        self.limit_for = limit_for

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = self.limit_for(scope)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                await error_response(InvalidRequest("Invalid Content-Length header."), scope["path"])(
                    scope, receive, send
                )
                return
            if int(declared) > limit:
                await error_response(_too_large(limit), scope["path"])(scope, receive, send)
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


class RequestPath(HttpMiddleware):
    """Outermost: what every request gets on its way in and out, with one wrapper around `send` (each
    middleware that wraps `send` costs an extra call per message and a closure per request):
    - its ID: the caller's `X-Request-Id` when well-formed, else a new one, held in `logs.REQUEST_ID`
      while it runs (log lines and 5xx messages name it) and sent back as `x-request-id` on every
      answer, errors included;
    - a rate-limited request (admitted in `api.deps.deployment_for`): its answer carries the
      `x-ratelimit-*` headers, and its place and the tokens it used go back to the limiter before the
      last of its answer goes out (streams included), so that the client's next request finds them back,
      whichever gateway process it reaches; or when it fails or its client leaves;
    - the request metrics: counted and timed, labelled by route template (bounded cardinality), written
      with the process's other requests' every few milliseconds (`metrics.Tally`);
    - with tracing on (`modelhost.tracing`), its SERVER span, continuing the caller's `traceparent`: the
      current span while it runs (log lines name its trace ID beside the request ID, the replica
      protocol carries it), named for its route or its GenAI operation and model when it ends, and sent
      back as `traceresponse` (W3C Trace Context Level 2). Off, none of that is made."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        incoming = next((value for name, value in scope["headers"] if name == b"x-request-id"), None)
        request_id = request_id_for(incoming.decode("latin-1") if incoming is not None else None)
        id_header = (HEADER.encode(), request_id.encode())
        span, trace_header = await _server_span(scope) if tracing.ENABLED else (None, None)
        used = start_counting()
        status = 500
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                release_admission(scope, used[0])

        async def path_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [*message.get("headers", ()), id_header]
                if trace_header is not None:
                    headers.append(trace_header)
                admitted: Admitted | None = scope.get(ADMITTED)
                if admitted is not None:
                    headers += [(k.encode(), v.encode()) for k, v in admitted.headers.items()]
                served: tuple[str, str] | None = scope.get(SERVED_ARTIFACT)
                if served is not None:  # the deployment's version that answers (docs/deploy.md)
                    headers.append((ARTIFACT_HEADER, served[1].encode()))
                message["headers"] = headers
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                release()
            await send(message)

        token = REQUEST_ID.set(request_id)
        # a span not sampled is named in the logs and the answer, but nothing is made under it
        recording = span is not None and span.is_recording()
        if span is not None:
            trace_token = TRACE_ID.set(tracing.trace_id_of(span))
            if recording:
                active = tracing.activate(span)
        try:
            await self.app(scope, receive, path_send)
        finally:
            release()
            REQUEST_ID.reset(token)
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            method = scope.get("method", "")
            if span is not None:
                TRACE_ID.reset(trace_token)
            if recording:
                assert span is not None
                tracing.deactivate(active)
                tracing.server_span_ended(
                    span, method, getattr(route, "path", None), status, scope.get(tracing.MODEL), used
                )
            took = time.perf_counter() - started
            code = str(status)
            TALLY.count(REQUESTS, (method, template, code))
            TALLY.observe(LATENCY, (method, template), took)
            version: tuple[str, str] | None = scope.get(SERVED_ARTIFACT)
            if version is not None:
                TALLY.count(VERSION_REQUESTS, (*version, code))
                TALLY.observe(VERSION_LATENCY, version, took)


async def _server_span(scope: Scope) -> tuple[tracing.Span | None, tuple[bytes, bytes] | None]:
    """The request's SERVER span and its `traceresponse` header (none for an invalid span). The caller's
    `traceparent` is continued only when `MODELHOST_TRACE_CLIENT_SAMPLING` trusts it: by default for
    requests with a valid key (docs/operations.md, "Traces")."""
    traceparent = tracestate = None
    for name, value in scope["headers"]:
        if name == b"traceparent":
            traceparent = value.decode("latin-1")
        elif name == b"tracestate":
            tracestate = value.decode("latin-1")
    trusted = traceparent is not None and await _trusts(scope)
    span = tracing.server_span(
        scope["method"], scope["path"], scope.get("scheme", "http"), traceparent, tracestate, trusted
    )
    header = tracing.header_of(span)
    return span, (b"traceresponse", header.encode()) if header is not None else None


async def _trusts(scope: Scope) -> bool:
    """Whether this request's own `traceparent` may decide its trace (MODELHOST_TRACE_CLIENT_SAMPLING)."""
    if PRINCIPAL in scope:  # a batch line: its runner's own span
        return True
    rule = scope["app"].state.services.settings.trace_client_sampling
    if rule != "authenticated":
        return bool(rule == "always")
    return await trusted_caller(Request(scope))
