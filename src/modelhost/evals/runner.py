"""The eval runner: in the supervisor, beside the batch runner, it claims eval runs and grades their
items, each once, through the batch tier's machinery.

Every model call of a run (its samples' generations, its `score_model` and `label_model` graders) is a
chat completion sent in-process to a gateway's own app as a batch line is (`batches.runner.LineCall`,
`api.batch_lines`): a request of the run's creator (its key's deployment scope, its account's credits
and spend caps, not its per-minute limits), at low priority behind every interactive request, billed as
any batch line is. A run has at most ITEMS_IN_FLIGHT items in flight; results are recorded in groups
(`EvalStore.record`), and a run taken over after a crash grades only the items without a result.
A cancel, a deletion or another runner's claim shows at the next beat: the run stops there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import orjson

from modelhost.auth.principal import Principal
from modelhost.batches.runner import LineCall, PrincipalOf
from modelhost.claims import ClaimLoop
from modelhost.config import Settings
from modelhost.errors import ModelhostError
from modelhost.evals.graders import MODEL_GRADERS, grade, model_request, model_result, result
from modelhost.evals.store import Claimed, EvalStore, ItemResult
from modelhost.evals.templates import lookup, render

log = logging.getLogger("modelhost.evals")
CHAT = "/v1/chat/completions"
ITEMS_IN_FLIGHT = 8
FLUSH_SECONDS = 0.25
REVOKED = {"code": "invalid_api_key", "message": "The API key that created this run was revoked."}


class EvalRunner(ClaimLoop[Claimed]):
    what = "eval run"

    def __init__(self, store: EvalStore, settings: Settings, principal_of: PrincipalOf) -> None:
        super().__init__(log)
        self.store = store
        self.settings = settings
        self.principal_of = principal_of
        self.call: LineCall | None = None

    def start(self, call: LineCall) -> None:
        """Begin claiming runs; `call` sends a chat completion through a gateway's app, as a batch line."""
        self.call = call
        self.start_claiming()

    def concurrency(self) -> int:
        return self.settings.batch_concurrency

    def poll_seconds(self) -> float:
        return self.settings.batch_poll_seconds

    def claim(self) -> Claimed | None:
        settings = self.settings
        return self.store.claim(
            self.name, settings.batch_stale_seconds, settings.batch_concurrency_per_account
        )

    def release(self, claim_id: str) -> None:
        self.store.release(claim_id, self.name)

    async def run(self, claimed: Claimed) -> None:
        assert self.call is not None
        await EvalRunJob(self, claimed, self.call).run()


