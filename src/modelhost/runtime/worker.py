"""A replica worker process: owns one model, answers batches from its gateway over a socketpair.

Started by `LocalProcessReplica` as `python -m modelhost.runtime.worker --fd N`. It exits when
asked to, when its end of the socketpair reads end-of-file, or when the gateway process dies
(PR_SET_PDEATHSIG), so no worker outlives its gateway.
"""

from __future__ import annotations

import argparse
import ctypes
import select
import signal
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from modelhost.errors import ModelhostError
from modelhost.runtime.channel import recv_message, send_message
from modelhost.tasks.base import error_of


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL us when the gateway dies, even by SIGKILL."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: the parent-pid check in the loop still ends us


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="modelhost replica worker (started by the gateway)")
    parser.add_argument("--replica", default="", help="replica name (<deployment id>-<n>), for `ps`")
    parser.add_argument("--fd", required=True, type=int, help="this worker's end of the socketpair")
    parser.add_argument("--pipeline", required=True)
    parser.add_argument("--model-dir", required=True, type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--warmup", action="store_true")
    args = parser.parse_args(argv)
    _die_with_parent()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    sock = socket.socket(fileno=args.fd)
    started = time.perf_counter()
    try:
        handler, model = _load(args)
        streaming = getattr(handler, "streaming", False)
        if args.warmup:
            handler.warmup(model) if streaming else handler.run(model, [handler.warmup_item()])
    except Exception as exc:  # the loader's reason goes back to the gateway
        send_message(sock, {"op": "failed", "reason": f"{type(exc).__name__}: {exc}"})
        traceback.print_exc()
        return 1
    send_message(sock, {"op": "ready", "load_seconds": time.perf_counter() - started})
    return _serve_stream(sock, handler, model) if streaming else _serve(sock, handler, model)


def _load(args: argparse.Namespace) -> tuple[Any, Any]:
    import torch
    import transformers

    from modelhost.runtime.loader import pick_device

    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    from modelhost.tasks.registry import handler_for

    torch.set_num_threads(max(1, args.threads))
    handler = handler_for(args.pipeline)
    return handler, handler.load(args.model_dir, pick_device(args.device))


def _serve(sock: socket.socket, handler: Any, model: Any) -> int:
    while True:
        message = recv_message(sock)
        if message is None or message["op"] == "stop":
            return 0
        if message["op"] == "run":
            try:
                reply = {"id": message["id"], "outputs": handler.run(model, message["batch"])}
            except Exception as exc:
                traceback.print_exc()
                reply = {"id": message["id"], "error": f"{type(exc).__name__}: {exc}"}
            try:
                send_message(sock, reply)
            except OSError:  # the gateway is gone
                return 0


def _serve_stream(sock: socket.socket, handler: Any, state: Any) -> int:
    """Streaming handlers (text generation, video jobs): between two steps, take every message that has
    arrived (new requests, cancellations), then step and send that step's events in one message, with
    how many requests the handler still holds whenever that changed (the gateway's view of free slots).
    With nothing to do, block until a message comes."""
    reported = 0
    while True:
        waiting = handler.idle(state)
        while waiting or select.select([sock], [], [], 0)[0]:
            waiting = False
            message = recv_message(sock)
            if message is None or message["op"] == "stop":
                return 0
            events: list[Any] = []
            if message["op"] == "generate":
                try:
                    handler.start(state, message["id"], message["request"])
                except ModelhostError as exc:
                    events.append([message["id"], error_of(exc)])
            elif message["op"] == "cancel":
                handler.cancel(state, message["id"])
            reported = handler.running(state)
            if not _send(sock, {"op": "events", "events": events, "running": reported}):
                return 0
        try:
            events = [list(e) for e in handler.step(state)]
        except Exception as exc:  # a failed step fails the requests in it, not the replica
            traceback.print_exc()
            failure = {"error": {"message": f"{type(exc).__name__}: {exc}", "internal": True}}
            events = [[i, failure] for i in handler.abort(state)]
        running = handler.running(state)
        if events or running != reported:
            reported = running
            if not _send(sock, {"op": "events", "events": events, "running": running}):
                return 0


def _send(sock: socket.socket, message: dict[str, Any]) -> bool:
    try:
        send_message(sock, message)
    except OSError:  # the gateway is gone
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
