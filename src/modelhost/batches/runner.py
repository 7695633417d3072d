"""The batch runner: in the supervisor, beside the video job runner, it claims batches and answers their
lines, each once, through the same routes an interactive request takes.

A line is a request of the batch's creator (its key's deployment scope, its account's credits and spend
caps; not its per-minute limits), sent in-process to the server's own app (`LineCall`) marked as batch
work: replicas fill their batches with interactive requests first and give batch lines the room left
(`runtime.worker.host`), so a running batch costs interactive users little. Answers are recorded in groups
(`Batches.record`); a runner that dies loses at most the answers of its last group, which run again
when its batch is taken over.

Bounds, so that no batch can hurt the server or another account's batches (docs/batch.md, "Bounds"):
- `MODELHOST_BATCH_CONCURRENCY` batches run at once, at most `MODELHOST_BATCH_CONCURRENCY_PER_ACCOUNT`
  of one account, claimed in turn between accounts (`Batches.claim`); the server's
  `MODELHOST_BATCH_LINES_IN_FLIGHT` lines are shared evenly between its running batches.
- A batch's lines in flight are fewer when its answers are large: a line is sent while the answers
  expected of its lines in flight (each line's size × the largest ratio of answer to line seen so far)
  stay within ANSWER_BYTES_IN_FLIGHT; until a line of at least half its size has answered, a line goes
  only while fewer than FIRST_LINES are in flight. A line of 2,048 one-character embedding inputs is
  8 KB and answers 9 MB: a few go together until one has answered, then one at a time.
  An answer over `MODELHOST_BATCH_MAX_ANSWER_BYTES` is an error line; answers gathered are recorded
  every FLUSH_BYTES too; a batch whose answers would pass `MODELHOST_BATCH_MAX_OUTPUT_BYTES` ends
  `failed`, its answers so far in its files. The input is read lazily (`batches.reader`).
- The key and its account's limits are read again every `MODELHOST_BATCH_RECHECK_SECONDS`: a revoked
  key's remaining lines fail `invalid_api_key`, and a new spend cap refuses the lines it forbids.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, BinaryIO, Protocol

import orjson

from modelhost import tracing
from modelhost.auth.principal import Principal
from modelhost.batches.answers import EXPIRED_LINE, Answer, answered, failed
from modelhost.batches.input import Line, LineError, check_lines, parse_line
from modelhost.batches.reader import Offsets, lines_of
from modelhost.batches.store import Batches, Claimed
from modelhost.claims import ClaimLoop
from modelhost.config import Settings
from modelhost.store.types import utcnow

log = logging.getLogger("modelhost.batches")


class LineCall(Protocol):
    """(principal, endpoint, body) → (HTTP status, request id, the answer's body: JSON bytes). `pinned`:
    the artifact of the deployment's version the request runs on (an eval run of one version of a
    rollout, `modelhost.evals`), instead of the version its split would choose."""

    def __call__(
        self, principal: Principal, endpoint: str, body: dict[str, Any], pinned: str | None = None
    ) -> Awaitable[tuple[int, str, bytes]]: ...


# (principal, endpoint, model) → why that model cannot serve the endpoint for this key, or None
ModelCheck = Callable[[Principal, str, str], Awaitable[str | None]]
PrincipalOf = Callable[[str], Principal | None]
REVOKED = "The API key that created this batch was revoked."
# Answers that say "not now" (the deployment's queue is full, no memory to load it yet): a line waits
# and tries again, RETRIES times at most, before its answer is recorded as it is. A spend cap's 429
# (`insufficient_quota`) is not one: it holds until the day or month ends.
RETRIED = (429, 503)
RETRIES = 5
FLUSH_SECONDS = 0.25
FLUSH_ANSWERS = 512
FLUSH_BYTES = 8 * 1024 * 1024
ANSWER_BYTES_IN_FLIGHT = 64 * 1024 * 1024
FIRST_LINES = 8
PAUSE_SECONDS = 0.25  # how often a batch with all its lines in flight looks at its share again


class BatchRunner(ClaimLoop[Claimed]):
    what = "batch"

    def __init__(
        self, batches: Batches, settings: Settings, principal_of: PrincipalOf, check_model: ModelCheck
    ) -> None:
        super().__init__(log)
        self.batches = batches
        self.settings = settings
        self.principal_of = principal_of
        self.check_model = check_model
        self._call: LineCall | None = None

    def start(self, call: LineCall) -> None:
        """Begin claiming batches; `call` runs a line through the server's own app (`api.batch_lines`)."""
        self._call = call
        self.start_claiming()

    def share(self) -> int:
        """The lines one running batch may have in flight: the server's, shared evenly."""
        return max(1, self.settings.batch_lines_in_flight // max(1, len(self.running)))

    def concurrency(self) -> int:
        return self.settings.batch_concurrency

    def poll_seconds(self) -> float:
        return self.settings.batch_poll_seconds

    def claim(self) -> Claimed | None:
        settings = self.settings
        return self.batches.claim(
            self.name, settings.batch_stale_seconds, settings.batch_concurrency_per_account
        )

    def release(self, claim_id: str) -> None:
        """Another server, or this one restarted, resumes the batch with its next unanswered line."""
        self.batches.release(claim_id, self.name)

    async def run(self, claimed: Claimed) -> None:
        await BatchRun(self, claimed).run()


class BatchRun:
    """One claim of one batch, from wherever its status says it stands to its end. `status` is the
    batch's, as this run knows it, or why it stops early: `revoked` (its key), `expired` (its window),
    `failed` (its output budget); None once another runner has it."""

    def __init__(self, runner: BatchRunner, batch: Claimed) -> None:
        self.runner = runner
        self.settings = runner.settings
        self.batches = runner.batches
        self.batch = batch
        self.status: str | None = batch.status
        self.principal: Principal | None = None
        self.answers: list[Answer] = []
        self.gathered = 0  # bytes of `answers`
        self.output_bytes = batch.output_bytes
        self.ratio = 0.0  # the largest answer so far, per byte of its line
        self.longest = 0  # the longest line answered so far, in bytes
        self.expected = 0  # bytes the lines in flight are expected to answer
        self.errors: list[dict[str, Any]] | None = None
        self.flushed_at = time.monotonic()

    async def run(self) -> None:
        self.principal = await asyncio.to_thread(self.runner.principal_of, self.batch.key_id)
        watching = [asyncio.create_task(self._heartbeat()), asyncio.create_task(self._recheck())]
        try:
            await self._run()
        finally:
            for task in watching:
                task.cancel()

    async def _heartbeat(self) -> None:
        """Beat while no answer comes back for a while (a cold start, long generations): a claim left
        silent for `batch_stale_seconds` would be taken over, and its lines run twice."""
        while True:
            await asyncio.sleep(self.settings.batch_stale_seconds / 3)
            self._learn(await asyncio.to_thread(self.batches.beat, self.batch.id, self.runner.name))

    async def _recheck(self) -> None:
        """Read the key and its account's limits again (the lines sent from now on carry them): a
        revoked key stops the batch, a new spend cap applies to its next lines."""
        while True:
            await asyncio.sleep(self.settings.batch_recheck_seconds)
            try:
                self.principal = await asyncio.to_thread(self.runner.principal_of, self.batch.key_id)
            except Exception:  # the database is away: the key is read again at the next turn
                log.warning("batch %s: its key could not be read again", self.batch.id, exc_info=True)
                continue
            if self.principal is None and self.status == "in_progress":
                log.info("batch %s: its key was revoked; its remaining lines fail", self.batch.id)
                self.status = "revoked"

    def _learn(self, status: str | None) -> None:
        """What the database says of the batch now: a cancel, or another runner's claim."""
        if status is None:
            self.status = None
        elif status == "cancelling" and self.status in ("in_progress", "revoked"):
            self.status = "cancelling"

    async def _run(self) -> None:
        if self.status in ("validating", "in_progress"):
            handle = await asyncio.to_thread(self.batches.input, self.batch)
            try:
                offsets = await self._lines(handle)
                if offsets is None:
                    return  # invalid: failed with its errors
                if self.status == "in_progress" and self.principal is None:
                    self.status = "revoked"  # while it waited
                if self.status in ("in_progress", "revoked"):
                    await self._answer(handle, offsets)
            finally:
                handle.close()
        if self.status is None:
            return  # taken over by another runner
        await asyncio.to_thread(
            self.batches.finalize, self.batch.id, self.runner.name, self._final(), self.errors
        )

    def _final(self) -> str:
        if self.status == "finalizing":  # taken over while its files were being written
            if self.batch.failing:
                return "failed"
            expired = utcnow() >= self.batch.expires_at
            return "cancelled" if self.batch.cancelled else "expired" if expired else "completed"
        return {"cancelling": "cancelled", "expired": "expired", "failed": "failed"}.get(
            str(self.status), "completed"
        )

    async def _lines(self, handle: BinaryIO) -> Offsets | None:
        """Where the batch's lines are; a batch still `validating` is checked first."""
        if self.status != "validating":
            return await asyncio.to_thread(Offsets.scan, handle)
        offsets = await self._validate(handle)
        if offsets is not None:
            self.status = "in_progress"
        return offsets

    async def _validate(self, handle: BinaryIO) -> Offsets | None:
        """Check every line (one pass, one line parsed at a time); `in_progress` if all are right."""
        principal = self.principal
        if principal is None:
            await self._invalid([LineError("invalid_api_key", 0, REVOKED)])
            return None
        loop = asyncio.get_running_loop()
        offsets = Offsets()

        def parsed() -> Any:
            for number, offset, raw in lines_of(handle):
                offsets.add(number, offset, len(raw))
                yield parse_line(number, raw)

        async def check(model: str) -> str | None:
            return await self.runner.check_model(principal, self.batch.endpoint, model)

        def unknown(model: str) -> str | None:  # from the thread below, once per model
            return asyncio.run_coroutine_threadsafe(check(model), loop).result()

        errors = await asyncio.to_thread(check_lines, parsed(), self.batch.endpoint, unknown)
        if errors:
            await self._invalid(errors)
            return None
        first = offsets.read(handle, 0) if len(offsets) else None
        model = str(first.body["model"]) if isinstance(first, Line) else None
        await asyncio.to_thread(self.batches.validated, self.batch.id, self.runner.name, len(offsets), model)
        return offsets

    async def _invalid(self, errors: list[LineError]) -> None:
        views = [e.view() for e in errors]
        await asyncio.to_thread(self.batches.invalid, self.batch.id, self.runner.name, views)

    async def _answer(self, handle: BinaryIO, offsets: Offsets) -> None:
        """Send the lines not answered yet, shortest first, as many at once as `_admits`; then
        fail those left if its window passed or its key was revoked."""
        done = await asyncio.to_thread(self.batches.answered, self.batch.id)
        flying: set[asyncio.Task[None]] = set()
        try:
            for index in offsets.shortest_first(done):
                size = offsets.sizes[index]
                while not self._admits(len(flying), size):
                    flying = await self._landed(flying)
                if not self._going():
                    break
                expected = self._guess(size)
                self.expected += expected  # now, not when its task starts: the next line counts it
                flying.add(asyncio.create_task(self._send(offsets.read(handle, index), expected)))
            while flying and self.status != "failed":  # past its budget: their answers would be dropped
                flying = await self._landed(flying)
        finally:
            for task in flying:
                task.cancel()
        if self.status in ("expired", "revoked"):
            await self._fail_rest(handle, offsets)
        await self._flush(force=True)

    @staticmethod
    async def _landed(flying: set[asyncio.Task[None]]) -> set[asyncio.Task[None]]:
        """The lines still in flight after one lands (or a pause: the batch's room may change)."""
        finished, flying = await asyncio.wait(
            flying, timeout=PAUSE_SECONDS, return_when=asyncio.FIRST_COMPLETED
        )
        for task in finished:
            task.result()  # a bug in `_send` (the app's errors are answers) stops the batch's claim
        return flying

    def _admits(self, flying: int, size: int) -> bool:
        """Whether one more line, of `size` bytes, may go: within this batch's share of the server's
        lines in flight, and its expected answer within ANSWER_BYTES_IN_FLIGHT with the others'."""
        if flying >= self.runner.share():
            return False
        if size > 2 * self.longest:  # longer than any answered: its answer's size is unknown
            return flying < FIRST_LINES
        return not flying or self.expected + self._guess(size) <= ANSWER_BYTES_IN_FLIGHT

    def _guess(self, size: int) -> int:
        """The answer expected of a line of `size` bytes, from the answers so far."""
        return int(self.ratio * max(1, size))

    def _going(self) -> bool:
        if self.status == "in_progress" and utcnow() >= self.batch.expires_at:
            self.status = "expired"
        return self.status == "in_progress"

    async def _send(self, item: Line | LineError, expected: int) -> None:
        """One line's answer, gathered for the next `_flush`; `expected`, its guessed size, counted
        in `self.expected` until it lands."""
        try:
            if isinstance(item, LineError):  # not after validation (the input never changes)
                error = {"code": item.code, "message": item.message}
                answer = failed(self.batch.id, item.line, "", error)
            else:
                answer = await self._answer_of(item)
        finally:
            self.expected -= expected
        self.answers.append(answer)
        self.gathered += len(answer.record)
        await self._flush()

    async def _answer_of(self, line: Line) -> Answer:
        principal = self.principal
        if principal is None:  # revoked since this line was taken
            return failed(
                self.batch.id, line.number, line.custom_id, {"code": "invalid_api_key", "message": REVOKED}
            )
        if self.batch.endpoint == "/v1/responses" and line.body.get("background"):
            error = {
                "code": "invalid_request",
                "message": "A batch line cannot run in the background; leave 'background' out.",
                "param": "body.background",
            }
            return failed(self.batch.id, line.number, line.custom_id, error)
        call = self.runner._call
        assert call is not None
        try:
            status, request_id, body = await self._call(call, principal, line)
        except Exception as exc:  # the app answers errors itself; this is a bug, kept to this line
            log.exception("batch %s line %d", self.batch.id, line.number)
            error = {"code": "internal_error", "message": type(exc).__name__}
            return failed(self.batch.id, line.number, line.custom_id, error)
        self.ratio = max(self.ratio, len(body) / max(1, line.size))
        self.longest = max(self.longest, line.size)
        cap = self.settings.batch_max_answer_bytes
        if len(body) > cap:
            error = {
                "code": "answer_too_large",
                "message": f"The answer to this line has {len(body)} bytes, more than the {cap} a batch "
                "line's answer may have (MODELHOST_BATCH_MAX_ANSWER_BYTES); send fewer inputs per line.",
            }
            return failed(self.batch.id, line.number, line.custom_id, error)
        return answered(self.batch.id, line.number, line.custom_id, status, request_id, body)

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
            if not _not_now(status, body) or attempt == RETRIES or self.status != "in_progress":
                break
            await asyncio.sleep(2.0**attempt)
        return status, request_id, body

    async def _flush(self, force: bool = False, budgeted: bool = True) -> None:
        """Record the answers gathered (every FLUSH_SECONDS, FLUSH_ANSWERS or FLUSH_BYTES) within the
        output budget, and learn of a cancel."""
        due = (
            len(self.answers) >= FLUSH_ANSWERS
            or self.gathered >= FLUSH_BYTES
            or time.monotonic() - self.flushed_at >= FLUSH_SECONDS
        )
        if not (force or due):
            return
        answers, self.answers, self.gathered = self.answers, [], 0
        self.flushed_at = time.monotonic()
        if self.status == "failed":
            answers = []  # past its budget: the answers of the lines still in flight are not kept
        elif budgeted:
            answers = self._within_budget(answers)
        ours = await asyncio.to_thread(self.batches.record, self.batch.id, self.runner.name, answers)
        status = await asyncio.to_thread(self.batches.beat, self.batch.id, self.runner.name)
        self._learn(status if ours else None)

    def _within_budget(self, answers: list[Answer]) -> list[Answer]:
        """The answers that fit in the batch's output budget; at the first that does not, the batch
        fails (it stops, and ends `failed` with its answers so far in its files)."""
        budget = self.settings.batch_max_output_bytes
        for kept, answer in enumerate(answers):
            size = len(answer.record) + 1
            if self.output_bytes + size > budget:
                self.status = "failed"
                self.errors = [
                    {
                        "code": "batch_output_too_large",
                        "line": answer.line,
                        "message": f"The batch's answers passed its output budget of {budget} bytes "
                        f"(MODELHOST_BATCH_MAX_OUTPUT_BYTES) at line {answer.line}: the answers recorded "
                        "before are in its output and error files; the other lines did not run. Split "
                        "the batch, or send fewer inputs per line.",
                        "param": None,
                    }
                ]
                return answers[:kept]
            self.output_bytes += size
        return answers

    async def _fail_rest(self, handle: BinaryIO, offsets: Offsets) -> None:
        """The lines without an answer fail: `batch_expired`, or `invalid_api_key` (its key revoked).
        Outside the output budget: such a line is small, and there is one per line at most."""
        error = EXPIRED_LINE if self.status == "expired" else {"code": "invalid_api_key", "message": REVOKED}
        await self._flush(force=True)
        done = await asyncio.to_thread(self.batches.answered, self.batch.id)

        def failures() -> list[Answer]:
            rest = []
            for index, number in enumerate(offsets.numbers):
                if number not in done:
                    item = offsets.read(handle, index)
                    custom_id = item.custom_id if isinstance(item, Line) else ""
                    rest.append(failed(self.batch.id, number, custom_id, error))
            return rest

        rest = await asyncio.to_thread(failures)
        for start in range(0, len(rest), FLUSH_ANSWERS):
            self.answers = rest[start : start + FLUSH_ANSWERS]
            await self._flush(force=True, budgeted=False)


def _not_now(status: int, body: bytes) -> bool:
    """An answer that may change if the line waits: a full queue, no memory yet (not a spend cap)."""
    if status not in RETRIED:
        return False
    with contextlib.suppress(orjson.JSONDecodeError, AttributeError):
        return bool(orjson.loads(body).get("error", {}).get("code") != "insufficient_quota")
    return True
