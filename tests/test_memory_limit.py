"""The replica memory limit (`MODELHOST_REPLICA_MEMORY_LIMIT_MB`), through HTTP on a real `modelhost
serve`: the supervisor measures each replica's worker every `MODELHOST_MEMORY_CHECK_SECONDS` and restarts
one above the limit, saying why in the deployment's `state_reason`, the log and
`modelhost_replica_restarts_total{reason="memory"}`; the third time within ten minutes the deployment
fails instead. The limit compares a replica's footprint (what it adds to the machine: runtime/memory.py);
a tiny model's worker forked from the template takes about 35 MB of it, so 20 MB is always exceeded."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from modelhost.runtime.memory import descendants, footprint_bytes, parents, rss_bytes, tree_footprint_bytes
from tests.helpers import assert_error, bearer
from tests.server_process import ST_RECIPE, Server, server_with, until

RESTARTED = re.compile(
    r"replica (dep_\w+-\d+) was restarted: its memory (\d+) MB exceeded the limit of 20 MB"
)


def view(server: Server, deployment_id: str) -> dict[str, Any]:
    answer = httpx.get(f"{server.url}/v1/deployments/{deployment_id}", headers=bearer(server.key), timeout=10)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def memory_restarts(server: Server, deployment_id: str) -> float:
    labels = f'deployment="{deployment_id}",reason="memory"'
    pattern = rf"^modelhost_replica_restarts_total{{{labels}}} ([\d.e+]+)$"
    match = re.search(pattern, server.metrics(), re.M)
    return float(match.group(1)) if match else 0.0


async def test_a_replica_over_the_memory_limit_is_restarted_with_its_reason_shown_then_fails_the_third_time(
    tmp_path: Path, recipes: Path
) -> None:
    limits = {"MODELHOST_REPLICA_MEMORY_LIMIT_MB": "20", "MODELHOST_MEMORY_CHECK_SECONDS": "2"}
    async with server_with(tmp_path, 1, **limits) as server:
        deployment_id = await server.deploy(
            recipes.joinpath(*ST_RECIPE), "feature-extraction", "m", readiness="warm"
        )
        [first] = await until(lambda: server.replicas(deployment_id))

        def ready_again() -> dict[str, Any] | None:
            """The deployment's view once a replacement serves (another worker than the first). The
            workers first: one seen replaced means the view read after it knows why."""
            pids = server.replicas(deployment_id)
            current = view(server, deployment_id)
            return current if current["state"] == "ready" and pids and first not in pids else None

        current = await until(ready_again, timeout=60)
        restarted = RESTARTED.fullmatch(current["state_reason"] or "")
        assert restarted and int(restarted.group(2)) > 20, current  # still said while ready again

        def failed() -> dict[str, Any] | None:
            current = view(server, deployment_id)
            return current if current["state"] == "failed" else None

        current = await until(failed, timeout=60)
        assert re.fullmatch(
            r"replica dep_\w+-\d+ was stopped: its memory \d+ MB exceeded the limit of 20 MB "
            r"3 times in 10 minutes",
            current["state_reason"],
        ), current
        assert current["replicas"] == 0
        await until(lambda: not server.replicas(deployment_id))
        assert memory_restarts(server, deployment_id) == 2
        assert_error(await server.embed("after the failure"), 503, "deployment_unavailable")
        log = server.process.log.read_text()
        assert len(RESTARTED.findall(log)) == 2, log[-3000:]


async def test_a_replica_under_the_memory_limit_keeps_running(tmp_path: Path, recipes: Path) -> None:
    limits = {"MODELHOST_REPLICA_MEMORY_LIMIT_MB": "100000", "MODELHOST_MEMORY_CHECK_SECONDS": "0.2"}
    async with server_with(tmp_path, 1, **limits) as server:
        deployment_id = await server.deploy(
            recipes.joinpath(*ST_RECIPE), "feature-extraction", "m", readiness="warm"
        )
        await server.ready(deployment_id)
        [pid] = server.replicas(deployment_id)
        assert (await server.embed("hello")).status_code == 200
        await asyncio.sleep(2)  # ten checks
        assert server.replicas(deployment_id) == [pid]
        current = view(server, deployment_id)
        assert (current["state"], current["state_reason"]) == ("ready", None), current
        assert memory_restarts(server, deployment_id) == 0


def test_a_process_tree_counts_the_memory_its_processes_wrote_not_the_libraries_they_share() -> None:
    script = "import time; block = bytearray(64 << 20); time.sleep(60)"  # 64 MiB written (zeroed)
    child = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline, last = time.monotonic() + 10, -1
        while (now := footprint_bytes(child.pid)) != last and time.monotonic() < deadline:
            last = now
            time.sleep(0.2)  # until the block is allocated: its memory no longer moves
        table = parents()
        assert child.pid in descendants(os.getpid(), table)
        assert tree_footprint_bytes(child.pid, table) == footprint_bytes(child.pid)  # it started nothing
        assert 64 << 20 <= footprint_bytes(child.pid) < rss_bytes(child.pid)  # the interpreter's code: not
        assert tree_footprint_bytes(os.getpid(), table) > footprint_bytes(child.pid) + (1 << 20)  # and ours
        assert tree_footprint_bytes(None) == 0
    finally:
        child.kill()
        child.wait()
