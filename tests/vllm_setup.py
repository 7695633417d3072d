"""Where the tests find vLLM: `wait_for_vllm()`, which waits for the checkout's `.venv-vllm` while
scripts/setup.sh installs it (scripts/test.sh runs that install in the background, beside the tests).

The status file `<checkout>/.venv-vllm.setup`, written by `setup.sh` (its `setup_vllm`; nothing where
MODELHOST_VLLM_PYTHON names an environment), one line:

- `installing <pid>`: a setup.sh (that process ID) is installing or checking `.venv-vllm`;
- `ok`: done, `.venv-vllm/.modelhost-vllm` (the marker) and its architectures list are written;
- `failed: <reason>`: it could not install vLLM (scripts/test.sh's run: `.venv-vllm.setup.log` has the
  output); a setup.sh killed mid-way says `failed: interrupted`, or keeps `installing <pid>` of a process
  that is gone (SIGKILL).

The marker decides: `.venv-vllm` is usable once it is there and nobody is installing. Standard library
only: importable before anything is installed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import NamedTuple

CHECKOUT = Path(__file__).resolve().parents[1]
ENVIRONMENT = CHECKOUT / ".venv-vllm"
MARKER = ENVIRONMENT / ".modelhost-vllm"
STATUS = CHECKOUT / ".venv-vllm.setup"
LOG = CHECKOUT / ".venv-vllm.setup.log"


class VllmPython(NamedTuple):
    """The Python of a usable vLLM environment, or None and why there is none (for `pytest.skip`)."""

    python: str | None
    reason: str  # "" where `python` is set


def wait_for_vllm(timeout: float = 900) -> VllmPython:
    """A usable vLLM Python: MODELHOST_TEST_VLLM_PYTHON or MODELHOST_VLLM_PYTHON where set (not empty;
    tests/__init__.py empties the latter for the whole suite, so in a test only the former counts), else
    the checkout's `.venv-vllm/bin/python` once its marker is written, waiting up to `timeout` seconds
    while the status file says a live setup.sh is installing it. Otherwise `python` is None and `reason`
    says why::

        python, reason = wait_for_vllm()
        if python is None:
            pytest.skip(reason)
    """
    for name in ("MODELHOST_TEST_VLLM_PYTHON", "MODELHOST_VLLM_PYTHON"):
        named = os.environ.get(name)
        if named:
            if os.access(named, os.X_OK):
                return VllmPython(named, "")
            return VllmPython(None, f"{name}={named} is not an executable Python")
    deadline = time.monotonic() + timeout
    status = _status()
    while _installing(status):
        left = deadline - time.monotonic()
        if left <= 0:
            return VllmPython(
                None, f"vLLM is still being installed after {timeout:.0f} s ({_relative(STATUS)}: {status})"
            )
        time.sleep(min(2.0, left))
        status = _status()
    python = ENVIRONMENT / "bin" / "python"
    if MARKER.is_file() and os.access(python, os.X_OK):
        return VllmPython(str(python), "")
    if status.startswith("failed:"):
        why = status.removeprefix("failed:").strip()
        log = f"; {_relative(LOG)} has its output" if LOG.is_file() else ""
        return VllmPython(None, f"vLLM could not be installed: {why}{log}")
    if status.startswith("installing"):
        return VllmPython(None, "vLLM's install was interrupted (scripts/setup.sh vllm carries on with it)")
    return VllmPython(
        None,
        "vLLM is not installed (no .venv-vllm/.modelhost-vllm: scripts/setup.sh installs it, unless "
        "MODELHOST_SETUP_VLLM=0; MODELHOST_TEST_VLLM_PYTHON names another environment)",
    )


def _status() -> str:
    try:
        return STATUS.read_text().strip()
    except OSError:
        return ""


def _installing(status: str) -> bool:
    """Whether `status` says a setup.sh is installing, and that process still runs."""
    words = status.split()
    if not words or words[0] != "installing":
        return False
    if len(words) < 2 or not words[1].isdigit():
        return True  # no process to check: the timeout decides
    pid = int(words[1])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not reaped yet) is gone too
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def _relative(path: Path) -> str:
    return str(path.relative_to(CHECKOUT))
