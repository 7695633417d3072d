"""A replica worker hosting llama.cpp's server (`engines.llamacpp`): GGUF text generation on the
`llamacpp` engine.

Started by `LocalProcessReplica` as a program of its own (our Python, never forked from the template:
llama.cpp starts its own threads, and the template's torch is of no use to it), with the same command
line and sockets as `runtime.worker`, plus the slots and the context of each that the supervisor decided
(`runtime.launch`, with the footprint that reserved their KV cache: `runtime.footprint`). The protocol
loop is the one the vLLM worker runs (`runtime.async_worker`); this module loads the engine and warms it
up.
"""

from __future__ import annotations

import argparse
import functools
import socket
import sys
import time
import traceback

from modelhost.engines.llamacpp import generate, load, warm_up
from modelhost.runtime import async_worker
from modelhost.runtime.async_worker import AsyncWorker, load_failed
from modelhost.runtime.worker import replica_parser


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
        model = load(args.model_dir, args.slots, args.context, args.threads, args.llama_server)
    except Exception as exc:  # the reason goes back to the supervisor
        traceback.print_exc()
        return load_failed(lifeline, f"llama.cpp could not load the model: {type(exc).__name__}: {exc}")
    try:
        await warm_up(model)
    except Exception as exc:
        traceback.print_exc()
        model.shutdown()
        return load_failed(lifeline, f"llama.cpp loaded the model but could not run it: {exc}")
    worker = AsyncWorker(model, functools.partial(generate, model), args.deployment, "llamacpp")
    return await async_worker.serve(lifeline, listener, started, worker)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return async_worker.main(lambda: _serve(args))


if __name__ == "__main__":
    sys.exit(main())
