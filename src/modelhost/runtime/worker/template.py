"""The worker template: a process that imported torch and transformers once and forks replica workers.

Started by `runtime.worker.spawn` as `python -m modelhost.runtime.worker.template --fd N`, where `--fd` is one
end of a `SOCK_SEQPACKET` socketpair (one message per datagram, file descriptors alongside). Its messages:
- supervisor → template: `Fork` with the new worker's two sockets attached (lifeline, listener);
- template → supervisor: `Forked` (the worker's pid) or `ForkFailed`, in the order of the requests;
  later `Exited` when the template has reaped a worker.

Nothing here starts a thread or touches CUDA, so a forked child is a clean single-threaded process; it
takes the environment and the process title an executed worker would have, then runs the worker's
main with its sockets. The template ends at end-of-file on its socket (the supervisor is gone), or when
the supervisor dies (`PR_SET_PDEATHSIG`); its workers then end as well (their own `PR_SET_PDEATHSIG`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import selectors
import socket
import sys
import traceback

import msgspec
from setproctitle import getproctitle, setproctitle

from modelhost.runtime.worker.spawn import Exited, Fork, Forked, ForkFailed

MESSAGE_BYTES = 1 << 20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="modelhost worker template (started by the supervisor)")
    parser.add_argument("--fd", required=True, type=int, help="a SOCK_SEQPACKET socket to the supervisor")
    args = parser.parse_args(argv)
    control = socket.socket(fileno=args.fd)
    # setproctitle finds the memory of the command line through the environment's, which any change to
    # the environment moves: it looks now, before the imports below may set a variable
    getproctitle()
    _preload()
    from modelhost.runtime.lifetime import die_with_parent

    die_with_parent()
    return Template(control).serve()


def _preload() -> None:
    """torch, transformers with its pipelines, sentence-transformers and the worker's own modules: about
    1.5 s of CPU that each executed worker spent. diffusers is left out (1 s more, for image and video
    generation only). None of them starts a thread or initialises CUDA at import."""
    import sentence_transformers  # noqa: F401
    import torch  # noqa: F401
    import transformers
    import transformers.pipelines

    import modelhost.engines.loader
    import modelhost.runtime.worker.sync_worker
    import modelhost.tasks.registry  # noqa: F401

    transformers.utils.logging.disable_progress_bar()


class Template:
    """Forks on request; reaps its children as they exit (a pidfd each) and reports their exit codes."""

    def __init__(self, control: socket.socket) -> None:
        self.control = control
        self.selector = selectors.DefaultSelector()
        self.selector.register(control, selectors.EVENT_READ, None)
        self.children: dict[int, int] = {}  # pidfd → pid

    def serve(self) -> int:
        while True:
            for key, _ in self.selector.select():
                if key.data is None:
                    if not self._take_request():
                        return 0
                else:
                    self._reap(key.fd, key.data)

    def _take_request(self) -> bool:
        try:
            data, fds, _, _ = socket.recv_fds(self.control, MESSAGE_BYTES, 2)
        except OSError:
            return False
        if not data:
            return False  # the supervisor is gone
        try:
            request = msgspec.msgpack.decode(data, type=Fork)
            if len(fds) != 2:
                raise ValueError(f"a fork request carries 2 sockets, not {len(fds)}")
            pid = self._fork(request, fds[0], fds[1])
        except Exception as exc:
            self._send(ForkFailed(f"{type(exc).__name__}: {exc}"))
        else:
            self._send(Forked(pid))
        finally:
            for fd in fds:
                os.close(fd)  # the child holds them now
        return True

    def _fork(self, request: Fork, lifeline: int, listener: int) -> int:
        pid = os.fork()
        if pid == 0:
            os._exit(self._run_child(request, lifeline, listener))
        pidfd = os.pidfd_open(pid)
        self.children[pidfd] = pid
        self.selector.register(pidfd, selectors.EVENT_READ, pid)
        return pid

    def _run_child(self, request: Fork, lifeline: int, listener: int) -> int:
        """In the child: drop the template's own descriptors, become an executed worker's look-alike,
        serve. Never returns into the template's loop."""
        code = 1
        try:
            self.selector.close()
            self.control.close()
            for pidfd in self.children:
                os.close(pidfd)
            setproctitle(
                " ".join([sys.executable, "-m", "modelhost.runtime.worker.sync_worker", *request.args])
            )
            os.environ.clear()
            os.environ.update(request.env)
            from modelhost.runtime.worker.sync_worker import serve_sockets

            code = serve_sockets(request.args, socket.socket(fileno=lifeline), socket.socket(fileno=listener))
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 0 if exit.code is None else 1
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        return code

    def _reap(self, pidfd: int, pid: int) -> None:
        self.selector.unregister(pidfd)
        os.close(pidfd)
        del self.children[pidfd]
        _, status = os.waitpid(pid, 0)
        self._send(Exited(pid, os.waitstatus_to_exitcode(status)))

    def _send(self, message: Forked | ForkFailed | Exited) -> None:
        with contextlib.suppress(OSError):  # the supervisor is gone: end-of-file ends the loop
            self.control.send(msgspec.msgpack.encode(message))


if __name__ == "__main__":
    sys.exit(main())
