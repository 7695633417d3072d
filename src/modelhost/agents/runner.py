"""The agent runner: each run is an asyncio task in the server's supervisor (whichever of its gateway
processes accepted it), generating with the agent's model and writing every step as a stored event.

A run is never re-run: a gateway that dies leaves its runs silent, and housekeeping (on every gateway)
fails them with `interrupted` once they have been silent `MODELHOST_AGENT_RUN_STALE_SECONDS`.
Stopping a run (delete, cancel) cancels its task; closing the engine stream cancels the generation in
the worker at its next decoding step. Every event write is guarded in the database (`AgentStore`), so a
run stopped on another gateway is noticed at its next event or heartbeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any, Protocol

from modelhost import tracing
from modelhost.agents.store import AgentStore, RunJob
from modelhost.auth.limits import RateLimiter, start_counting
from modelhost.auth.quotas import PersonQuotas
from modelhost.clock import beat, heartbeat_seconds
from modelhost.config import Settings
from modelhost.errors import ModelhostError
from modelhost.frontend import Generation
from modelhost.generation.choices import ChatChoice, tool_schemas
from modelhost.generation.contract import GenerationEvent
from modelhost.protocol.chat import ChatCompletionRequest
from modelhost.store.types import utcnow

log = logging.getLogger("modelhost.agents")


class _Stopped(Exception):
    """The run is no longer this runner's to write (deleted, cancelled, taken over)."""


class Runs(Protocol):
    """What the routes use of the runner: the `AgentRunner` in the supervisor, a stand-in that asks the
    supervisor in its other gateway processes (`modelhost.server.remote`)."""

    @property
    def name(self) -> str:
        """The runner that claims the runs (`claimed_by`)."""
        ...

    async def submit(self, job: RunJob) -> None: ...
    async def stop_runs(self, run_ids: list[str]) -> None: ...


