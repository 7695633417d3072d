"""The gate runner: the supervisor's loop that drives gated rollouts (docs/deploy.md, "Gated rollouts").

It claims a deployment whose gate is deciding (`gated.RolloutGates.claim`: one server drives a gate; one
silent for `batch_stale_seconds` is taken over, by another server or this one restarted, from the state
the row keeps), then every `rollout_gate_poll_seconds`: while `evaluating`, waits for the candidate's load
and runs the gate's eval on both versions (`EvalService.evaluate`, each run pinned to its version, as the
key that started the rollout); while `promoting`, judges the step at its end from the candidate's own
metrics since the step began (`modelhost_version_requests_total`, 5xx / all; the p50 of
`modelhost_version_time_to_first_token_seconds`). `gates` decides; each decision is one transaction.

The metrics are every server's: each server's gate runner publishes its own counts of each candidate
being judged at every turn (`RolloutGates.publish`, its processes' added up), and the server driving a
gate adds up every server's since the step began (`since_on_servers`), its own read live.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from modelhost import metrics
from modelhost.auth.principal import Principal
from modelhost.claims import ClaimLoop
from modelhost.config import Settings
from modelhost.errors import ModelhostError
from modelhost.evals.service import EvalService, Scores
from modelhost.services import gates
from modelhost.services.gated import ClaimedGate, RolloutGates, decision
from modelhost.services.gates import Gate, StepMetrics

log = logging.getLogger(__name__)

REQUESTS = "modelhost_version_requests_total"
TTFT_BUCKETS = "modelhost_version_time_to_first_token_seconds_bucket"


def measure(deployment_id: str, artifact_id: str) -> dict[str, Any]:
    """The version's counts so far (this server's): requests, 5xx answers, and its time-to-first-token
    histogram's cumulative buckets (upper bound → count)."""
    requests = errors = 0.0
    for labels, value in metrics.samples(REQUESTS):
        if labels.get("deployment") == deployment_id and labels.get("artifact_id") == artifact_id:
            requests += value
            errors += value if labels.get("status", "").startswith("5") else 0.0
    buckets: dict[str, float] = {}
    for labels, value in metrics.samples(TTFT_BUCKETS):
        if labels.get("deployment") == deployment_id and labels.get("artifact_id") == artifact_id:
            buckets[labels["le"]] = buckets.get(labels["le"], 0.0) + value
    return {"requests": requests, "errors": errors, "ttft": buckets}


EMPTY: dict[str, Any] = {"requests": 0.0, "errors": 0.0, "ttft": {}}


def since_on_servers(baseline: dict[str, dict[str, Any]], now: dict[str, dict[str, Any]]) -> StepMetrics:
    """What the version did on every server between two readings (server → `measure`): per server, its
    counts less its baseline, added up. A server without a baseline (it began serving the version, or
    restarted: its runner has a new name) counts all it has; one whose count went down restarted too."""
    total: dict[str, Any] = {"requests": 0.0, "errors": 0.0, "ttft": {}}
    for server, counts in now.items():
        base = baseline.get(server) or EMPTY
        if counts["requests"] < base["requests"]:
            base = EMPTY
        total["requests"] += counts["requests"] - base["requests"]
        total["errors"] += counts["errors"] - base["errors"]
        for bound, count in counts["ttft"].items():
            total["ttft"][bound] = total["ttft"].get(bound, 0.0) + count - base["ttft"].get(bound, 0.0)
    return since(EMPTY, total)


def since(baseline: dict[str, Any], now: dict[str, Any]) -> StepMetrics:
    """What the version did between two `measure`s: its requests, errors and TTFT p50 (ms)."""
    bounds = sorted(now["ttft"], key=float)
    cumulative = [now["ttft"][b] - baseline["ttft"].get(b, 0.0) for b in bounds]
    counts = [c - (cumulative[i - 1] if i else 0.0) for i, c in enumerate(cumulative)]
    p50 = gates.quantile([float(b) for b in bounds], counts, 0.5)
    return StepMetrics(
        int(now["requests"] - baseline["requests"]),
        int(now["errors"] - baseline["errors"]),
        None if p50 is None else p50 * 1000,
    )


