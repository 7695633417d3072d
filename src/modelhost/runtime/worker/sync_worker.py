"""A replica worker process: owns one model and serves every gateway process of its server.

Started by `LocalProcessReplica` (`runtime.worker.spawn`): forked from the preloaded template, or executed as
`python -m modelhost.runtime.worker.sync_worker --fd N --listen-fd M ...`; either way it holds two sockets:
- `--fd` is its lifeline, one end of a socketpair whose other end the supervisor holds. The first
  message on it says whether the model loaded (`Ready` / `LoadFailed`); the supervisor then sends
  requests on it like any gateway. When it reads end-of-file the supervisor is gone, and so is the
  worker (also on `PR_SET_PDEATHSIG`, for a supervisor killed by SIGKILL).
- `--listen-fd` is a Unix socket the supervisor bound (in its private runtime folder) and published
  to its gateway processes: each of them connects once and sends its requests there.

One thread runs everything: it waits in `select` for messages, feeds them to the `ReplicaHost`, runs
the host's batch or step when it is due, and sends each connection its answers. While the model
computes, new requests wait in the sockets' buffers and join the next batch. No I/O thread competes
with the model for the interpreter.
"""

from __future__ import annotations

import argparse
import errno
import functools
import selectors
import signal
import socket
import sys
import time
import traceback
from collections import deque
from pathlib import Path
from typing import Any

import msgspec

from modelhost import tracing
from modelhost.engine_table import AUTO, ENGINE_TABLE, spec
from modelhost.engines.interface import EncoderHandler
from modelhost.generation import chat_templates
from modelhost.runtime.lifetime import die_with_parent
from modelhost.runtime.replica_protocol import (
    Cancel,
    FrameReader,
    Generate,
    LoadFailed,
    Ready,
    Stop,
    ToReplica,
    decode_to_replica,
    encode,
)
from modelhost.runtime.worker.host import ReplicaHost
from modelhost.tasks.base import AnyTaskHandler, is_streaming

READ_SIZE = 1 << 18


def replica_parser(description: str, sockets_required: bool = True) -> argparse.ArgumentParser:
    """The command line every replica worker takes (`runtime.supervisor.launch` writes it): its name,
    deployment and sockets, the model, and the batching knobs the engines that batch by themselves accept and
    ignore. The template's forked workers get their sockets otherwise (`sockets_required=False`)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--replica", default="", help="replica name (<deployment id>-<n>), for `ps`")
    parser.add_argument("--deployment", default="", help="deployment ID, for metrics")
    parser.add_argument(
        "--fd", type=int, required=sockets_required, help="the lifeline: this end of a socketpair"
    )
    parser.add_argument(
        "--listen-fd", type=int, required=sockets_required, help="a bound Unix socket gateways connect to"
    )
    parser.add_argument("--pipeline", required=True)
    parser.add_argument("--model-dir", required=True, type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--warmup", action="store_true")
    return parser


def _parser() -> argparse.ArgumentParser:
    parser = replica_parser("modelhost replica worker (started by the supervisor)", sockets_required=False)
    parser.add_argument(
        "--engine",
        default="transformers",
        choices=(*(name for name, row in ENGINE_TABLE.items() if row.worker is None), AUTO),
        help="an encoder's runtime: torch (transformers), ONNX Runtime, OpenVINO, or measured (auto)",
    )
    parser.add_argument("--engine-cache", type=Path, help="where encoder exports and decisions are kept")
    parser.add_argument(
        "--precision", default="float32", choices=("float32", "int8"), help="int8: an encoder quantized"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """An executed worker: its sockets are inherited file descriptors named on the command line."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.fd is None:
        parser.error("--fd is required")
    listener = socket.socket(fileno=args.listen_fd) if args.listen_fd is not None else None
    return _serve(args, socket.socket(fileno=args.fd), listener)


