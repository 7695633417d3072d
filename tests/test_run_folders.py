"""What a killed server leaves under the temporary directory is removed by the next server that starts
(`modelhost.run_folders`); a server that stops cleanly leaves nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelhost.run_folders import OWNER, remove_orphans
from tests.server_process import ServerProcess


@pytest.fixture
def temp() -> Iterator[Path]:
    """A temporary directory of the servers' own, short (their sockets' paths live in it)."""
    folder = Path(tempfile.mkdtemp(prefix="mh-tmp-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_server_removes_the_run_folder_a_killed_server_left(
    temp: Path, tmp_path: Path, sqlite_url: str
) -> None:
    server = ServerProcess(tmp_path / "data", sqlite_url, TMPDIR=str(temp))
    server.start()
    [left] = list(temp.glob("modelhost-*"))
    assert (left / "metrics").is_dir()
    server.kill()
    assert left.is_dir()  # SIGKILL: nothing of the server ran
    server.start()
    assert not left.exists()
    server.terminate()
    assert list(temp.glob("modelhost-*")) == []  # a clean stop leaves nothing


def test_only_folders_whose_owner_is_gone_are_removed(temp: Path) -> None:
    ended = subprocess.Popen(["true"])
    ended.wait()

    def folder(name: str, owner: str | None) -> Path:
        made = temp / name
        made.mkdir()
        if owner is not None:
            (made / OWNER).write_text(owner)
        return made

    killed = folder("modelhost-replicas-dead", str(ended.pid))
    running = folder("modelhost-alive", str(os.getpid()))
    older = folder("modelhost-older", None)  # made before folders named their owner
    garbled = folder("modelhost-garbled", "not a pid")
    other = folder("someone-else", str(ended.pid))
    assert remove_orphans(temp) == 1
    assert not killed.exists()
    assert all(f.exists() for f in (running, older, garbled, other))
