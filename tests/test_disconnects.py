"""A request's work is cancelled when its connection is lost, told by the HTTP server (`api.disconnects`)
rather than found by a watcher task per request (issue 71). The whole path, a real socket closed under
a live server: test_client_disconnect_drops_its_queued_work_before_it_reaches_the_model
(tests/test_runtime.py)."""

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import Request

from modelhost.api.deps import await_or_disconnect
from modelhost.api.disconnects import SCOPE_KEY, Disconnects
from modelhost.errors import ClientClosedRequest


def _request(disconnects: Disconnects) -> Request:
    async def receive() -> dict[str, object]:
        raise AssertionError("the server says when the client leaves: nothing reads receive()")

    return Request({"type": "http", "headers": [], SCOPE_KEY: disconnects}, receive)


async def test_work_is_cancelled_when_the_connection_is_lost_and_the_answer_is_499() -> None:
    disconnects, started, cancelled = Disconnects(), asyncio.Event(), asyncio.Event()

    async def work() -> str:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    waiting = asyncio.create_task(await_or_disconnect(_request(disconnects), work()))
    await started.wait()
    disconnects.lost()
    with pytest.raises(ClientClosedRequest):
        await waiting
    assert cancelled.is_set()


async def test_a_connection_lost_before_the_work_starts_answers_499_without_running_it() -> None:
    disconnects, ran = Disconnects(), []
    disconnects.lost()

    async def work() -> None:
        ran.append(True)

    with pytest.raises(ClientClosedRequest):
        await await_or_disconnect(_request(disconnects), work())
    assert ran == []


async def test_finished_work_leaves_nothing_registered_on_its_kept_alive_connection() -> None:
    disconnects = Disconnects()

    async def work() -> str:
        return "answer"

    for _ in range(3):  # three requests on one connection
        assert await await_or_disconnect(_request(disconnects), work()) == "answer"
    assert disconnects._callbacks == []
    disconnects.lost()  # nothing left to cancel
