"""Autoscaling of the local backend (docs/runtime.md, "Autoscaling (local backend)"): when a deployment
gets another replica, and when one goes.

`ScalingPolicy` decides from samples alone (no clock, no replicas, no I/O), one per deployment version,
so the rule is tested in plain Python; the manager samples each deployment every
`MODELHOST_AUTOSCALE_INTERVAL_SECONDS` and carries the decision out (the budget's say included).

Load is what the replicas hold, not only what waits in a queue: a continuous-batching engine takes
every sequence at once, so its queue stays empty while each request slows the others down. A
deployment is loaded when, averaged over the window, the requests in flight per replica are above the
target, or its time to first token is above its bound.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Sample:
    """One look at a deployment: at `at` (monotonic seconds) its replicas held `in_flight` requests and
    sequences for every gateway process; `first_token` is the mean time to first token of the
    generations that began streaming since the last sample (None: none did)."""

    at: float
    in_flight: int
    first_token: float | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """The replicas the deployment should have, and why."""

    desired: int
    reason: str


class ScalingPolicy:
    """Decides a deployment's replica count between `max(1, min_replicas)` and `max_replicas` from its
    samples over the window (see the module docstring):
    - **up** by one when, over a whole window, the requests in flight averaged above `target` per replica
      or the time to first token above `ttft_seconds`;
    - **down** by one once the load would have fit in one fewer replica (at most `target` per replica,
      first tokens in time) for `idle_seconds` without a break;
    - at once to the bounds when the replicas are outside them (a PATCH moved them).
    After every change the window starts again, so each step is judged on the new count."""

    def __init__(self, target: float, ttft_seconds: float, window: float, idle_seconds: float) -> None:
        self.target = target
        self.ttft_seconds = ttft_seconds
        self.window = window
        self.idle_seconds = idle_seconds
        self._samples: deque[Sample] = deque()
        self._since: float | None = None  # when the window (re)started
        self._fits_fewer_since: float | None = None

    def reset(self, now: float) -> None:
        """The replica count changed (or the deployment loaded): judge it afresh from `now`."""
        self._samples.clear()
        self._since = now
        self._fits_fewer_since = None

    def observe(self, sample: Sample, replicas: int, floor: int, ceiling: int) -> Decision:
        """Take `sample` of a deployment running `replicas` (bounds `floor`..`ceiling`) and decide."""
        if self._since is None:
            self._since = sample.at
        self._samples.append(sample)
        while self._samples and self._samples[0].at < sample.at - self.window:
            self._samples.popleft()
        ceiling = max(floor, ceiling)
        if replicas < floor:
            return Decision(floor, f"below min_replicas ({floor})")
        if replicas > ceiling:
            return Decision(ceiling, f"above max_replicas ({ceiling})")
        in_flight = sum(s.in_flight for s in self._samples) / len(self._samples)
        timed = [s.first_token for s in self._samples if s.first_token is not None]
        first_token = sum(timed) / len(timed) if timed else None
        per_replica = in_flight / max(1, replicas)
        slow = first_token is not None and first_token > self.ttft_seconds
        whole_window = sample.at - self._since >= self.window
        if whole_window and replicas < ceiling and (per_replica > self.target or slow):
            if per_replica > self.target:
                why = (
                    f"{per_replica:.1f} requests in flight per replica over {self.window:g} s, "
                    f"above the target of {self.target:g}"
                )
            else:
                why = (
                    f"time to first token {first_token:.2f} s over {self.window:g} s, above "
                    f"{self.ttft_seconds:g} s"
                )
            return Decision(replicas + 1, why)
        fits_fewer = replicas > floor and not slow and in_flight <= self.target * (replicas - 1)
        if not fits_fewer:
            self._fits_fewer_since = None
            return Decision(replicas, "")
        if self._fits_fewer_since is None:
            self._fits_fewer_since = sample.at
        if sample.at - self._fits_fewer_since >= self.idle_seconds:
            return Decision(
                replicas - 1,
                f"the load ({in_flight:.1f} requests in flight) fitted in {replicas - 1} "
                f"replica{'s' if replicas > 2 else ''} for {self.idle_seconds:g} s",
            )
        return Decision(replicas, "")
