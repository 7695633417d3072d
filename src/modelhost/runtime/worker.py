"""A replica worker process: owns one model, answers batches from its gateway over ZeroMQ.

Started by `LocalProcessReplica` as `python -m modelhost.runtime.worker`. It exits when asked to,
when its socket peer is gone, or when the gateway process dies (PR_SET_PDEATHSIG), so no worker
outlives its gateway.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import zmq

from modelhost.runtime.channel import pack, unpack

POLL_MS = 1000


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL us when the gateway dies, even by SIGKILL."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: the parent-pid check in the loop still ends us


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="modelhost replica worker (started by the gateway)")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--pipeline", required=True)
    parser.add_argument("--model-dir", required=True, type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--warmup", action="store_true")
    args = parser.parse_args(argv)
    parent = os.getppid()
    _die_with_parent()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    context = zmq.Context()
    sock = context.socket(zmq.PAIR)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.connect(args.socket)
    started = time.perf_counter()
    try:
        handler, model = _load(args)
        if args.warmup:
            handler.run(model, [handler.warmup_item()])
    except Exception as exc:  # the loader's reason goes back to the gateway
        sock.send(pack({"op": "failed", "reason": f"{type(exc).__name__}: {exc}"}))
        traceback.print_exc()
        return 1
    sock.send(pack({"op": "ready", "load_seconds": time.perf_counter() - started}))
    return _serve(sock, handler, model, parent)


def _load(args: argparse.Namespace) -> tuple[Any, Any]:
    import torch
    import transformers

    from modelhost.runtime.loader import pick_device

    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    from modelhost.tasks.registry import handler_for

    torch.set_num_threads(max(1, args.threads))
    handler = handler_for(args.pipeline)
    return handler, handler.load(args.model_dir, pick_device(args.device))


def _serve(sock: zmq.Socket[bytes], handler: Any, model: Any, parent: int) -> int:
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    while True:
        if not poller.poll(POLL_MS):
            if os.getppid() != parent:
                return 0
            continue
        message = unpack(sock.recv())
        if message["op"] == "stop":
            return 0
        if message["op"] == "run":
            try:
                outputs = handler.run(model, message["batch"])
                sock.send(pack({"id": message["id"], "outputs": outputs}))
            except Exception as exc:
                traceback.print_exc()
                sock.send(pack({"id": message["id"], "error": f"{type(exc).__name__}: {exc}"}))


if __name__ == "__main__":
    sys.exit(main())