def serve_sockets(argv: list[str], lifeline: socket.socket, listener: socket.socket | None) -> int:
    """A forked worker (`runtime.worker.spawn`): the same command line, its sockets handed over as objects."""
    return _serve(_parser().parse_args(argv), lifeline, listener)


def _serve(args: argparse.Namespace, lifeline: socket.socket, listener: socket.socket | None) -> int:
    die_with_parent()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # its own tracer provider, from the environment it was given (a forked worker's is set by now)
    traced = tracing.start("replica")
    try:
        return _load_and_serve(args, lifeline, listener)
    finally:
        if traced:
            tracing.stop()  # a forked worker leaves by os._exit: its last spans go out here


def _load_and_serve(args: argparse.Namespace, lifeline: socket.socket, listener: socket.socket | None) -> int:
    started = time.perf_counter()
    try:
        handler, state = load(args.pipeline, args.model_dir, args.threads, args.device)
        choice = choose_runtime(
            handler, state, args.model_dir, args.engine, args.engine_cache, args.precision
        )
        if args.warmup:
            warm_up(handler, state)
    except Exception as exc:  # the loader's reason goes back to the supervisor
        lifeline.sendall(encode(LoadFailed(f"{type(exc).__name__}: {exc}")))
        traceback.print_exc()
        return 1
    ready = Ready(time.perf_counter() - started)
    if choice is not None:
        ready.engine, ready.engine_reason, ready.quality = choice.engine, choice.reason, choice.quality
    lifeline.sendall(encode(ready))
    host = ReplicaHost(
        handler,
        state,
        deployment=args.deployment,
        max_batch=args.max_batch,
        max_wait=args.max_wait_ms / 1000,
    )
    return Worker(host, lifeline, listener).serve()


def load(pipeline: str, model_dir: Path, threads: int, device: str) -> tuple[AnyTaskHandler, Any]:
    """The task's handler and its loaded model (the one loader path of both backends)."""
    import torch
    import transformers

    from modelhost.engines.loader import pick_device
    from modelhost.tasks.registry import handler_for

    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(max(1, threads))
    handler = handler_for(pipeline)
    return handler, handler.load(model_dir, pick_device(device))


def choose_runtime(
    handler: AnyTaskHandler,
    state: Any,
    model_dir: Path,
    engine: str,
    cache: Path | None,
    precision: str = "float32",
) -> Any:
    """An encoder's runtime, where the deployment's engine leaves it to the replica (`auto`,
    `onnxruntime`): `engines.encoders` measures (or reads its cached decision) and swaps the model.
    None where the handler has no encoder to offer (`engines.interface.EncoderHandler`) or the engine is
    `transformers`."""
    if not spec(engine).measured_at_load or not isinstance(handler, EncoderHandler):
        return None
    if cache is None:  # the supervisor always names it: the server's data folder, never the artifact's
        raise ValueError(f"--engine {engine} needs --engine-cache")
    from modelhost.engines.encoders import prepare

    return prepare(handler.encoder_slot(state), model_dir, engine, cache, precision)


def warm_up(handler: AnyTaskHandler, state: Any) -> None:
    """One inference before the first request (hot deployments): kernels and caches are ready."""
    if is_streaming(handler):
        handler.warmup(state)
    else:
        handler.run(state, [handler.warmup_item()])


