"""The fast lane: JSON inference requests served without FastAPI's per-request machinery.

FastAPI spends more CPU per request than the rest of the gateway together: it walks every route to
match one, solves dependencies, wraps the call in several layers (about 90 µs of a gateway's CPU per
request here, measured in docs/benchmarks.md). The inference routes all take the same three things
(a JSON body validated by one pydantic model, the request, the caller's principal) and answer a
`Response`. For those, the lane does exactly that by hand and calls the same endpoint function.

Nothing else changes: FastAPI still builds /docs and the OpenAPI document from the same routes, serves
every other route, and serves these too whenever the lane would not answer exactly as it does: a body
that is not JSON (raw media, forms: `api.bodies`), an empty body, or a body that fails validation (the
lane hands it on with the bytes it read, so the 400 is FastAPI's own). Errors raised after that are
answered by the one error body (`api.errors`), as FastAPI's handlers would.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import fastapi.routing
from fastapi import FastAPI, Request, Response
from fastapi.params import Depends
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from modelhost.api.deps import ServicesDep, get_services
from modelhost.api.errors import error_response
from modelhost.auth.principal import Principal
from modelhost.errors import ModelhostError, PayloadTooLarge

log = logging.getLogger("modelhost.api")
JSON_TYPES = (b"application/json",)


@dataclass(frozen=True)
class Lane:
    """One route the lane serves: what to parse, and the endpoint's parameter names."""

    path: str
    route: APIRoute
    body_type: type[BaseModel]
    body: str
    request: str | None
    principal: str | None
    authenticate: Callable[[Request], Awaitable[Principal]] | None
    services: str | None = None

    async def call(self, request: Request, body: BaseModel) -> Response:
        arguments: dict[str, Any] = {self.body: body}
        if self.request is not None:
            arguments[self.request] = request
        if self.services is not None:
            arguments[self.services] = get_services(request)
        if self.principal is not None:
            assert self.authenticate is not None
            arguments[self.principal] = await self.authenticate(request)
        response: Response = await self.route.endpoint(**arguments)
        return response


def lane_of(route: APIRoute, path: str) -> Lane | None:
    """A lane for a `POST` route of the shape `(body: Model, request: Request, principal: <dependency>,
    services: ServicesDep) -> Response` with no path parameters; None for any other route."""
    if route.methods != {"POST"} or "{" in path or not inspect.iscoroutinefunction(route.endpoint):
        return None
    hints = typing.get_type_hints(route.endpoint, include_extras=True)
    if not (isinstance(hints.get("return"), type) and issubclass(hints["return"], Response)):
        return None
    body = request = principal = services = None
    authenticate = None
    for name in inspect.signature(route.endpoint).parameters:
        hint = hints.get(name)
        if hint is Request:
            request = name
        elif isinstance(hint, type) and issubclass(hint, BaseModel) and body is None:
            body, body_type = name, hint
        elif hint == ServicesDep:
            services = name
        elif typing.get_origin(hint) is typing.Annotated and typing.get_args(hint)[0] is Principal:
            dependency = next((m for m in typing.get_args(hint)[1:] if isinstance(m, Depends)), None)
            if dependency is None or dependency.dependency is None:
                return None
            principal, authenticate = name, dependency.dependency
        else:
            return None  # a parameter the lane does not know how to give
    if body is None:
        return None
    return Lane(path, route, body_type, body, request, principal, authenticate, services)


def routes_of(app: FastAPI) -> list[tuple[APIRoute, str]]:
    """Every API route with its full path (FastAPI 0.16x keeps included routers as they were)."""
    contexts = getattr(fastapi.routing, "iter_route_contexts", None)
    if contexts is None:  # older FastAPI: included routes are copied into the app, with their paths
        return [(r, r.path) for r in app.routes if isinstance(r, APIRoute)]
    found = []
    for context in contexts(app.routes):
        if isinstance(context.original_route, APIRoute) and context.path:
            found.append((context.original_route, str(context.path)))
    return found