class AgentRunner:
    def __init__(
        self,
        store: AgentStore,
        generation: Generation,
        settings: Settings,
        limits: RateLimiter | None = None,
        quotas: PersonQuotas | None = None,
    ) -> None:
        self.store = store
        # the one pipeline of every front-end: a run generates as a chat completion does
        self.generation = generation
        self.settings = settings
        self.limits = limits  # where a run's tokens are counted against its key (rate limits)
        self.quotas = quotas  # and against its person's quota
        self.name = f"gw-{secrets.token_hex(6)}"  # this server's supervisor, in `claimed_by`
        self._running: dict[str, asyncio.Task[None]] = {}
        self._housekeeping: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._housekeeping = asyncio.create_task(self._recover_forever())

    async def stop(self) -> None:
        """Gateway shutdown: stop every run here; they fail `interrupted` (a run is not resumed)."""
        if self._housekeeping is not None:
            self._housekeeping.cancel()
        run_ids = list(self._running)
        await self.stop_runs(run_ids)
        for run_id in run_ids:
            await asyncio.to_thread(
                self.store.fail, run_id, self.name, "interrupted", "The server running it shut down."
            )

    async def submit(self, job: RunJob) -> None:
        self._running[job.id] = asyncio.create_task(self._run(job))

    async def stop_runs(self, run_ids: list[str]) -> None:
        """Cancel these runs' tasks on this gateway and wait until they have stopped."""
        tasks = [t for t in (self._running.get(r) for r in run_ids) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _recover_forever(self) -> None:
        stale = self.settings.agent_run_stale_seconds
        while True:
            try:
                await asyncio.to_thread(self.store.recover_stale, stale)
            except Exception:
                log.exception("agent run recovery")
            await asyncio.sleep(min(10.0, stale / 2))

    async def _run(self, job: RunJob) -> None:
        beating = asyncio.create_task(self._heartbeat(job.id))
        used = start_counting()  # the tokens it generates, taken from its key's bucket at the end
        try:
            await tracing.within(lambda: self._span(job), self._execute(job), stopped=(_Stopped,))
        except _Stopped:
            pass  # closing the stream (on the way out of `_execute`) stopped the generation
        except ModelhostError as exc:
            await asyncio.to_thread(self.store.fail, job.id, self.name, exc.code, exc.message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never leave a run in progress because of a bug here
            log.exception("agent run %s", job.id)
            await asyncio.to_thread(
                self.store.fail, job.id, self.name, "generation_error", type(exc).__name__
            )
        finally:
            beating.cancel()
            self._running.pop(job.id, None)
            if self.limits is not None and job.subjects and used[0]:
                self.limits.charge(job.subjects, used[0])
            if self.quotas is not None and job.person is not None:
                self.quotas.ended(job.person, used[0])

    @staticmethod
    def _span(job: RunJob) -> tracing.Span:
        """The run's `invoke_agent` span (GenAI semantic conventions), linked to the request that
        created the run. Current while it generates: the replica's `generate` span is its child."""
        attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": job.agent_name,
            "gen_ai.agent.id": job.agent_id,
            "gen_ai.request.model": job.model,
            "modelhost.agent_run.id": job.id,
        }
        return tracing.linked_span(f"invoke_agent {job.agent_name}", job.traceparent, attributes)

    async def _append(self, job: RunJob, type_: str, data: dict[str, Any], **values: Any) -> None:
        """Write an event; when the run is no longer ours to write (deleted, cancelled), stop here."""
        if not await asyncio.to_thread(self.store.append, job.id, self.name, type_, data, values):
            raise _Stopped

    async def _execute(self, job: RunJob) -> None:
        await self._append(job, "run.in_progress", {"status": "in_progress"}, status="in_progress")
        options = job.request
        tools = job.tools or None
        body = ChatCompletionRequest.model_validate(
            {
                "model": job.model,
                "messages": [{"role": "system", "content": job.instructions}, *options["input"]],
                "tools": tools,
                "tool_choice": options.get("tool_choice") if tools else None,
                "max_tokens": options.get("max_tokens"),
                "min_tokens": options.get("min_tokens"),
                "temperature": options.get("temperature"),
                "seed": options.get("seed"),
            }
        )
        # as a chat completion's: the deployment's defaults, the input's images, its grammar checked
        requests, mode = await self.generation.chat(body, job.target)
        names = [t["function"]["name"] for t in tools or []]
        message = RunMessage(ChatChoice(0, mode, names, tool_schemas=tool_schemas(body.tools or [])))
        streams = await self.generation.open(job.target, requests)
        async with contextlib.aclosing(streams.merged()) as events:
            async for _, event in events:
                for type_, data in message.feed(event):
                    await self._append(job, type_, data)
                if message.choice.finish is not None:
                    break
        for call in message.choice.calls:
            await self._append(job, "tool_call", dict(call))
        completed = message.completed()
        usage = completed["usage"]
        tracing.current_attributes(tracing.usage(usage["prompt_tokens"], usage["completion_tokens"]))
        await self._append(job, "message.completed", completed)
        output = {"content": completed["content"], "tool_calls": completed["tool_calls"]}
        final = "requires_action" if message.choice.calls else "completed"
        await self._append(
            job, f"run.{final}", {"status": final}, status=final, output=output, completed_at=utcnow()
        )

    async def _heartbeat(self, run_id: str) -> None:
        """Beat while the model loads or between events; a run stopped elsewhere is stopped here."""
        started = time.monotonic()
        while True:
            await asyncio.sleep(heartbeat_seconds(self.settings.agent_run_stale_seconds))
            if not await beat(lambda: self.store.beat(run_id, self.name)):
                log.debug("run %s stopped elsewhere after %.1fs", run_id, time.monotonic() - started)
                task = self._running.get(run_id)
                if task is not None:
                    task.cancel()
                return


@dataclass
class RunMessage:
    """A run's assistant message assembled from the engine's events by the one chat assembler
    (`ChatChoice`), as the run's events: `reasoning.delta` for its reasoning (a reasoning model's
    thinking, kept apart from the answer as chat completions keep it), `message.delta` for its text, and
    `message.completed` with the usage a chat completion reports (cached prompt tokens, reasoning
    tokens)."""

    choice: ChatChoice

    def feed(self, event: GenerationEvent) -> list[tuple[str, dict[str, Any]]]:
        delta = self.choice.feed(event)
        events: list[tuple[str, dict[str, Any]]] = []
        if delta.get("reasoning_content"):
            events.append(("reasoning.delta", {"reasoning": delta["reasoning_content"]}))
        if delta.get("content"):
            events.append(("message.delta", {"content": delta["content"]}))
        return events

    def completed(self) -> dict[str, Any]:
        """`message.completed`'s data."""
        choice = self.choice
        message = choice.message()
        completed: dict[str, Any] = {
            "role": "assistant",
            "content": message.get("content"),
            "tool_calls": choice.calls,
            "finish_reason": choice.finish_reason,
            "usage": {
                "prompt_tokens": choice.prompt_tokens,
                "completion_tokens": choice.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": choice.cached_tokens},
                "completion_tokens_details": {"reasoning_tokens": choice.reasoning_tokens},
            },
        }
        if choice.reasoner is not None:
            completed["reasoning"] = choice.reasoning or None
        return completed
