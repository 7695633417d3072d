"""The benchmarks' records (`bench.common.record`) and their comparison from run to run (`bench.compare`):
no server, no model; the machine's description is stood in for (it imports torch)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from bench import common, compare
from bench.common import Figures

MACHINE = {
    "description": "x86_64, 2 cores, torch 0 (CPU)",
    "cpu": "Test CPU",
    "kind": "Test CPU, 2 cores, no GPU",
}
OTHER_MACHINE = {**MACHINE, "cpu": "Other CPU", "kind": "Other CPU, 2 cores, no GPU"}


@pytest.fixture(autouse=True)
def _machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "machine_record", lambda: dict(MACHINE))


def _figures(ratio: float, benchmark: str = "gateway") -> Figures:
    figures = Figures(benchmark)
    figures.add("workers_1.gateway_ms_per_request", 0.21)
    figures.ratio("workers_2_over_1", ratio)
    return figures


def _record(benchmark: str, ratio: float, machine: dict[str, str] = MACHINE) -> dict[str, Any]:
    """A record as `common.record` writes it, with only what the comparison reads varied."""
    name = f"{benchmark}.workers_2_over_1"
    return {
        "benchmark": benchmark,
        "commit": "0" * 40,
        "dirty": False,
        "time": "2026-11-26T00:00:00Z",
        "machine": machine,
        "argv": [],
        "figures": {name: ratio, f"{benchmark}.workers_1.requests_per_second": 3000.0},
        "ratios": [name],
    }


def test_record_appends_a_line_with_the_commit(tmp_path: Path) -> None:
    path = tmp_path / "benchmarks.jsonl"
    common.record(path, _figures(1.06))
    figures = _figures(1.10)
    figures.add("not_measured", float("nan"))
    common.record(path, figures)

    lines = path.read_text().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert first["benchmark"] == "gateway"
    assert first["commit"] == head
    assert isinstance(first["dirty"], bool)
    assert first["time"].endswith("Z") and first["time"][:4].isdigit()
    assert first["machine"] == MACHINE
    assert isinstance(first["argv"], list)
    assert first["figures"] == {
        "gateway.workers_1.gateway_ms_per_request": 0.21,
        "gateway.workers_2_over_1": 1.06,
    }
    assert first["ratios"] == ["gateway.workers_2_over_1"]
    assert second["figures"]["gateway.workers_2_over_1"] == 1.10
    assert "gateway.not_measured" not in second["figures"]  # NaN is not JSON: left out


def test_write_section_records_beside_the_report_and_prints_the_comparison(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "report.md"
    common.write_section(report, "## Gateway:", "## Gateway: first\n", _figures(1.0))
    common.write_section(report, "## Gateway:", "## Gateway: second\n", _figures(1.2))

    assert "## Gateway: second" in report.read_text() and "first" not in report.read_text()
    assert len((tmp_path / "report.jsonl").read_text().splitlines()) == 2
    printed = capsys.readouterr().out
    assert "its first record on Test CPU, 2 cores, no GPU: nothing to compare" in printed
    assert "| gateway.workers_2_over_1 | 1 | 1.2 | +20.0 % !! |" in printed


@pytest.mark.parametrize(("now", "flagged"), [(1.12, True), (0.88, True), (1.08, False), (0.92, False)])
def test_a_change_beyond_ten_percent_either_way_is_flagged(now: float, flagged: bool) -> None:
    records = [_record("gateway", 1.0), _record("gateway", now)]
    text = compare.compare(records)

    [change] = compare.changes(records[-1], records[0])
    assert change.flagged is flagged
    assert (compare.FLAG in text) is flagged
    assert f"{1 if flagged else 0} of 1 ratios moved by more than 10 %" in text


def test_other_machines_and_other_benchmarks_are_not_compared() -> None:
    records = [
        _record("gateway", 1.0),
        _record("gateway", 2.0, OTHER_MACHINE),  # another machine's: skipped
        _record("tenancy", 5.0),  # another benchmark's: skipped
        _record("gateway", 1.05),
    ]
    newest, previous = compare.latest_pair(records, "gateway") or (None, None)
    assert newest is records[3] and previous is records[0]

    text = compare.compare(records, "gateway")
    assert "| gateway.workers_2_over_1 | 1 | 1.05 | +5.0 % |" in text
    assert "tenancy" not in text and compare.FLAG not in text


def test_a_first_run_has_nothing_to_compare(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = [_record("gateway", 1.0, OTHER_MACHINE), _record("gateway", 1.5)]
    assert compare.latest_pair(records, "gateway") == (records[1], None)
    assert "first record on Test CPU, 2 cores, no GPU: nothing to compare" in compare.compare(records)
    assert compare.latest_pair(records, "capacity") is None

    path = tmp_path / "benchmarks.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + '\n{"benchmark": "cut off')
    assert compare.read_records(path) == records  # an unfinished line is skipped
    assert compare.read_records(tmp_path / "none.jsonl") == []


def test_the_command_warns_and_exits_0(tmp_path: Path) -> None:
    path = tmp_path / "benchmarks.jsonl"
    path.write_text("\n".join(json.dumps(_record("gateway", r)) for r in (1.0, 2.0)) + "\n")
    for records, says in ((path, "+100.0 % !!"), (tmp_path / "none.jsonl", "No records in")):
        done = subprocess.run(
            [sys.executable, "-m", "bench.compare", "--records", str(records)],
            cwd=Path(__file__).parent.parent,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert says in done.stdout


def test_server_cpu_counts_every_process_of_the_tree_by_role(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replicas forked from the template are the supervisor's grandchildren (and name the worker module
    through setproctitle); vLLM's engine runs below its worker; Ray's actors below the raylet; a worker
    that ended counts through the template that reaped it."""
    process = common._Process
    table = {
        10: process(1, 1.0, 0.0, b"python\0-m\0modelhost.cli.main\0serve\0"),  # the supervisor
        11: process(10, 2.0, 0.0, b"python\0-m\0modelhost.server.gateway\0--index\0"),
        # 3.0: reaped workers
        12: process(10, 0.5, 3.0, b"python\0-m\0modelhost.runtime.worker.template\0--fd\0"),
        13: process(12, 4.0, 0.0, b"python -m modelhost.runtime.worker.sync_worker --replica dep_1-1"),
        14: process(10, 0.25, 0.0, b"python\0-m\0modelhost.runtime.worker.vllm_worker\0--replica\0"),
        15: process(14, 8.0, 0.0, b"VLLM::EngineCore"),
        16: process(10, 0.125, 0.0, b"/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet\0"),
        17: process(16, 16.0, 0.0, b"ray::ServeReplica:dep_2:ModelServer"),
        18: process(16, 0.0625, 0.0, b"ray::ServeController"),
        20: process(1, 100.0, 0.0, b"wrk\0"),  # not the server's
    }
    monkeypatch.setattr(common, "process_table", lambda: table)

    cpu = common.server_cpu(10)
    assert cpu == common.ServerCpu(gateway=3.5, front=0.25, engine=31.0, ray=0.1875)
    assert cpu.replicas == 31.25
    assert common.modelhost_cpu(10) == (3.5, 0.25, 31.0)
    assert (cpu - common.ServerCpu(gateway=1.5)).ms_per(1000) == common.ServerCpu(2.0, 0.25, 31.0, 0.1875)


