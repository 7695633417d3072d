"""The batch runner: in the supervisor, beside the video job runner, it claims batches and answers their
lines, each once, through the same routes an interactive request takes.

A line is a request of the batch's creator (its key's deployment scope, its account's credits and spend
caps; not its per-minute limits), sent in-process to the server's own app (`LineCall`) marked as batch
work: replicas fill their batches with interactive requests first and give batch lines the room left
(`runtime.host`), so a running batch costs interactive users little. `MODELHOST_BATCH_LINES_IN_FLIGHT`
lines are in flight at once. Answers are recorded in groups (`Batches.record`); a runner that dies
loses at most the answers of its last group, which run again when its batch is taken over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from modelhost import tracing
from modelhost.auth.principal import Principal
from modelhost.batches.input import Line, LineError, check_lines, parse_lines
from modelhost.batches.store import EXPIRED_LINE, Answer, Batches, Claimed, answered, failed
from modelhost.config import Settings
from modelhost.store.types import utcnow

log = logging.getLogger("modelhost.batches")

# (principal, endpoint, body) → (HTTP status, request id, the answer's body: JSON bytes)
LineCall = Callable[[Principal, str, dict[str, Any]], Awaitable[tuple[int, str, bytes]]]
# (principal, endpoint, model) → why that model cannot serve the endpoint for this key, or None
ModelCheck = Callable[[Principal, str, str], Awaitable[str | None]]
PrincipalOf = Callable[[str], Principal | None]
REVOKED = "The API key that created this batch was revoked."
# Answers that say "not now" (the deployment's queue is full, no memory to load it yet): a line waits
# and tries again, RETRIES times at most, before its answer is recorded as it is.
RETRIED = (429, 503)
RETRIES = 5
FLUSH_SECONDS = 0.25
FLUSH_ANSWERS = 512


class BatchRunner:
    def __init__(
        self, batches: Batches, settings: Settings, principal_of: PrincipalOf, check_model: ModelCheck
    ) -> None:
        self.batches = batches
        self.settings = settings
        self.principal_of = principal_of
        self.check_model = check_model
        self.name = f"gw-{secrets.token_hex(6)}"
        self._call: LineCall | None = None
        self._loop: asyncio.Task[None] | None = None
        self._running: dict[str, asyncio.Task[None]] = {}
        self._wake = asyncio.Event()

    def start(self, call: LineCall) -> None:
        """Begin claiming batches; `call` runs a line through the server's own app (`api.batch_lines`)."""
        self._call = call
        self._loop = asyncio.create_task(self._claim_forever())

    def wake(self) -> None:
        """A batch was created in this process: look now rather than at the next poll."""
        self._wake.set()

    async def stop(self) -> None:
        """Stop claiming; hand running batches back (another server, or this one restarted, resumes
        each with its next unanswered line)."""
        if self._loop is not None:
            self._loop.cancel()
        running = list(self._running.items())
        for _, task in running:
            task.cancel()
        await asyncio.gather(*(t for _, t in running), return_exceptions=True)
        for batch_id, _ in running:
            await asyncio.to_thread(self.batches.release, batch_id, self.name)

    async def _claim_forever(self) -> None:
        while True:
            try:
                claimed = None
                if len(self._running) < self.settings.batch_concurrency:
                    claimed = await asyncio.to_thread(
                        self.batches.claim, self.name, self.settings.batch_stale_seconds
                    )
                if claimed is None:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), self.settings.batch_poll_seconds)
                    self._wake.clear()
                    continue
                self._running[claimed.id] = asyncio.create_task(self._run(claimed))
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("batch runner")
                await asyncio.sleep(self.settings.batch_poll_seconds)

    async def _run(self, batch: Claimed) -> None:
        try:
            await BatchRun(self, batch).run()
        except asyncio.CancelledError:
            raise
        except Exception:  # never leave a batch claimed because of a bug here: it is taken over
            log.exception("batch %s", batch.id)
            await asyncio.to_thread(self.batches.release, batch.id, self.name)
        finally:
            self._running.pop(batch.id, None)
            self._wake.set()


