"""A replica worker hosting vLLM's async engine (`engines.vllm`): text generation on the `vllm` engine.

Started by `LocalProcessReplica` like `runtime.worker`, with the same command line and the same two
sockets (the lifeline and the listening socket every gateway process connects to), and speaking the
same replica protocol: `Generate` → `Events`, `Cancel` → vLLM's abort, `StatsRequest` → `Stats`. It runs
under the Python of vLLM's own environment (`.venv-vllm`), never forked from our template: vLLM pins its
own torch and transformers, and starts its engine core in child processes of its own. What is ours and
what is vLLM's in a generation is the engine's part (`engines.vllm`); this module is the process, its
sockets and its protocol loop.

Unlike `runtime.worker`'s synchronous loop, this one is asyncio: vLLM's front end is.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import signal
import socket
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from modelhost import tracing
from modelhost.engines.vllm import LoraSlots, QuantizationNotServed, VllmModel, generate, load, warm_up
from modelhost.runtime import metrics
from modelhost.runtime.host import with_priority
from modelhost.runtime.protocol import (
    Cancel,
    Event,
    Events,
    FrameReader,
    Generate,
    LoadFailed,
    Ready,
    Stats,
    StatsRequest,
    Stop,
    decode_to_replica,
    encode,
)
from modelhost.runtime.worker import die_with_parent

READ_SIZE = 1 << 18


@dataclass(eq=False)
class _Peer:
    """One gateway's (or the supervisor's) connection and the generations it asked for."""

    number: int
    writer: asyncio.StreamWriter
    generations: dict[int, asyncio.Task[None]] = field(default_factory=dict)
    pending: list[Event] = field(default_factory=list)


class VllmWorker:
    def __init__(self, model: VllmModel, deployment: str) -> None:
        self.model = model
        self.deployment = deployment
        # the same gauge the transformers engine's replicas keep: sequences held (vLLM's running and
        # waiting requests are ours until their last event)
        self._generating = metrics.GENERATING.labels(deployment)
        self._generated_tokens = metrics.GENERATION_TOKENS.labels(deployment)
        self._numbers = itertools.count()
        self._peers: set[_Peer] = set()
        self._flush_scheduled: set[_Peer] = set()
        self.stopped = asyncio.Event()

    @property
    def running(self) -> int:
        return sum(len(peer.generations) for peer in self._peers)

    async def serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Read a connection's messages until it closes; True when it said `Stop`."""
        peer = _Peer(next(self._numbers), writer)
        self._peers.add(peer)
        frames = FrameReader()
        try:
            while data := await reader.read(READ_SIZE):
                for body in frames.feed(data):
                    try:
                        message = decode_to_replica(body)
                    except msgspec.DecodeError:
                        traceback.print_exc()
                        return False
                    if isinstance(message, Stop):
                        return True
                    self._receive(peer, message)
            return False
        except ConnectionError:
            return False
        finally:
            self._peers.discard(peer)
            for task in peer.generations.values():
                task.cancel()  # vLLM aborts a request whose iterator is cancelled
            writer.close()

    async def serve_gateway(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self.serve_connection(reader, writer)

    def _receive(self, peer: _Peer, message: Any) -> None:
        if isinstance(message, Generate):
            task = asyncio.create_task(self._generate(peer, message))
            peer.generations[message.id] = task
        elif isinstance(message, Cancel):
            cancelled = peer.generations.pop(message.id, None)
            if cancelled is not None:
                cancelled.cancel()
        elif isinstance(message, StatsRequest):
            self._send(peer, Stats(message.id, 0, self.running))
        else:  # a batch `Run`: not this replica's kind of task
            traceback.print_stack()

    async def _generate(self, peer: _Peer, message: Generate) -> None:
        request_id = f"{peer.number}-{message.id}"
        self._generating.inc()
        counted = 0  # of the request's tokens, in `modelhost_generation_tokens_total`
        traced = tracing.generation_trace(message.trace, self.deployment, "vllm")

        def emit(event: dict[str, Any]) -> None:
            nonlocal counted
            generated = event.get("completion_tokens", counted)
            if generated > counted:
                self._generated_tokens.inc(generated - counted)
                counted = generated
            if traced is not None:
                traced.event(event)
            self._event(peer, message.id, event)

        try:
            await generate(self.model, request_id, with_priority(message), emit)
        except asyncio.CancelledError:
            if traced is not None:
                traced.event({"cancelled": True})
            await self.model.abort(request_id)
            raise
        except Exception as exc:  # the engine failed: this request gets an internal error
            traceback.print_exc()
            emit({"error": {"message": f"{type(exc).__name__}: {exc}", "internal": True}})
            if self.model.errored:
                self.stopped.set()  # the engine core is gone: exit, the supervisor starts a replacement
        finally:
            self._generating.dec()
            peer.generations.pop(message.id, None)

    def _event(self, peer: _Peer, request_id: int, event: dict[str, Any]) -> None:
        """Events go out once per turn of the loop, gathered per connection (one frame for every stream
        that moved in a step)."""
        peer.pending.append(Event(request_id, event))
        if peer not in self._flush_scheduled:
            self._flush_scheduled.add(peer)
            asyncio.get_running_loop().call_soon(self._flush, peer)

    def _flush(self, peer: _Peer) -> None:
        self._flush_scheduled.discard(peer)
        events, peer.pending = peer.pending, []
        if events:
            self._send(peer, Events(events))

    def _send(self, peer: _Peer, message: msgspec.Struct) -> None:
        if not peer.writer.is_closing():
            peer.writer.write(encode(message))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="modelhost replica worker on vLLM (started by the supervisor)"
    )
    parser.add_argument("--replica", default="", help="replica name (<deployment id>-<n>), for `ps`")
    parser.add_argument("--deployment", default="", help="deployment ID")
    parser.add_argument("--fd", type=int, required=True, help="the lifeline: this end of a socketpair")
    parser.add_argument(
        "--listen-fd", type=int, required=True, help="a bound Unix socket gateways connect to"
    )
    parser.add_argument("--pipeline", required=True)
    parser.add_argument("--model-dir", required=True, type=Path)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--kv-cache-mb", type=int, default=None)
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--eager", action="store_true", help="vLLM's eager mode (no torch.compile)")
    parser.add_argument(
        "--max-lora-rank", type=int, default=None, help="LoRA on, for adapters of this rank at most"
    )
    parser.add_argument("--max-loras", type=int, default=8, help="adapters in one batch")
    parser.add_argument("--max-cpu-loras", type=int, default=64, help="adapters kept in CPU memory")
    # accepted for the same command line as runtime.worker; vLLM batches and warms up by itself
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--max-batch", type=int, default=None)
    parser.add_argument("--max-wait-ms", type=float, default=None)
    parser.add_argument("--warmup", action="store_true")
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
        lifeline.sendall(encode(LoadFailed(f"vLLM cannot serve the model here: {exc}")))
        return 1
    except Exception as exc:  # the reason goes back to the supervisor
        traceback.print_exc()
        lifeline.sendall(encode(LoadFailed(f"vLLM could not load the model: {type(exc).__name__}: {exc}")))
        return 1
    try:
        await warm_up(model)
    except Exception as exc:
        traceback.print_exc()
        reason = _root_cause(exc)
        lifeline.sendall(encode(LoadFailed(f"vLLM loaded the model but could not run it: {reason}")))
        model.shutdown()
        return 1
    worker = VllmWorker(model, args.deployment)
    traced = tracing.start("replica")  # on where the gateway's OTEL_* variables name an endpoint
    try:
        reader, writer = await asyncio.open_connection(sock=lifeline)
        writer.write(encode(Ready(time.perf_counter() - started)))
        server = await asyncio.start_unix_server(worker.serve_gateway, sock=listener)
        supervisor = asyncio.create_task(worker.serve_connection(reader, writer))
        stopped = asyncio.create_task(worker.stopped.wait())
        # the supervisor's connection ends (Stop, or end-of-file: it is gone) or the engine died
        await asyncio.wait({supervisor, stopped}, return_when=asyncio.FIRST_COMPLETED)
        server.close()
        return 1 if stopped.done() else 0
    finally:
        if traced:
            tracing.stop()  # its last spans go out
        model.shutdown()


def _root_cause(exc: BaseException) -> str:
    """vLLM's engine core dies with `EngineDeadError` ("see the stack trace above"); the cause it
    logged is what the operator needs. The innermost chained exception, else the error itself."""
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return f"{type(exc).__name__}: {exc}"


def main(argv: list[str] | None = None) -> int:
    die_with_parent()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    args = _parser().parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":  # vLLM spawns its engine core: nothing may start at import
    sys.exit(main())
