"""The HTTP server of every gateway process, and its defences against slow and stalled clients.

uvicorn times out nothing but an idle kept-alive connection: a client that sends half a request header,
or a body that stops arriving, holds its connection (a file descriptor) for ever, and enough of them
exhaust the process's descriptors. `ClientGuard` is uvicorn's httptools protocol with one deadline per
connection on top (docs/operations.md, "Slow and stalled clients"):

- **headers**: complete within `http_header_timeout_seconds` of the connection's start, or, on a
  kept-alive connection, of the next request's first byte (the wait before that byte is uvicorn's
  keep-alive timeout, `http_keep_alive_seconds`);
- **body**: each read of a body within `http_body_timeout_seconds` of the one before: an idle limit,
  not a limit on the whole body, since uploads of big model files are legitimate and slow;
- **connections**: a connection opened while the process already holds `http_max_connections` is
  answered 503 (our error body, `Retry-After`) at its first request and closed.

A deadline that passes is answered 408 with our error body where no answer has begun, then the
connection closes. uvicorn's own `limit_concurrency` is not used: its 503 is plain text, and it counts
request tasks as well as connections (a task may outlive its connection), so its limit is neither.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from typing import Any, ClassVar, Literal

import uvicorn
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from modelhost.api.disconnects import SCOPE_KEY as DISCONNECTS
from modelhost.api.disconnects import Disconnects
from modelhost.api.errors import error_response
from modelhost.config import Settings
from modelhost.errors import ModelhostError, RequestTimeout, ServiceUnavailable
from modelhost.logs import log_config
from modelhost.metrics import Counter

log = logging.getLogger("modelhost.server")

TIMEOUTS = Counter(
    "modelhost_http_timeouts_total",
    "Connections closed because a request's headers or body stopped arriving.",
    ["kind"],
)
REFUSED = Counter(
    "modelhost_http_refused_connections_total",
    "Connections answered 503 because the gateway process already held http_max_connections.",
)
RETRY_AFTER_SECONDS = 1  # connections come and go quickly: a refused client may well be served in a second

Waiting = Literal["header", "body"]
TIMEOUT_MESSAGES: dict[Waiting, str] = {
    "header": "The request's headers did not arrive in time.",
    "body": "The request's body stopped arriving.",
}


def uvicorn_config(app: Any, settings: Settings, log_level: str, **options: Any) -> uvicorn.Config:
    """The one uvicorn configuration of every gateway process (the supervisor's and the others)."""
    return uvicorn.Config(
        app,
        log_level=log_level,
        log_config=log_config(log_level),
        timeout_graceful_shutdown=30,
        timeout_keep_alive=settings.http_keep_alive_seconds,
        http=guard_for(settings),
        # no `server: uvicorn` on every answer: it names the software to anyone who asks, and costs a
        # header per response
        server_header=False,
        # forwarded headers only from the proxies the operator names: uvicorn's default trusts 127.0.0.1,
        # so any local process could forge its address (audit rows) and dodge the wrong-key throttle
        proxy_headers=bool(settings.trusted_proxy_list),
        forwarded_allow_ips=settings.trusted_proxy_list or None,
        **options,
    )


class QuietServer(uvicorn.Server):
    """uvicorn's server, waking once a second at rest instead of ten times.

    uvicorn's main loop sleeps 0.1 s between looks at `should_exit` (and refreshes the `date` header
    every tenth): a gateway process at rest woke ten times a second, about 2 ms of CPU a second, which is
    0.03 ms of the gateway's CPU per output token of a stream at 20 ms a token (issue 71). This loop
    waits up to a second, and setting `should_exit` (a signal's handler, the supervisor gone) wakes it
    at once: a drain begins as promptly as before, and the `date` header keeps its one-second grain.
    """

    tick_seconds: ClassVar[float] = 1.0

    def __init__(self, config: uvicorn.Config) -> None:
        self._exit_asked = False
        self._wake: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None
        super().__init__(config)

    @property
    def should_exit(self) -> bool:
        return self._exit_asked

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._exit_asked = value
        if value and self._wake is not None:
            loop, wake = self._wake
            loop.call_soon_threadsafe(wake.set)  # from a signal's handler, or another thread

    async def main_loop(self) -> None:
        loop, wake = asyncio.get_running_loop(), asyncio.Event()
        self._wake = (loop, wake)
        # `on_tick(0)`: each look refreshes the `date` header (uvicorn's counter does it every tenth)
        should_exit = await self.on_tick(0)
        while not should_exit:
            timer = loop.call_later(self.tick_seconds, wake.set)
            await wake.wait()
            wake.clear()
            timer.cancel()
            should_exit = await self.on_tick(0)


def guard_for(settings: Settings) -> type[ClientGuard]:
    """`ClientGuard` with these settings' limits: uvicorn makes the protocol itself, from a class."""
    return type(
        "ClientGuard",
        (ClientGuard,),
        {
            "header_timeout": settings.http_header_timeout_seconds,
            "body_timeout": settings.http_body_timeout_seconds,
            "max_connections": settings.http_max_connections,
        },
    )


def raise_open_files_limit() -> None:
    """Let the process (and the processes it starts) open as many descriptors as the system allows:
    the usual soft limit of 1024 is below `http_max_connections`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 1_048_576
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError):
            log.warning("could not raise the open files limit from %d to %d", soft, wanted)


class ClientGuard(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol with a deadline for the headers and for each read of a body.

    One timer per connection, armed at the connection's start and at the first bytes after a request
    (headers), re-armed at the end of the headers and at each piece of body (body), cancelled when the
    request is complete. While a request is answered there is no deadline: the model may take its time.
    Between requests uvicorn's keep-alive timer closes an idle connection.
    """

    header_timeout: ClassVar[float]
    body_timeout: ClassVar[float]
    max_connections: ClassVar[int]

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._deadline: asyncio.TimerHandle | None = None
        self._armed_for = 0.0  # the loop time `_deadline` fires at
        self._due_at = 0.0  # the loop time the awaited part of the request is due by
        self._waiting: Waiting | None = None
        self._over_capacity = False
        self._disconnects = Disconnects()  # told when the connection is lost (`api.disconnects`)

    # ---- the connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._over_capacity = len(self.connections) > self.max_connections
        self._expect("header")

    def connection_lost(self, exc: Exception | None) -> None:
        self._expect(None)
        if self._deadline is not None:  # nothing more to wait for: the timer would keep the protocol
            self._deadline.cancel()
            self._deadline = None
        super().connection_lost(exc)
        self._disconnects.lost()

    def handle_websocket_upgrade(self) -> None:
        self._expect(None)  # the connection is the WebSocket protocol's from now on
        super().handle_websocket_upgrade()

    def data_received(self, data: bytes) -> None:
        if self._waiting is None:  # the next request's first byte (a fresh connection waits from its start)
            self._expect("header")
        super().data_received(data)

    # ---- the parser's callbacks

    def on_headers_complete(self) -> None:
        self._expect("body")
        self.scope[DISCONNECTS] = self._disconnects  # type: ignore[literal-required]
        if self._over_capacity:
            REFUSED.inc()
            self.app = _refuse
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._expect("body")
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._expect(None)
        super().on_message_complete()
        # no cycle: a WebSocket's opening request, whose connection the WebSocket protocol takes over
        if self.cycle is not None and self.cycle.response_complete and not self.transport.is_closing():
            # answered before the body ended (a 401 to an upload, say): the body's bytes ended uvicorn's
            # keep-alive wait, begun at the answer, and nothing else would close the idle connection
            self._unset_keepalive_if_required()
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

    # ---- the deadline

    def _expect(self, waiting: Waiting | None) -> None:
        """Wait for `waiting` (None: for nothing) from now on, for as long as its timeout allows.

        The deadline moves three or four times a request (its first byte, its headers, each piece of
        its body, its end), and a timer made and cancelled each time cost every request CPU (issue 71).
        So the connection's one timer stays armed: moved only to an earlier time, and when it fires
        for a deadline that has since moved later (or for nothing awaited), it arms itself again (or
        stops)."""
        self._waiting = waiting
        if waiting is None:
            return
        timeout = self.header_timeout if waiting == "header" else self.body_timeout
        self._due_at = self.loop.time() + timeout
        if self._deadline is None or self._due_at < self._armed_for:
            self._arm()

    def _arm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._armed_for = self._due_at
        self._deadline = self.loop.call_at(self._due_at, self._timed_out)

    def _held_up_here(self, waiting: Waiting) -> bool:
        """Whether the server, not the client, is why nothing arrives: a pipelined request waits for the
        answer to the one before; a body waits while the app has not read what came (reading paused)
        or has not yet asked for it (`Expect: 100-continue`)."""
        cycle = self.cycle
        if waiting == "header":
            return cycle is not None and not cycle.response_complete
        return self.flow.read_paused or (cycle is not None and cycle.waiting_for_100_continue)

    def _timed_out(self) -> None:
        waiting, cycle = self._waiting, self.cycle
        self._deadline = None
        if waiting is None or self.transport.is_closing():
            return
        if self.loop.time() < self._due_at:  # the deadline moved on since the timer was armed
            self._arm()
            return
        if self._held_up_here(waiting):
            return self._expect(waiting)
        TIMEOUTS.labels(kind=waiting).inc()
        log.debug("%s: the request's %s stopped arriving; closing", self.client, waiting)
        if waiting == "body":
            if cycle is None or cycle.response_started:
                self.transport.close()  # too late for a 408; the client sees the connection close
                return
            cycle.disconnected = True  # the app's receive() now says so, and its answer goes nowhere
            cycle.message_event.set()
        self._answer_and_close(RequestTimeout(TIMEOUT_MESSAGES[waiting]))

    def _answer_and_close(self, error: ModelhostError) -> None:
        """Write `error` as a whole response straight to the connection, then close it."""
        body = json.dumps(error.body()).encode()
        head = [STATUS_LINE[error.status_code]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
        ]
        self.transport.write(b"".join(head) + body)
        self.transport.close()


async def _refuse(scope: Any, receive: Any, send: Any) -> None:
    """The answer to a request on a connection beyond `http_max_connections` (then it closes)."""
    error = ServiceUnavailable(
        "This server has too many open connections; retry shortly.",
        headers={"Retry-After": str(RETRY_AFTER_SECONDS), "Connection": "close"},
    )
    await error_response(error)(scope, receive, send)