class BatchRun:
    """One claim of one batch, from wherever its status says it stands to its end."""

    def __init__(self, runner: BatchRunner, batch: Claimed) -> None:
        self.runner = runner
        self.batches = runner.batches
        self.batch = batch
        self.status: str | None = batch.status
        self.answers: list[Answer] = []
        self.flushed_at = time.monotonic()

    async def run(self) -> None:
        beating = asyncio.create_task(self._heartbeat())
        try:
            await self._run()
        finally:
            beating.cancel()

    async def _heartbeat(self) -> None:
        """Beat while no answer comes back for a while (a cold start, long generations): a claim left
        silent for `batch_stale_seconds` would be taken over, and its lines run twice."""
        while True:
            await asyncio.sleep(self.runner.settings.batch_stale_seconds / 3)
            status = await asyncio.to_thread(self.batches.beat, self.batch.id, self.runner.name)
            if status is None:
                self.status = None  # another runner has it now
            elif status == "cancelling" and self.status == "in_progress":
                self.status = "cancelling"

    async def _run(self) -> None:
        principal = await asyncio.to_thread(self.runner.principal_of, self.batch.key_id)
        data = await asyncio.to_thread(self.batches.input, self.batch)
        parsed = parse_lines(data)
        if self.status == "validating":
            lines = await self._validate(principal, parsed)
            if lines is None:
                return
            self.status = "in_progress"
        else:
            lines = [line for line in parsed if isinstance(line, Line)]
        if self.status == "in_progress" and principal is not None:
            await self._answer(principal, lines)
        elif self.status == "in_progress":  # the creator's key was revoked meanwhile
            await self._fail_all(lines, "invalid_api_key", REVOKED)
        if self.status is None:
            return  # taken over by another runner
        if self.status == "finalizing":  # taken over while its files were being written
            expired = utcnow() >= self.batch.expires_at
            final = "cancelled" if self.batch.cancelled else "expired" if expired else "completed"
        else:
            final = {"cancelling": "cancelled", "expired": "expired"}.get(self.status, "completed")
        await asyncio.to_thread(self.batches.finalize, self.batch.id, self.runner.name, final)

    async def _validate(
        self, principal: Principal | None, parsed: list[Line | LineError]
    ) -> list[Line] | None:
        if principal is None:
            await self._invalid([LineError("invalid_api_key", 0, REVOKED)])
            return None
        verdicts: dict[str, str | None] = {}
        for item in parsed:
            if isinstance(item, Line) and isinstance(item.body.get("model"), str):
                model = item.body["model"]
                if model not in verdicts:
                    verdicts[model] = await self.runner.check_model(principal, self.batch.endpoint, model)
        lines, errors = check_lines(parsed, self.batch.endpoint, verdicts.get)
        if errors:
            await self._invalid(errors)
            return None
        model = str(lines[0].body["model"]) if lines else None
        await asyncio.to_thread(self.batches.validated, self.batch.id, self.runner.name, len(lines), model)
        return lines

    async def _invalid(self, errors: list[LineError]) -> None:
        views = [e.view() for e in errors]
        await asyncio.to_thread(self.batches.invalid, self.batch.id, self.runner.name, views)

    async def _answer(self, principal: Principal, lines: list[Line]) -> None:
        done = await asyncio.to_thread(self.batches.answered, self.batch.id)
        # shortest first: lines in flight together, which the replica batches together, are of like
        # length, so its model calls pad little (the files keep the input's order)
        pending = iter(
            sorted((line for line in lines if line.number not in done), key=lambda line: line.size)
        )
        workers = [
            asyncio.create_task(self._work(principal, pending))
            for _ in range(self.runner.settings.batch_lines_in_flight)
        ]
        try:
            await asyncio.gather(*workers)
        finally:
            for worker in workers:
                worker.cancel()
        if self.status == "in_progress" and utcnow() >= self.batch.expires_at:
            self.status = "expired"
        if self.status == "expired":
            answered = await asyncio.to_thread(self.batches.answered, self.batch.id)
            for line in lines:
                if line.number not in answered:
                    self.answers.append(failed(self.batch.id, line.number, line.custom_id, EXPIRED_LINE))
        await self._flush(force=True)

    async def _work(self, principal: Principal, pending: Iterator[Line]) -> None:
        """One of the lines in flight: takes the next line while the batch goes on."""
        call = self.runner._call
        assert call is not None
        for line in pending:
            if self.status != "in_progress":
                return
            if utcnow() >= self.batch.expires_at:
                self.status = "expired"
                return
            try:
                status, request_id, body = await self._call(call, principal, line)
            except Exception as exc:  # the app answers errors itself; this is a bug, kept to this line
                log.exception("batch %s line %d", self.batch.id, line.number)
                self.answers.append(
                    failed(
                        self.batch.id,
                        line.number,
                        line.custom_id,
                        {"code": "internal_error", "message": type(exc).__name__},
                    )
                )
            else:
                self.answers.append(
                    answered(self.batch.id, line.number, line.custom_id, status, request_id, body)
                )
            await self._flush()

    async def _call(self, call: LineCall, principal: Principal, line: Line) -> tuple[int, str, bytes]:
        """The line's answer; with tracing on, within the line's span, which its request (each try)
        continues: a trace per line, linked to the request that created the batch."""
        return await tracing.within(lambda: self._line_span(line), self._tries(call, principal, line))

    def _line_span(self, line: Line) -> tracing.Span:
        attributes: dict[str, str | int] = {
            "modelhost.batch.id": self.batch.id,
            "modelhost.batch.custom_id": line.custom_id,
            "modelhost.batch.line": line.number,
            "modelhost.batch.endpoint": self.batch.endpoint,
        }
        return tracing.linked_span("batch line", self.batch.traceparent, attributes)

    async def _tries(self, call: LineCall, principal: Principal, line: Line) -> tuple[int, str, bytes]:
        """The line's answer, tried again after a pause (1, 2, 4... s) while it is a "not now"."""
        for attempt in range(RETRIES + 1):
            status, request_id, body = await call(principal, self.batch.endpoint, line.body)
            if status not in RETRIED or attempt == RETRIES or self.status != "in_progress":
                break
            await asyncio.sleep(2.0**attempt)
        return status, request_id, body

    async def _flush(self, force: bool = False) -> None:
        """Record the answers gathered (every FLUSH_SECONDS or FLUSH_ANSWERS), and learn of a cancel."""
        due = len(self.answers) >= FLUSH_ANSWERS or time.monotonic() - self.flushed_at >= FLUSH_SECONDS
        if not (force or due):
            return
        answers, self.answers = self.answers, []
        self.flushed_at = time.monotonic()
        ours = await asyncio.to_thread(self.batches.record, self.batch.id, self.runner.name, answers)
        status = await asyncio.to_thread(self.batches.beat, self.batch.id, self.runner.name)
        if not ours or status is None:
            self.status = None  # another runner has it now
        elif status == "cancelling":
            self.status = "cancelling"

    async def _fail_all(self, lines: list[Line], code: str, message: str) -> None:
        done = await asyncio.to_thread(self.batches.answered, self.batch.id)
        self.answers = [
            failed(self.batch.id, line.number, line.custom_id, {"code": code, "message": message})
            for line in lines
            if line.number not in done
        ]
        await self._flush(force=True)
