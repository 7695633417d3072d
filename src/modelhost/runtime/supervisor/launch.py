"""What a replica worker process is started with: its command, environment and arguments, built in one
place for a local replica (`runtime.supervisor.local`) and for the vLLM worker a Ray Serve replica runs as its
child (`runtime.supervisor.ray_backend`), so that the two cannot drift apart.

The engine's row in `engine_table` says which program (`worker`) under which Python (`python`); what
that program is told beyond the common arguments is its own function here (`WORKER_ARGS`, by worker
module)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from modelhost.artifacts.gguf_check import InvalidGguf
from modelhost.config import Settings
from modelhost.engine_table import spec as engine_spec
from modelhost.generation.deployment_settings import ENVIRONMENT
from modelhost.runtime.engine_choice import llama_server_program, vllm_launch
from modelhost.runtime.footprint import llamacpp_layout
from modelhost.runtime.replica import ReplicaSpec
from modelhost.runtime.worker.spawn import WORKER_ENV, sync_worker_env


@dataclass(frozen=True, slots=True)
class WorkerLaunch:
    command: tuple[str, ...]  # empty: our own worker module (forked from the template, or our Python)
    env: dict[str, str]  # the worker's whole environment
    args: tuple[str, ...]  # without `--replica` (the caller names the replica)


def worker_launch(
    spec: ReplicaSpec, settings: Settings, base_env: Mapping[str, str], *, warmup: bool
) -> WorkerLaunch:
    """A worker of `spec`: the model and its task, the replica's threads and device, batching, an
    encoder's runtime where the replica chooses it at load, the KV cache its footprint reserved (both
    engines read it), for vLLM its own Python and switches, for llama.cpp its slots and their context.
    `base_env` is the environment it starts from (the server's, or a Serve actor's)."""
    args = [
        "--deployment", spec.deployment_id,
        "--pipeline", spec.pipeline,
        "--model-dir", str(spec.model_dir),
        "--threads", str(spec.threads),
        "--device", spec.device,
        "--max-batch", str(settings.max_batch_size),
        "--max-wait-ms", str(settings.max_batch_wait_ms),
    ]  # fmt: skip
    if warmup:
        args.append("--warmup")
    engine = engine_spec(spec.engine)
    if engine.measured_at_load:  # an encoder's runtime, chosen at load
        encoder_cache = str(settings.data_dir / "encoder-runtimes")
        args += ["--engine", spec.engine, "--engine-cache", encoder_cache, "--precision", spec.precision]
    # our own worker (no program of its engine's): its OpenMP threads' bounded wait (`spawn`)
    env: dict[str, str] = sync_worker_env(base_env) if engine.worker is None else {**base_env, **WORKER_ENV}
    command: tuple[str, ...] = ()
    if spec.kv_cache_mb:  # the KV cache its footprint reserved (`runtime.footprint`)
        env["MODELHOST_KV_CACHE_MB"] = str(spec.kv_cache_mb)
    # the deployment's generation settings, read by both engines (`generation.deployment_settings`)
    env.pop(ENVIRONMENT, None)
    env.update(spec.generation.environment())
    if engine.python == ".venv-vllm":  # vLLM's own environment: its Python, and what it adds to ours
        vllm_command, extra = vllm_launch(settings.data_dir, settings.vllm_cache_dir)
        command = tuple(vllm_command)
        # vLLM's legacy KV-cache setting counts whole GiB and overrides ours: never passed on
        env = {k: v for k, v in env.items() if k != "VLLM_CPU_KVCACHE_SPACE"} | extra
    elif engine.worker is not None:
        # our Python, executed (never forked: the engine starts threads of its own)
        command = (sys.executable, "-m", engine.worker)
    if engine.worker is not None:
        WORKER_ARGS[engine.worker](spec, settings, args, env)
    return WorkerLaunch(command, env, tuple(args))


def _vllm_args(spec: ReplicaSpec, settings: Settings, args: list[str], env: dict[str, str]) -> None:
    """vLLM's worker: the KV cache its footprint reserved, its GPU, tensor parallelism, compilation, and
    the adapters of a base."""
    if spec.kv_cache_mb:
        args += ["--kv-cache-mb", str(spec.kv_cache_mb)]
    if spec.device.startswith("cuda:") and settings.vllm_tensor_parallel_size == 1:
        # placed on one GPU: vLLM's processes see that one alone (as their device 0)
        env["CUDA_VISIBLE_DEVICES"] = spec.device.removeprefix("cuda:")
        args[args.index("--device") + 1] = "cuda"
    args += ["--tensor-parallel-size", str(settings.vllm_tensor_parallel_size)]
    if not settings.vllm_compile:
        args.append("--eager")
    if spec.lora_rank is not None:  # a base with adapters attached (docs/adapters.md)
        args += ["--max-lora-rank", str(spec.lora_rank), "--max-loras", str(settings.max_loras)]
        args += ["--max-cpu-loras", str(max(settings.max_cpu_loras, settings.max_loras))]


def _llamacpp_args(spec: ReplicaSpec, settings: Settings, args: list[str], env: dict[str, str]) -> None:
    """llama.cpp's worker: the slots and context per slot its footprint reserved, and the native
    `llama-server` where one is built."""
    args += ["--slots", str(settings.llamacpp_slots)]
    program = llama_server_program(settings)
    if program:
        args += ["--llama-server", program]
    with contextlib.suppress(InvalidGguf):  # replaced since its inspection: llama.cpp says why
        layout = llamacpp_layout(
            spec.model_dir,
            spec.generation.max_model_len,
            settings.llamacpp_slots,
            settings.llamacpp_context,
        )
        args += ["--context", str(layout.context)]


# What each engine's worker program is told beyond the common arguments, by its row's `worker`
WORKER_ARGS: dict[str, Callable[[ReplicaSpec, Settings, list[str], dict[str, str]], None]] = {
    "modelhost.runtime.worker.vllm_worker": _vllm_args,
    "modelhost.runtime.worker.llamacpp_worker": _llamacpp_args,
}