class FastLane:
    """ASGI middleware in front of FastAPI's router (inside the metrics and body-limit middleware)."""

    def __init__(self, app: ASGIApp, fastapi: FastAPI) -> None:
        self.app = app
        self._fastapi = fastapi
        self._lanes: dict[str, Lane] | None = None

    def lanes(self) -> dict[str, Lane]:
        """Built on first use: every router has been included by then."""
        if self._lanes is None:
            found = (lane_of(route, path) for route, path in routes_of(self._fastapi))
            self._lanes = {lane.path: lane for lane in found if lane is not None}
        return self._lanes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        lane = (
            self.lanes().get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        )
        if lane is None or not _is_json(scope):
            await self.app(scope, receive, send)
            return
        try:
            body = await _read_body(receive)
        except HTTPException as exc:  # the body-limit middleware stopped it while streaming
            await error_response(PayloadTooLarge(str(exc.detail)), scope["path"])(scope, receive, send)
            return
        replay = _replaying(body, receive)
        if not body:
            await self.app(scope, replay, send)
            return
        scope["route"] = lane.route  # what the metrics label and the routing table read
        request = Request(scope, replay)
        try:
            parsed = lane.body_type.model_validate_json(body)
        except ValidationError:
            await self.app(scope, replay, send)  # FastAPI answers the 400, exactly as without the lane
            return
        try:
            response = await lane.call(request, parsed)
        except ModelhostError as exc:
            response = error_response(exc, scope["path"])
        except Exception:
            log.exception("unhandled error on POST %s", scope["path"])
            response = error_response(ModelhostError("Internal server error."), scope["path"])
        await response(scope, replay, send)


class LaneFirst(FastAPI):
    """FastAPI, entered past its own outer layers for the paths the lane serves: a `POST` to one of them
    goes straight to modelhost's middleware (`api.middleware.RequestPath` and what it wraps, the same
    instances as for every other request) and the lane. The layers it skips pass these requests through
    unchanged here: Starlette's error catcher (its one job, answering an unhandled exception with the
    app's handler, is done here too), FastAPI's telemetry (off) and its body limit (unset: modelhost's
    own `BodySizeLimit` applies). Each cost a call and a frame per request, and the error catcher a
    wrapper around every `send` (issue 71)."""

    _entry: tuple[ASGIApp, FastLane] | None = None

    def _lane_entry(self) -> tuple[ASGIApp, FastLane] | None:
        """(the outermost of modelhost's middleware, the lane), found in the stack FastAPI built."""
        if self._entry is None:
            if self.middleware_stack is None:
                self.middleware_stack = self.build_middleware_stack()
            layers: list[Any] = []
            layer: Any = self.middleware_stack
            while layer is not None and len(layers) < 32:
                layers.append(layer)
                layer = getattr(layer, "app", None)
            lane = next((found for found in layers if isinstance(found, FastLane)), None)
            outermost_kind: object = self.user_middleware[0].cls if self.user_middleware else None
            outermost = next((found for found in layers if type(found) is outermost_kind), None)
            if lane is None or outermost is None:
                return None
            self._entry = (outermost, lane)
        return self._entry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            entry = self._lane_entry()
            if entry is not None and scope["path"] in entry[1].lanes():
                if self.root_path:
                    scope["root_path"] = self.root_path
                scope["app"] = self
                try:
                    await entry[0](scope, receive, send)
                except Exception as exc:
                    await self._unhandled(scope, receive, send, exc)
                    raise  # logged by the HTTP server, as Starlette's error catcher does
                return
        await super().__call__(scope, receive, send)

    async def _unhandled(self, scope: Scope, receive: Receive, send: Send, exc: Exception) -> None:
        """The app's own answer to an unhandled exception (`api.errors`: 500 or 507, the one error body),
        unless the answer had started."""
        handler = self.exception_handlers.get(Exception)
        if handler is None:
            return
        response = handler(Request(scope, receive), exc)
        if inspect.isawaitable(response):
            response = await response
        with contextlib.suppress(Exception):  # the answer had started: the HTTP server closes it
            await response(scope, receive, send)


def _is_json(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-type":
            return value.split(b";", 1)[0].strip().lower() in JSON_TYPES
    return False


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b""  # the client left before sending it all: nothing to answer
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _replaying(body: bytes, receive: Receive) -> Receive:
    """`receive` that gives the body already read once more, then the client's next messages."""
    pending = True

    async def replay() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
