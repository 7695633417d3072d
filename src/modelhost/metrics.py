"""Prometheus metrics of a whole server, whichever of its processes records them.

A server is several processes: the supervisor, its other gateway processes, and one process per local
replica. Each records its own metrics (a replica its batch sizes, a gateway its requests) and `/metrics`
on any gateway process shows the whole server: prometheus_client's multiprocess mode. Every process
writes its values into files in one folder (`PROMETHEUS_MULTIPROC_DIR`) and a scrape adds them up;
gauges say how (`livesum`: the sum over processes still alive).

prometheus_client reads the variable when it is first imported, so the folder is chosen before that:
`modelhost serve` makes a fresh one in its run folder (`modelhost.server`); any other first modelhost
process of a process tree (a test session, an embedding application) makes a temporary one here,
removed when that process exits. Processes it starts inherit the variable, so they write there too.

Always import the metric classes from here, never from prometheus_client directly.
"""

from __future__ import annotations

import asyncio
import atexit
import bisect
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

FOLDER_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"


def _choose_folder() -> None:
    if os.environ.get(FOLDER_VARIABLE) or "prometheus_client" in sys.modules:
        return  # chosen by a parent, or too late: this process keeps its metrics to itself
    folder = tempfile.mkdtemp(prefix="modelhost-metrics-")
    os.environ[FOLDER_VARIABLE] = folder
    atexit.register(shutil.rmtree, folder, True)


_choose_folder()

from prometheus_client import (  # noqa: E402  (after the folder is chosen)
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.metrics_core import Metric  # noqa: E402

__all__ = [
    "CONTENT_TYPE_LATEST",
    "TALLY",
    "Counter",
    "Gauge",
    "Histogram",
    "Tally",
    "exposition",
    "process_gone",
    "sample",
    "samples",
]


def _shared() -> bool:
    return bool(os.environ.get(FOLDER_VARIABLE))


def _registry() -> CollectorRegistry:
    if not _shared():
        return REGISTRY
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    return registry


TENANT_LABEL = "account"  # series labelled with it name an account: shown only with a key (/metrics)


def exposition(tenants: bool = True) -> bytes:
    """The text format of every process's metrics, added up; without the series labelled with account
    IDs unless `tenants` (what `/metrics` shows a caller without the admin or metrics key)."""
    TALLY.flush()
    registry = _registry()
    return generate_latest(registry if tenants else _WithoutTenants(registry))


class _WithoutTenants:
    """A registry's families less their samples labelled with an account."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            samples = [s for s in family.samples if TENANT_LABEL not in s.labels]
            if samples:
                kept = Metric(family.name, family.documentation, family.type, family.unit)
                kept.samples = samples
                yield kept


def sample(name: str, labels: dict[str, str] | None = None) -> float | None:
    """One sample's value across all processes (None when nobody recorded it); for tests and tools."""
    TALLY.flush()
    value = _registry().get_sample_value(name, labels or {})
    return None if value is None else float(value)


def samples(name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample named `name` (a histogram's `..._bucket` included), across all processes, with its
    labels: a scrape's worth of reading, for the few that read a metric back (a gated rollout's step)."""
    TALLY.flush()
    return [
        (dict(s.labels), float(s.value))
        for family in _registry().collect()
        for s in family.samples
        if s.name == name
    ]


def process_gone(pid: int | None) -> None:
    """A process of the server exited: its `live*` gauges stop counting (counters keep their totals)."""
    if pid is not None and _shared():
        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


FLUSH_SECONDS = 0.05


class Tally:
    """Counts, observations and levels made on every request, kept in this process and written to the
    metrics at most every `FLUSH_SECONDS` (and before this process's own scrape, and at its exit).

    Each write of a metric takes a lock and packs a value into a memory-mapped file, and `labels` looks
    its child up with checks each time: the six writes and four lookups of every HTTP request cost a
    gateway about 20 µs of CPU (issue 71), and a gauge of requests in flight written at each change
    about 5 %. Written together, they cost that once per flush. A scrape of another process sees them
    within `FLUSH_SECONDS`; a process killed outright loses at most that. A process at rest wakes for
    nothing: a change schedules the one flush.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[Counter, tuple[str, ...]], float] = {}
        self._observed: dict[tuple[Histogram, tuple[str, ...]], list[float]] = {}
        self._levels: dict[tuple[Gauge, tuple[str, ...]], float] = {}
        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}
        self._due_on: asyncio.AbstractEventLoop | None = None

    def count(self, counter: Counter, labels: tuple[str, ...], amount: float = 1.0) -> None:
        key = (counter, labels)
        with self._lock:
            self._counts[key] = self._counts.get(key, 0.0) + amount
        self._due()

    def observe(self, histogram: Histogram, labels: tuple[str, ...], value: float) -> None:
        key = (histogram, labels)
        with self._lock:
            found = self._observed.get(key)
            if found is None:
                self._observed[key] = [value]
            else:
                found.append(value)
        self._due()

    def set(self, gauge: Gauge, labels: tuple[str, ...], value: float) -> None:
        """The gauge's level from now on (the last one set before a flush is the one written)."""
        with self._lock:
            self._levels[(gauge, labels)] = value
        self._due()

    def _due(self) -> None:
        """A flush `FLUSH_SECONDS` from now on this thread's event loop, unless one is due (on any loop:
        a flush writes what every thread added). One due on a loop that has since closed never runs:
        the next count schedules its own."""
        due = self._due_on
        if due is not None and not due.is_closed():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        self._due_on = loop
        loop.call_later(FLUSH_SECONDS, self.flush)

    def flush(self) -> None:
        with self._lock:
            counts, self._counts = self._counts, {}
            observed, self._observed = self._observed, {}
            levels, self._levels = self._levels, {}
            self._due_on = None
        for (counter, labels), amount in counts.items():
            self._child(counter, labels).inc(amount)
        for (histogram, labels), values in observed.items():
            observe_all(self._child(histogram, labels), values)
        for (gauge, labels), value in levels.items():
            self._child(gauge, labels).set(value)

    def _child(self, metric: Any, labels: tuple[str, ...]) -> Any:
        key = (metric, labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child


def observe_all(child: Any, values: list[float]) -> None:
    """`child.observe(v)` for each value, with one write per bucket and one for the sum: prometheus_client
    (0.2x) writes both for every value. Its histogram's own fields are read where present; a version
    without them gets each value observed."""
    bounds: list[float] | None = getattr(child, "_upper_bounds", None)
    buckets: list[Any] | None = getattr(child, "_buckets", None)
    total: Any = getattr(child, "_sum", None)
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        for value in values:
            child.observe(value)
        return
    counts = [0] * len(bounds)
    for value in values:
        counts[bisect.bisect_left(bounds, value)] += 1  # the first bucket whose bound holds it
    for index, count in enumerate(counts):
        if count:
            buckets[index].inc(count)
    total.inc(sum(values))


# the process's one tally: the request metrics (`api.middleware`), the gateway's requests in flight
# (`runtime.gateway.dispatch`)
TALLY = Tally()
atexit.register(TALLY.flush)  # what the process counted last goes out with it