class _Connection:
    """One gateway's (or the supervisor's) connection: frames in (decoded into `inbox`, taken in order),
    a write buffer out; `open` until its end-of-file, an error, or a message in another protocol."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.reader = FrameReader()
        self.unsent = bytearray()
        self.inbox: deque[ToReplica] = deque()
        self.open = True


class Worker:
    """The select loop around a `ReplicaHost` (see the module docstring)."""

    def __init__(self, host: ReplicaHost, lifeline: socket.socket, listener: socket.socket | None) -> None:
        self.host = host
        host.announce = self._send_outgoing
        self.selector = selectors.DefaultSelector()
        self.lifeline = self._open(lifeline)
        self.listener = listener
        if listener is not None:
            listener.setblocking(False)
            self.selector.register(listener, selectors.EVENT_READ, None)

    def serve(self) -> int:
        """Until the supervisor says stop or goes away."""
        while True:
            for key, events in self.selector.select(self.host.due()):
                connection = key.data
                if connection is None:
                    self._accept()
                    continue
                if events & selectors.EVENT_WRITE:
                    self._flush(connection)
                if events & selectors.EVENT_READ and not self._read(connection):
                    if connection is self.lifeline:
                        return 0
                    self._close(connection)
            if self.host.due() == 0:
                self.host.work(announce=self._send_outgoing)
            self._send_outgoing()

    def _send_outgoing(self) -> None:
        for peer, message in self.host.take_outgoing():
            assert isinstance(peer, _Connection)
            self._send(peer, encode(message))

    def _open(self, sock: socket.socket) -> _Connection:
        connection = _Connection(sock)
        self.selector.register(sock, selectors.EVENT_READ, connection)
        return connection

    def _accept(self) -> None:
        """Take a new gateway connection and read what it has already sent, so that its requests join
        the batch about to be chosen with those of the connections already open (a gateway connects
        on its first request, and its message is in the socket by the time the connection is seen)."""
        assert self.listener is not None
        try:
            sock, _ = self.listener.accept()
        except BlockingIOError:
            return
        connection = self._open(sock)
        if not self._read(connection):
            self._close(connection)

    def _read(self, connection: _Connection) -> bool:
        """Take every message that has arrived; False at end-of-file or a `Stop`. Reads until the socket
        is empty, so that a peer that died (end-of-file after its last requests) is known before the
        next batch: its requests are dropped rather than run. A request whose chat template renders
        meanwhile stops when its caller leaves (`_left`)."""
        self._fill(connection)
        while connection.inbox:
            message = connection.inbox.popleft()
            if isinstance(message, Stop):
                return False
            if isinstance(message, Generate):
                left = functools.partial(self._left, connection, message.id)
                with chat_templates.limits(stop=left):
                    self.host.receive(connection, message)
            else:
                self.host.receive(connection, message)
        return connection.open

    def _fill(self, connection: _Connection) -> None:
        """Decode what the socket holds into the connection's inbox, without waiting."""
        while connection.open:
            try:
                data = connection.sock.recv(READ_SIZE)
            except BlockingIOError:
                return
            except OSError:
                connection.open = False
                return
            if not data:
                connection.open = False
                return
            for body in connection.reader.feed(data):
                try:
                    connection.inbox.append(decode_to_replica(body))
                except msgspec.DecodeError:
                    traceback.print_exc()
                    connection.open = False  # a peer that speaks something else is cut off
                    return

    def _left(self, connection: _Connection, request_id: int) -> bool:
        """While a request's chat template renders (this one thread is busy with it): whether its caller
        has gone, a `Cancel` for it having arrived or its connection ended. Other messages that arrive
        meanwhile wait in the inbox, in order."""
        self._fill(connection)
        if not connection.open:
            return True
        return any(isinstance(m, Cancel) and m.id == request_id for m in connection.inbox)

    def _send(self, connection: _Connection, frame: bytes) -> None:
        if connection.unsent:
            connection.unsent += frame
            return
        try:
            sent = connection.sock.send(frame)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET):
                traceback.print_exc()
            return  # the peer is gone: its end-of-file closes it
        if sent < len(frame):
            connection.unsent += frame[sent:]
            self.selector.modify(connection.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, connection)

    def _flush(self, connection: _Connection) -> None:
        try:
            sent = connection.sock.send(connection.unsent)
        except BlockingIOError:
            return
        except OSError:
            connection.unsent.clear()
            return
        del connection.unsent[:sent]
        if not connection.unsent:
            self.selector.modify(connection.sock, selectors.EVENT_READ, connection)

    def _close(self, connection: _Connection) -> None:
        self.host.drop(connection)
        self.selector.unregister(connection.sock)
        connection.sock.close()


if __name__ == "__main__":
    sys.exit(main())
