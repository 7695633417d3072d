"""An idle deployment costs no CPU, even beside a busy one (issue 39): its replica sleeps in `select`
until a message arrives, and nothing in the server polls it while no request comes (the supervisor
measures replicas' memory from /proc, without waking them)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from tests.server_process import ST_RECIPE, server_with

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User and system CPU of a process, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


async def test_an_idle_hot_deployment_beside_a_busy_one_uses_no_cpu(tmp_path: Path, recipes: Path) -> None:
    # the memory check as often as it goes: it must not wake the replicas either
    async with server_with(tmp_path, 1, MODELHOST_MEMORY_CHECK_SECONDS="0.2") as server:
        busy = await server.deploy(
            recipes.joinpath(*ST_RECIPE), "feature-extraction", "busy", readiness="hot"
        )
        idle = await server.deploy(
            recipes.joinpath(*ST_RECIPE), "feature-extraction", "idle", readiness="hot"
        )
        for deployment_id in (busy, idle):
            await server.ready(deployment_id)
        [busy_pid], [idle_pid] = server.replicas(busy), server.replicas(idle)
        await asyncio.sleep(1)  # its warm-up and load are over
        busy_before, idle_before = cpu_seconds(busy_pid), cpu_seconds(idle_pid)
        clock = asyncio.get_running_loop().time
        started, answered = clock(), 0
        # at least 3 s, and until the neighbour's work shows in the same measure (on a busy machine
        # it answers fewer requests in 3 s), 20 s at most
        while clock() - started < 3 or (
            cpu_seconds(busy_pid) - busy_before <= 0.05 and clock() - started < 20
        ):
            answers = await asyncio.gather(*(server.embed(f"busy {i}", "busy") for i in range(8)))
            assert all(a.status_code == 200 for a in answers)
            answered += len(answers)
        busy_used, idle_used = cpu_seconds(busy_pid) - busy_before, cpu_seconds(idle_pid) - idle_before
        assert busy_used > 0.05, (answered, busy_used)  # the neighbour did work, measured the same way
        assert idle_used <= 0.02, idle_used  # two clock ticks at most over the whole window