def _seconds_since(iso: str) -> float:
    started = datetime.strptime(iso, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    return (datetime.now(UTC) - started).total_seconds()


class GateRunner(ClaimLoop[ClaimedGate]):
    what = "gated rollout"

    def __init__(
        self,
        store: RolloutGates,
        evals: EvalService,
        settings: Settings,
        principal_of: Callable[[str], Principal | None],
        apply: Callable[[str], Awaitable[None]],
        wake_evals: Callable[[], None],
    ) -> None:
        super().__init__(log)
        self.store = store
        self.evals = evals
        self.settings = settings
        self.principal_of = principal_of
        self.apply = apply  # the runtime acts on a deployment's new versions
        self.wake_evals = wake_evals  # the eval runner claims a run queued here at once

    def concurrency(self) -> int:
        return 64  # a gate mostly waits

    def poll_seconds(self) -> float:
        return self.settings.rollout_gate_poll_seconds

    def claim(self) -> ClaimedGate | None:
        return self.store.claim(self.name, self.settings.batch_stale_seconds)

    async def turn(self) -> None:
        """This server's counts of every candidate being judged, for whichever server drives its gate."""
        await asyncio.to_thread(self._publish)

    def _publish(self) -> None:
        for deployment_id, candidate in self.store.promoting():
            self.store.publish(self.name, deployment_id, candidate, measure(deployment_id, candidate))

    def _figures(self, deployment_id: str, candidate: str) -> dict[str, dict[str, Any]]:
        """Every server's counts of the candidate, this one's read now."""
        return {**self.store.figures(deployment_id, candidate), self.name: measure(deployment_id, candidate)}

    def release(self, claim_id: str) -> None:
        self.store.release(claim_id, self.name)

    async def run(self, claimed: ClaimedGate) -> None:
        beating = asyncio.create_task(self._beat(claimed, asyncio.current_task()))
        try:
            while await asyncio.to_thread(self.store.beat, claimed, self.name):
                read = await asyncio.to_thread(self.store.read, claimed)
                if read is None:
                    break
                await self._turn(claimed, *read)
                await asyncio.sleep(self.poll_seconds())
        finally:
            beating.cancel()
        await asyncio.to_thread(self.store.release, claimed.id, self.name)

    async def _beat(self, claimed: ClaimedGate, work: asyncio.Task[Any] | None) -> None:
        """While an eval runs for long: keep the claim, and stop the work once the gate is not ours."""
        while True:
            await asyncio.sleep(self.settings.batch_stale_seconds / 3)
            if not await asyncio.to_thread(self.store.beat, claimed, self.name) and work is not None:
                work.cancel()
                return

    async def _decide(self, claimed: ClaimedGate, entry: dict[str, Any], **changes: Any) -> None:
        decided = await asyncio.to_thread(self.store.decide, claimed, self.name, entry, **changes)
        if decided and "traffic" in changes:
            await self.apply(claimed.id)

    async def _turn(
        self, claimed: ClaimedGate, rollout: dict[str, Any], states: dict[str, str], model: str
    ) -> None:
        gate = Gate.of(rollout["gate"])
        candidate, current = rollout["candidate"], rollout["current"]
        step = rollout["step"]
        loading = states.get(candidate, "gone")
        if loading.startswith("failed") or loading in ("gone", "draining"):
            why = f"The candidate did not load ({loading})."
            await self._roll_back(claimed, step, why, current)
            return
        if rollout["state"] == "evaluating":
            if loading.startswith("active"):
                await self._evaluate(claimed, rollout, gate, model)
            return
        if step is None:  # passed its eval: the first step
            await self._step(claimed, gate, rollout, 0, "The eval passed: the first step.")
            return
        now = await asyncio.to_thread(self._figures, claimed.id, candidate)
        measured = since_on_servers(rollout["baseline"].get("servers", {}), now)
        verdict = gates.judge_step(gate, measured, _seconds_since(rollout["step_started_at"]))
        if verdict.outcome == "wait":
            return
        if verdict.outcome == "fail":
            await self._roll_back(claimed, step, verdict.reason, current, metrics=measured.shown())
            return
        following = gates.next_step(gate, step)
        assert following is not None  # the last step (100) promotes without a wait
        await self._step(claimed, gate, rollout, following, verdict.reason, measured.shown())

    async def _step(
        self,
        claimed: ClaimedGate,
        gate: Gate,
        rollout: dict[str, Any],
        index: int,
        reason: str,
        measured: dict[str, Any] | None = None,
    ) -> None:
        """The candidate takes the step's percent; at 100 it is promoted (the current version drains)."""
        candidate, current = rollout["candidate"], rollout["current"]
        percent = gate.steps[index]
        figures = {} if measured is None else {"metrics": measured}
        if percent >= 100:
            entry = decision(index, "promoted", f"{reason} The candidate takes every request.", **figures)
            await self._decide(claimed, entry, traffic={candidate: 100}, state="promoted", step=index)
            return
        entry = decision(index, "promoted_step", f"{reason} The candidate takes {percent} %.", **figures)
        baseline = {"servers": await asyncio.to_thread(self._figures, claimed.id, candidate)}
        await self._decide(
            claimed,
            entry,
            traffic={current: 100 - percent, candidate: percent},
            step=index,
            step_started_at=entry["at"],
            baseline=baseline,
        )

    async def _roll_back(
        self, claimed: ClaimedGate, step: int | None, reason: str, current: str, **figures: Any
    ) -> None:
        entry = decision(step, "rolled_back", reason, **figures)
        runs = {"eval_runs": figures["eval_runs"]} if "eval_runs" in figures else {}
        await self._decide(claimed, entry, traffic={current: 100}, state="rolled_back", **runs)

    async def _evaluate(self, claimed: ClaimedGate, rollout: dict[str, Any], gate: Gate, model: str) -> None:
        """Both versions run the gate's eval (its latest `completions` run's data source); the candidate
        passes at the current version's score less the margin."""
        current = rollout["current"]
        principal = await asyncio.to_thread(self.principal_of, rollout.get("key_id") or "")
        if principal is None:
            why = (
                "The eval cannot run: the API key that started the gated rollout is revoked or expired (or "
                "it was a console sign-in session, which runs nothing once its request ends)."
            )
            await self._roll_back(claimed, None, why, current)
            return
        try:
            ran = await asyncio.gather(
                self._scores(principal, gate, model, rollout["candidate"]),
                self._scores(principal, gate, model, current),
            )
        except ModelhostError as exc:
            await self._roll_back(claimed, None, f"The gate's eval could not run: {exc.message}", current)
            return
        candidate, serving = ran
        runs = {"candidate": candidate.run_id, "current": serving.run_id}
        for which, scores in (("candidate", candidate), ("current version", serving)):
            if scores.status != "completed":
                why = f"The eval run of the {which} ended {scores.status}."
                await self._roll_back(claimed, None, why, current, eval_runs=runs)
                return
        ours, theirs = gates.score(candidate.pass_rates), gates.score(serving.pass_rates)
        verdict = gates.judge_scores(gate, ours, theirs)
        shown = {
            "candidate": ours,
            "current": theirs,
            "candidate_pass_rates": candidate.pass_rates,
            "current_pass_rates": serving.pass_rates,
        }
        if verdict.outcome == "fail":
            await self._roll_back(claimed, None, verdict.reason, current, scores=shown, eval_runs=runs)
            return
        entry = decision(None, "gate_passed", verdict.reason, scores=shown, eval_runs=runs)
        await self._decide(claimed, entry, state="promoting", eval_runs=runs)

    async def _scores(self, principal: Principal, gate: Gate, model: str, artifact_id: str) -> Scores:
        timeout = self.settings.rollout_gate_eval_timeout_seconds
        return await self.evals.evaluate(
            principal, gate.eval_id, model, artifact_id, timeout=timeout, created=self.wake_evals
        )
