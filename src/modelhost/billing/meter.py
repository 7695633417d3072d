"""This gateway's compute meters: one per replica it loads, ticked with the replica's measured memory.

A replica this gateway alone runs (a local worker) has a meter of its own. One that gateways share (a
Ray Serve application) has one meter for all of them: each gateway using it ticks it, the first tick
of a period bills it, and only unloading the application (not a gateway's exit) closes it.

The runtime reports `replica_started` before a replica starts loading and `replica_stopped` before
(or, for a replica that died, after) it goes away; `tick` bills every open meter up to now. All
writes of this gateway's meters are serialized by one lock; the ledger's guarded updates keep other
gateways' writes from double billing.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Protocol

from modelhost.billing.ledger import Billed, ComputeReading, Ledger
from modelhost.billing.rates import MICRO
from modelhost.clock import Clock
from modelhost.metrics import Counter
from modelhost.runtime.replica import ReplicaStats
from modelhost.runtime.spec import DeploymentSpec

CREDITS_BILLED = Counter(
    "modelhost_credits_billed_total",
    "Credits billed by this gateway, by account and kind (compute, storage).",
    ["account", "kind"],
)


class Measured(Protocol):
    """What the meter reads of a replica: its memory (the footprint `runtime.memory` measures)."""

    def stats(self) -> ReplicaStats: ...
    @property
    def shared_meter(self) -> str | None: ...


@dataclass(slots=True)
class _OpenMeter:
    meter_id: str
    replica: Measured


def count(billed: list[Billed]) -> None:
    """Add what was billed to the Prometheus counters."""
    for entry in billed:
        if entry.amount_micro:
            CREDITS_BILLED.labels(entry.account_id, entry.kind).inc(entry.amount_micro / MICRO)


class ComputeMeter:
    def __init__(self, ledger: Ledger, clock: Clock, owner: str) -> None:
        self._ledger = ledger
        self._clock = clock
        self.owner = owner  # this gateway process
        self._open: dict[int, _OpenMeter] = {}
        self._lock = threading.Lock()

    def replica_started(self, replica: Measured, spec: DeploymentSpec) -> None:
        with self._lock:
            meter_id = self._ledger.open_compute(
                owner=self.owner,
                account_id=spec.account_id,
                deployment_id=spec.id,
                model=spec.model,
                artifact_id=spec.artifact_id,
                now_ms=self._clock.now_ms(),
                shared=replica.shared_meter,
            )
            self._open[id(replica)] = _OpenMeter(meter_id, replica)

    def replica_stopped(self, replica: Measured, *, close: bool = True) -> list[Billed]:
        """Bill the replica's last period and close its meter (measured now if it still runs). Without
        `close`, this gateway only stops ticking it: other gateways bill a shared replica from here."""
        with self._lock:
            meter = self._open.pop(id(replica), None)
            if meter is None:
                return []
            billed = self._ledger.bill_compute([self._reading(meter)], close=close)
        count(billed)
        return billed

    def tick(self) -> list[Billed]:
        with self._lock:
            billed = self._ledger.bill_compute([self._reading(m) for m in self._open.values()])
        count(billed)
        return billed

    @property
    def open_meters(self) -> int:
        return len(self._open)

    def _reading(self, meter: _OpenMeter) -> ComputeReading:
        """Memory measured now; a replica with processes but no reading (its process just died, or it
        runs on another node) is billed at its last reading; one with no process at all costs nothing."""
        stats = meter.replica.stats()
        measured = stats.memory_bytes or (None if stats.processes else 0)
        return ComputeReading(meter.meter_id, self._clock.now_ms(), measured, stats.processes)
