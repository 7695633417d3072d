"""`/v1/realtime?model=<chat deployment>` over WebSocket: OpenAI's Realtime API (docs/realtime.md).

The route is thin: when the socket opens, the key is checked by the one key check of inference
(`api.deps.caller`: `models:call`), the chat deployment is chosen by routing as for a chat completion
(`api.deps.deployment_for`), and the session is admitted as an inference request (credits, spend caps,
quotas, rate limits: `api.deps.admit`; the session holds that place until it ends, and its tokens are
counted when it ends). Then each text frame goes to the session (`serving.realtime.session`), which
emits the server's events; the route sends them.

The socket is accepted before these checks, so that a refusal reaches the client as an `error` event
(OpenAI's error object) instead of a bare failed handshake; the socket then closes with
4000 + the HTTP status the same refusal has on the HTTP routes (4401 wrong key, 4403 role, 4404 unknown
model, 4400 a model that is no chat deployment, 4402 no credits, 4429 rate limits or too many sessions).
A session closes with 1008 when its client breaks a bound that ends it (events per second), 1000 when
it reaches `MODELHOST_REALTIME_MAX_SESSION_SECONDS` (after a `session_expired` error event), 1011 on a
server error. A client that goes away ends its session: the generation and transcriptions in flight are
cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import orjson
from fastapi import APIRouter
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from modelhost import audit
from modelhost.api.deps import admit, caller, deployment_for, get_services, release_admission
from modelhost.auth.limits import start_counting
from modelhost.auth.principal import Principal
from modelhost.errors import InternalError, InvalidRequest, ModelhostError
from modelhost.frontend import Target
from modelhost.generation.choices import new_id
from modelhost.routing import DeploymentRef
from modelhost.serving.realtime.session import Abuse, Bounds, RealtimeSession

log = logging.getLogger("modelhost.realtime")
ENDPOINT = "/v1/realtime"
CLOSE_NORMAL = 1000
CLOSE_POLICY = 1008  # the client broke a bound of its session
CLOSE_ERROR = 1011
REFUSAL_BASE = 4000  # + the HTTP status of the refusal

router = APIRouter()


class Sender:
    """The session's events onto the socket, one at a time (the session's response task and its reader
    both send)."""

    def __init__(self, websocket: WebSocket) -> None:
        self.websocket = websocket
        self._lock = asyncio.Lock()

    async def __call__(self, event: dict[str, Any]) -> None:
        async with self._lock:
            try:
                await self.websocket.send_text(orjson.dumps(event).decode())
            except RuntimeError as exc:  # Starlette's "close message has been sent"
                raise WebSocketDisconnect(CLOSE_NORMAL) from exc

    async def close(self, code: int, reason: str = "") -> None:
        async with self._lock:
            if self.websocket.application_state is WebSocketState.CONNECTED:
                with contextlib.suppress(RuntimeError):  # the client closed first
                    await self.websocket.close(code, reason[:120])


async def realtime(websocket: WebSocket) -> None:
    """One realtime session, from the socket's opening to its close."""
    services = get_services(websocket)
    await websocket.accept()
    send = Sender(websocket)
    used = start_counting()  # the session's tokens (the rate limits' token buckets, the person's quota)
    try:
        principal = await caller(websocket)
        deployment = await deployment_for(websocket, principal, _model(websocket), ENDPOINT)
        await admit(websocket, principal)
        limit = services.settings.realtime_max_sessions_per_key
        with services.realtime.taken(principal.key_id or "", limit):
            await _session(websocket, send, principal, deployment, used)
    except ModelhostError as exc:  # refused before the session started (the session says its own errors)
        await _refuse(send, exc)
    finally:
        release_admission(websocket.scope, used[0])


async def _session(
    websocket: WebSocket, send: Sender, principal: Principal, deployment: DeploymentRef, used: list[int]
) -> None:
    """The session on `deployment` until the client leaves, it expires, or its client breaks a bound."""
    services = get_services(websocket)

    async def resolve(name: str, endpoint: str) -> str:
        found = await deployment_for(websocket, principal, name, endpoint)
        return found.runtime_key or found.id

    bounds = Bounds.of(services.settings)
    session = RealtimeSession(
        chat_model=deployment.model,
        generation=services.generation,
        target=Target.of(deployment, principal),
        runtime=services.runtime,
        resolve=resolve,
        send=send,
        bounds=bounds,
        expires_at=int(time.time() + bounds.max_session_seconds),
    )
    account_id, started = principal.account_id, time.monotonic()
    await asyncio.to_thread(
        services.audit.note,
        "realtime_session.started",
        "realtime_session",
        session.id,
        account_id,
        audit.created({"model": deployment.model, "deployment_id": deployment.id}),
    )
    try:
        async with asyncio.timeout(bounds.max_session_seconds):
            await session.start()
            await _serve(websocket, session)
    except TimeoutError:
        await _ending(session.expire())
        await send.close(CLOSE_NORMAL, "session expired")
    except Abuse as exc:
        await send.close(CLOSE_POLICY, str(exc))
    except WebSocketDisconnect:
        pass
    except Exception:  # a bug: said and logged, the socket closed
        log.exception("realtime session %s failed", session.id)
        await _ending(session.report(InternalError("The session failed on the server.")))
        await send.close(CLOSE_ERROR, "server error")
    finally:
        await session.close()
        ended = {
            "seconds": round(time.monotonic() - started, 1),
            "responses": session.responses,
            "usage": used[0],  # tokens (a field named like `token` is dropped as a secret: `audit`)
            "input_audio_seconds": round(session.audio_in_seconds, 1),
            "output_audio_seconds": round(session.audio_out_seconds, 1),
        }
        await asyncio.to_thread(
            services.audit.note,
            "realtime_session.ended",
            "realtime_session",
            session.id,
            account_id,
            audit.created(ended),
        )


async def _serve(websocket: WebSocket, session: RealtimeSession) -> None:
    """Each frame to the session until the client leaves."""
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            return
        frame = message.get("text")
        await session.handle(frame if frame is not None else message.get("bytes") or b"")


def _model(websocket: WebSocket) -> str | None:
    """The URL's `model` (one value): the chat deployment the session answers with."""
    values = websocket.query_params.getlist("model")
    if len(values) > 1:
        raise InvalidRequest("`model` is given more than once; it takes one value.", param="model")
    return values[0] if values else None


async def _refuse(send: Sender, exc: ModelhostError) -> None:
    """A session refused before it started: its error event, then the close code of its status."""
    await _ending(send({"type": "error", "event_id": new_id("event"), "error": exc.body()["error"]}))
    await send.close(REFUSAL_BASE + exc.status_code, exc.code)


async def _ending(said: Any) -> None:
    """A last event, where the client is still there to read it."""
    with contextlib.suppress(WebSocketDisconnect):
        await said


router.add_websocket_route(ENDPOINT, realtime)
