"""A child process's life tied to its parent's: the processes the runtime starts under another (a gateway
process under the supervisor, the worker template under it, a replica worker under the supervisor or
the template) ask Linux to signal them when that parent dies, even by SIGKILL, so that nothing outlives
the server that started it. (llama.cpp's server, the engines' child, does the same in its own module:
the engines import nothing of the runtime.)"""

from __future__ import annotations

import contextlib
import ctypes
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Have Linux send `sig` to this process when its parent dies (SIGTERM: let it drain first). Not on
    Linux: nothing (end-of-file on its pipes or sockets still ends it)."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
