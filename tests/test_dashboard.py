"""The Grafana dashboard (deploy/grafana/modelhost.json, docs/operations.md) names only metrics modelhost
serves: a renamed metric would leave an empty panel that nobody notices."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import prometheus_client

DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "modelhost.json"
METRIC = re.compile(r"\b(?:modelhost|gen_ai)_[a-z_]+\b")
# every module that registers a metric (the app imports the rest)
METRIC_MODULES = ("modelhost.api.app", "modelhost.billing.meter", "modelhost.runtime.metrics")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def served_names() -> set[str]:
    """Every series name the registered metrics expose (a counter's `_total`, a histogram's buckets)."""
    for module in METRIC_MODULES:
        importlib.import_module(module)
    names: set[str] = set()
    for family in prometheus_client.REGISTRY.collect():
        names |= {family.name + suffix for suffix in SUFFIXES.get(family.type, ("",))}
    return names


def expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    found = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    found += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return found


def test_every_metric_the_dashboard_plots_is_one_modelhost_serves() -> None:
    named = {name for expression in expressions() for name in METRIC.findall(expression)}
    assert len(named) >= 12
    assert named - served_names() == set()


def test_the_check_catches_a_metric_that_does_not_exist() -> None:
    assert "modelhost_made_up_total" not in served_names()
    assert "modelhost_queue_depth" in served_names()
