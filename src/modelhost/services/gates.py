"""Gated rollouts (docs/deploy.md, "Gated rollouts"): the rule a candidate version must hold to be
promoted, as pure functions of what was measured. The gate runner (`services.gate_runner`) measures and
acts; nothing here reads a clock, a database or a metric.

A gated rollout goes `evaluating` (the candidate loads beside the current version at 0 % traffic, and the
gate's eval runs on both) → `promoting` (one step of the gate's `steps` at a time: the candidate takes
that percent for `step_seconds`, then its live error rate and TTFT p50 over the step are judged) →
`promoted` (it took 100 %) or `rolled_back` (the rule failed: the current version takes every request
again, the reason recorded). A manual rollout meanwhile ends it as `canceled`.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

ACTIVE = ("evaluating", "promoting")  # a runner drives it
Outcome = Literal["pass", "fail", "wait"]
DEFAULT_STEPS = (10, 50, 100)
# A step without its `min_requests` waits for them up to this many times its length, then fails
MAX_WAIT_STEPS = 10


@dataclass(frozen=True, slots=True)
class Gate:
    """What a rollout's gate asks (the PATCH's `gate`; `protocol.management.RolloutGate` says each)."""

    eval_id: str
    margin: float = 0.0
    steps: tuple[int, ...] = DEFAULT_STEPS
    step_seconds: float = 60.0
    min_requests: int = 0
    max_error_rate: float | None = 0.05
    max_ttft_p50_ms: float | None = None

    @classmethod
    def of(cls, stored: Mapping[str, Any]) -> Gate:
        return cls(**{**stored, "steps": tuple(stored.get("steps") or DEFAULT_STEPS)})

    def stored(self) -> dict[str, Any]:
        return {
            "eval_id": self.eval_id,
            "margin": self.margin,
            "steps": list(self.steps),
            "step_seconds": self.step_seconds,
            "min_requests": self.min_requests,
            "max_error_rate": self.max_error_rate,
            "max_ttft_p50_ms": self.max_ttft_p50_ms,
        }


@dataclass(frozen=True, slots=True)
class Verdict:
    outcome: Outcome
    reason: str


@dataclass(frozen=True, slots=True)
class StepMetrics:
    """The candidate's requests over a step: how many, how many answered 5xx, and its time to first
    token's median (ms; None: no generation started)."""

    requests: int
    errors: int
    ttft_p50_ms: float | None

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def shown(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "errors": self.errors,
            "error_rate": round(self.error_rate, 4),
            "ttft_p50_ms": None if self.ttft_p50_ms is None else round(self.ttft_p50_ms, 1),
        }


def score(pass_rates: Mapping[str, float]) -> float | None:
    """A version's score on the gate's eval: the mean of its testing criteria's pass rates (None: the run
    graded nothing)."""
    return sum(pass_rates.values()) / len(pass_rates) if pass_rates else None


def judge_scores(gate: Gate, candidate: float | None, current: float | None) -> Verdict:
    """The candidate passes its eval when its score is at least the current version's less the margin."""
    if candidate is None or current is None:
        which = "candidate" if candidate is None else "current version"
        return Verdict("fail", f"The eval run of the {which} graded nothing: no score to compare.")
    needed = current - gate.margin
    if candidate + 1e-9 >= needed:
        return Verdict(
            "pass", f"The candidate scored {candidate:.3f} against {current:.3f} (margin {gate.margin})."
        )
    return Verdict(
        "fail",
        f"The candidate scored {candidate:.3f}, below the current version's {current:.3f} less the "
        f"margin {gate.margin} ({needed:.3f}).",
    )


def judge_step(gate: Gate, measured: StepMetrics, elapsed: float) -> Verdict:
    """At a step's end (`elapsed` seconds since it began): the candidate's live error rate and TTFT p50
    over the step within the gate's bounds. Fewer requests than `min_requests`: the step waits for them,
    up to `MAX_WAIT_STEPS` times its length, then fails."""
    if elapsed < gate.step_seconds:
        return Verdict("wait", "The step is still running.")
    if measured.requests < gate.min_requests:
        if elapsed < gate.step_seconds * MAX_WAIT_STEPS:
            return Verdict("wait", "The step waits for its minimum of requests.")
        return Verdict(
            "fail",
            f"The candidate served {measured.requests} requests in {elapsed:.0f} s, fewer than the gate's "
            f"min_requests ({gate.min_requests}).",
        )
    if gate.max_error_rate is not None and measured.error_rate > gate.max_error_rate:
        return Verdict(
            "fail",
            f"The candidate's error rate was {measured.error_rate:.3f} ({measured.errors} of "
            f"{measured.requests} requests), above max_error_rate {gate.max_error_rate}.",
        )
    p50 = measured.ttft_p50_ms
    if gate.max_ttft_p50_ms is not None and p50 is not None and p50 > gate.max_ttft_p50_ms:
        return Verdict(
            "fail",
            f"The candidate's time to first token p50 was {p50:.0f} ms, above max_ttft_p50_ms "
            f"{gate.max_ttft_p50_ms:g}.",
        )
    return Verdict(
        "pass",
        f"{measured.requests} requests, error rate {measured.error_rate:.3f}"
        + ("" if p50 is None else f", TTFT p50 {p50:.0f} ms")
        + ": within the gate's bounds.",
    )


def next_step(gate: Gate, step: int | None) -> int | None:
    """The index of the step after `step` (None: before the first), None after the last."""
    following = 0 if step is None else step + 1
    return following if following < len(gate.steps) else None


def quantile(bounds: Sequence[float], counts: Sequence[float], q: float) -> float | None:
    """The `q` quantile of a histogram's observations: `counts[i]` fell at or below `bounds[i]` and above
    the bound before (not cumulative; the last bound may be inf), interpolated within its bucket as
    Prometheus' `histogram_quantile` does. None: nothing observed."""
    total = sum(counts)
    if total <= 0:
        return None
    cumulative = []
    running = 0.0
    for count in counts:
        running += count
        cumulative.append(running)
    rank = q * total
    index = bisect.bisect_left(cumulative, rank)
    index = min(index, len(bounds) - 1)
    upper = bounds[index]
    lower = bounds[index - 1] if index > 0 else 0.0
    if upper == float("inf"):
        return lower
    below = cumulative[index - 1] if index > 0 else 0.0
    inside = counts[index]
    return lower + (upper - lower) * ((rank - below) / inside if inside else 1.0)