def test_the_gateway_report_gives_workers_2_over_1_with_its_range_round_by_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ratio of the medians is the figure; a round's own ratio shows how far one run can stray."""
    from argparse import Namespace

    from bench import gateway

    monkeypatch.setattr(gateway, "machine", lambda: MACHINE["description"])
    one = gateway.Config(
        "modelhost", 1, runs=[(100, 10, 0.8, 0.14, 0.3, 0.05, 0), (110, 10, 0.8, 0.14, 0.3, 0.05, 0)]
    )
    two = gateway.Config(
        "modelhost", 2, runs=[(150, 7, 1.1, 0.14, 0.5, 0.06, 0), (143, 7, 1.1, 0.14, 0.5, 0.06, 0)]
    )
    figures = Figures("gateway")
    text = gateway.report([one, two], Namespace(connections=64, rounds=2, seconds=5), figures)
    assert "--workers 2: 1.40 (round by round 1.30 to 1.50)" in text
    assert figures.values["gateway.workers_2_over_1"] == pytest.approx(146.5 / 105)
    assert figures.values["gateway.workers_2_over_1.lowest_round"] == pytest.approx(1.3)
    assert figures.values["gateway.workers_2_over_1.highest_round"] == pytest.approx(1.5)
    assert figures.ratios == ["gateway.workers_2_over_1"]  # the range is context, not compared across runs


def test_the_cpu_budget_is_the_cpus_own_or_else_the_largest_of_each_connection_count() -> None:
    from bench.cpu_budget import BUDGET, Measured, budgets_for, verdicts

    budget = json.loads(BUDGET.read_text())
    named = budget["budgets"]
    assert set(named) >= {"AMD EPYC", "Intel(R) Xeon(R) Processor"}
    assert budgets_for(budget, "AMD EPYC") == named["AMD EPYC"]
    unknown = budgets_for(budget, "Some Other CPU")
    for count in ("1", "32"):
        most = max(limits[count]["gateway_per_replica_cpu"] for limits in named.values())
        assert unknown[count]["gateway_per_replica_cpu"] == most
    amd_limit = named["AMD EPYC"]["32"]
    over = amd_limit["gateway_per_replica_cpu"] * (1 + amd_limit["margin"]) + 0.01
    figure = Measured(32, 2500, 1.0, over, 200.0)
    assert not verdicts([figure], budget, "AMD EPYC")[0][3]
    assert verdicts([figure], budget, "Intel(R) Xeon(R) Processor")[0][3]
