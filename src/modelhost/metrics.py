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

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator

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

__all__ = ["CONTENT_TYPE_LATEST", "Counter", "Gauge", "Histogram", "exposition", "process_gone", "sample"]


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
    value = _registry().get_sample_value(name, labels or {})
    return None if value is None else float(value)


def process_gone(pid: int | None) -> None:
    """A process of the server exited: its `live*` gauges stop counting (counters keep their totals)."""
    if pid is not None and _shared():
        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]