class EvalRunJob:
    """One claim of one run, to its end (or until it is no longer this runner's to run)."""

    def __init__(self, runner: EvalRunner, run: Claimed, call: LineCall) -> None:
        self.runner, self.store, self.run_ = runner, runner.store, run
        self.call = call
        self.going = True
        self.gathered: list[ItemResult] = []
        self.flushed_at = time.monotonic()

    async def run(self) -> None:
        principal = await asyncio.to_thread(self.runner.principal_of, self.run_.key_id)
        if principal is None:
            await asyncio.to_thread(self.store.finish, self.run_.id, self.runner.name, "failed", REVOKED)
            return
        done = await asyncio.to_thread(self.store.done, self.run_.id)
        pending = [i for i in range(len(self.run_.items)) if i not in done]
        room = asyncio.Semaphore(ITEMS_IN_FLIGHT)
        beating = asyncio.create_task(self._heartbeat())
        try:
            await asyncio.gather(*(self._item(principal, index, room) for index in pending))
            await self._flush(force=True)
        finally:
            beating.cancel()
        if self.going:
            await asyncio.to_thread(self.store.finish, self.run_.id, self.runner.name, "completed")

    async def _heartbeat(self) -> None:
        """Beat, and read the run's key again (as a batch does, every `batch_recheck_seconds`): a
        cancel, a deletion or another runner's claim stops it; a revoked key fails it."""
        settings = self.runner.settings
        while self.going:
            await asyncio.sleep(min(settings.batch_recheck_seconds, settings.batch_stale_seconds / 3))
            if not await asyncio.to_thread(self.store.beat, self.run_.id, self.runner.name):
                self.going = False  # canceled, deleted, or taken over
            elif await asyncio.to_thread(self.runner.principal_of, self.run_.key_id) is None:
                self.going = False
                await asyncio.to_thread(self.store.finish, self.run_.id, self.runner.name, "failed", REVOKED)

    async def _item(self, principal: Principal, index: int, room: asyncio.Semaphore) -> None:
        async with room:
            if not self.going:
                return
            graded = await self._graded(principal, index)
            self.gathered.append(graded)
            await self._flush()

    async def _flush(self, force: bool = False) -> None:
        if not self.gathered or not (force or time.monotonic() - self.flushed_at >= FLUSH_SECONDS):
            return
        results, self.gathered, self.flushed_at = self.gathered, [], time.monotonic()
        if not await asyncio.to_thread(self.store.record, self.run_.id, self.runner.name, results):
            self.going = False

    async def _graded(self, principal: Principal, index: int) -> ItemResult:
        entry = self.run_.items[index]
        item: dict[str, Any] = entry["item"]
        usage: dict[str, list[int]] = {}
        source = self.run_.data_source
        sample: dict[str, Any] | None = entry.get("sample")
        if source["type"] == "completions":
            try:
                sample = await self._sample(principal, source, item, usage)
            except ModelhostError as exc:  # a template past its bound
                sample = {"error": {"code": exc.code, "message": exc.message}}
            if sample.get("error"):
                return ItemResult(index, "error", item, [], sample, usage)
        sample = sample or {}
        results = [
            await self._criterion(principal, c, item, sample, usage) for c in self.run_.testing_criteria
        ]
        status = "pass" if all(r["passed"] for r in results) else "fail"
        return ItemResult(index, status, item, results, sample, usage)

    async def _sample(
        self, principal: Principal, source: dict[str, Any], item: dict[str, Any], usage: dict[str, list[int]]
    ) -> dict[str, Any]:
        """The item's sample: the run's model's answer to its rendered messages."""
        given = source["input_messages"]
        if given["type"] == "item_reference":
            space, _, path = given["item_reference"].partition(".")
            messages = lookup({"item": item}.get(space), path.split("."))
            if not isinstance(messages, list):
                error = {
                    "code": "invalid_item",
                    "message": f"{given['item_reference']} is not a list of messages.",
                }
                return {"error": error}
        else:
            values = {"item": item}
            messages = [
                {"role": m["role"], "content": render(m["content"], values)} for m in given["template"]
            ]
        params = source["sampling_params"]
        body = {"model": source["model"], "messages": messages, **params}
        status, answer = await self._chat(principal, body, usage, source.get("artifact_id"))
        text = _text_of(answer) if status == 200 else ""
        choice = (answer.get("choices") or [{}])[0] if status == 200 else {}
        return {
            "input": messages,
            "output": [{"role": "assistant", "content": text}],
            "output_text": text,
            "output_json": _json_object(text),
            "choices": answer.get("choices", []) if status == 200 else [],
            "finish_reason": choice.get("finish_reason"),
            "model": source["model"],
            "usage": answer.get("usage") if status == 200 else None,
            "error": None if status == 200 else answer.get("error", {"code": str(status)}),
            "temperature": params.get("temperature"),
            "max_completion_tokens": params.get("max_completion_tokens"),
            "top_p": params.get("top_p"),
            "seed": params.get("seed"),
        }

    async def _criterion(
        self,
        principal: Principal,
        criterion: dict[str, Any],
        item: dict[str, Any],
        sample: dict[str, Any],
        usage: dict[str, list[int]],
    ) -> dict[str, Any]:
        try:
            if criterion["type"] not in MODEL_GRADERS:
                return grade(criterion, item, sample)
            status, answer = await self._chat(principal, model_request(criterion, item, sample), usage)
        except ModelhostError as exc:  # a template past its bound
            return result(criterion, None, False, error=exc.message)
        if status != 200:
            error = answer.get("error", {}).get("message") if isinstance(answer.get("error"), dict) else None
            return result(criterion, None, False, error=error or f"The grader's call answered {status}.")
        return model_result(criterion, _text_of(answer))

    async def _chat(
        self,
        principal: Principal,
        body: dict[str, Any],
        usage: dict[str, list[int]],
        pinned: str | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """A chat completion as a batch line (on the version of `pinned`, if given): its status and
        answer, its tokens counted in `usage`."""
        status, _, raw = await self.call(principal, CHAT, body, pinned)
        try:
            answer = orjson.loads(raw)
        except orjson.JSONDecodeError:
            answer = None
        answer = answer if isinstance(answer, dict) else {}
        counts = usage.setdefault(str(body["model"]), [0, 0, 0])
        counts[0] += 1
        tokens = answer.get("usage") if status == 200 else None
        if isinstance(tokens, dict):
            counts[1] += int(tokens.get("prompt_tokens") or 0)
            counts[2] += int(tokens.get("completion_tokens") or 0)
        return status, answer


def _text_of(answer: dict[str, Any]) -> str:
    choices = answer.get("choices") or [{}]
    content = (choices[0].get("message") or {}).get("content")
    return content if isinstance(content, str) else ""


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None
