"""A replica worker hosting vLLM's async engine (`engines.vllm`): text generation on the `vllm` engine.

Started by `LocalProcessReplica` like `runtime.worker.sync_worker`, with the same command line and the same
two sockets, and speaking the same replica protocol through the asyncio loop it shares with the llama.cpp
worker (`runtime.worker.async_worker`): `Cancel` → vLLM's abort. It runs under the Python of vLLM's own
environment (`.venv-vllm`), never forked from our template: vLLM pins its own torch and transformers,
and starts its engine core in child processes of its own. What is ours and what is vLLM's in a
generation is the engine's part (`engines.vllm`); this module loads it and warms it up.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
import traceback

from modelhost.engines.vllm import LoraSlots, QuantizationNotServed, load
from modelhost.runtime.worker import async_worker
from modelhost.runtime.worker.async_worker import AsyncWorker, load_failed
from modelhost.runtime.worker.sync_worker import replica_parser


def _parser() -> argparse.ArgumentParser:
    parser = replica_parser("modelhost replica worker on vLLM (started by the supervisor)")
    parser.add_argument("--kv-cache-mb", type=int, default=None)
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--eager", action="store_true", help="vLLM's eager mode (no torch.compile)")
    parser.add_argument(
        "--max-lora-rank", type=int, default=None, help="LoRA on, for adapters of this rank at most"
    )
    parser.add_argument("--max-loras", type=int, default=8, help="adapters in one batch")
    parser.add_argument("--max-cpu-loras", type=int, default=64, help="adapters kept in CPU memory")
    return parser


async def _serve(args: argparse.Namespace) -> int:
    lifeline = socket.socket(fileno=args.fd)
    listener = socket.socket(fileno=args.listen_fd)
    started = time.perf_counter()
    try:
        vision = args.pipeline == "image-text-to-text"
        lora = None
        if args.max_lora_rank is not None:  # a base with adapters attached
            lora = LoraSlots(args.max_lora_rank, args.max_loras, args.max_cpu_loras)
        model = load(
            args.model_dir, args.kv_cache_mb, args.device, args.tensor_parallel_size, vision, args.eager, lora
        )
    except QuantizationNotServed as exc:  # this machine lacks the kernels: the reason says which
        return load_failed(lifeline, f"vLLM cannot serve the model here: {exc}")
    except Exception as exc:  # the reason goes back to the supervisor
        traceback.print_exc()
        return load_failed(lifeline, f"vLLM could not load the model: {type(exc).__name__}: {exc}")
    try:
        await model.warm_up()
    except Exception as exc:
        traceback.print_exc()
        model.shutdown()
        return load_failed(lifeline, f"vLLM loaded the model but could not run it: {_root_cause(exc)}")
    worker = AsyncWorker(model, args.deployment, "vllm")
    return await async_worker.serve(lifeline, listener, started, worker)


def _root_cause(exc: BaseException) -> str:
    """vLLM's engine core dies with `EngineDeadError` ("see the stack trace above"); the cause it
    logged is what the operator needs. The innermost chained exception, else the error itself."""
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return f"{type(exc).__name__}: {exc}"


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    args = _parser().parse_args(argv)
    return async_worker.main(lambda: _serve(args))


if __name__ == "__main__":  # vLLM spawns its engine core: nothing may start at import
    sys.exit(main())
