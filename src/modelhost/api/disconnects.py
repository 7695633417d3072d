"""Who to tell when a request's client goes away, without a task per request to find out.

`api.deps.await_or_disconnect` cancels a request's work when its client leaves. An ASGI app learns of
that only by calling `receive()` until it says `http.disconnect`, which costs a watcher task per request
(created, woken, cancelled: about a tenth of the gateway's own CPU per embeddings request, issue 71).
The gateway's HTTP server knows it at once (its connection is lost), so it puts one `Disconnects` per
connection in each request's scope (`server.http.ClientGuard`) and calls it then; the work's task
registers a callback for as long as it waits. An app served by anything else (an in-process test
transport) has no `Disconnects` in its scope, and `await_or_disconnect` watches `receive()` as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

SCOPE_KEY = "modelhost.disconnects"  # where a request's scope holds its connection's `Disconnects`


class Disconnects:
    """A connection's callbacks for its loss; `gone` once it was lost (a callback added later is never
    called: the caller checks `gone` first)."""

    __slots__ = ("_callbacks", "gone")

    def __init__(self) -> None:
        self.gone = False
        self._callbacks: list[Callable[[], None]] = []

    def add(self, callback: Callable[[], None]) -> None:
        self._callbacks.append(callback)

    def discard(self, callback: Callable[[], None]) -> None:
        with contextlib.suppress(ValueError):  # already called: the connection was lost
            self._callbacks.remove(callback)

    def lost(self) -> None:
        """The connection is gone: every callback, once."""
        self.gone = True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()
