"""A replica worker hosting llama.cpp's server (`engines.llamacpp`): GGUF text generation, and embeddings
from an embedding GGUF (`engines.llamacpp_embeddings`, a feature-extraction deployment), on the
`llamacpp` engine.

Started by `LocalProcessReplica` as a program of its own (our Python, never forked from the template:
llama.cpp starts its own threads, and the template's torch is of no use to it), with the same command
line and sockets as `runtime.worker.sync_worker`, plus the slots and the context of each that the supervisor
decided (`runtime.supervisor.launch`, with the footprint that reserved their KV cache: `runtime.footprint`).
The protocol loop is the one the vLLM worker runs (`runtime.worker.async_worker`: generations, or an embedding
model's batch requests); this module loads the engine and warms it up.
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
import traceback

from modelhost.engines.interface import SelfSteppingEngine
from modelhost.engines.llamacpp import load
from modelhost.engines.llamacpp_embeddings import load_embedder
from modelhost.runtime.worker import async_worker
from modelhost.runtime.worker.async_worker import AsyncWorker, load_failed
from modelhost.runtime.worker.sync_worker import replica_parser

EMBEDDINGS = "feature-extraction"  # the task an embedding GGUF serves


def _parser() -> argparse.ArgumentParser:
    parser = replica_parser("modelhost replica worker on llama.cpp (started by the supervisor)")
    parser.add_argument("--slots", type=int, default=4, help="requests decoded together")
    parser.add_argument("--context", type=int, default=4096, help="tokens of context per slot")
    parser.add_argument("--llama-server", default=None, help="a llama-server program instead of the wheel's")
    return parser


async def _serve(args: argparse.Namespace) -> int:
    lifeline = socket.socket(fileno=args.fd)
    listener = socket.socket(fileno=args.listen_fd)
    started = time.perf_counter()
    try:
        engine = _load(args)
    except Exception as exc:  # the reason goes back to the supervisor
        traceback.print_exc()
        return load_failed(lifeline, f"llama.cpp could not load the model: {type(exc).__name__}: {exc}")
    try:
        await engine.warm_up()
    except Exception as exc:
        traceback.print_exc()
        engine.shutdown()
        return load_failed(lifeline, f"llama.cpp loaded the model but could not run it: {exc}")
    worker = AsyncWorker(engine, args.deployment, "llamacpp")
    return await async_worker.serve(lifeline, listener, started, worker)


def _load(args: argparse.Namespace) -> SelfSteppingEngine:
    """The engine for the deployment's task: the server in embedding mode, or generating."""
    where = (args.model_dir, args.slots, args.context, args.threads, args.llama_server)
    return load_embedder(*where) if args.pipeline == EMBEDDINGS else load(*where)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return async_worker.main(lambda: _serve(args), uvloop=True)


if __name__ == "__main__":
    sys.exit(main())
