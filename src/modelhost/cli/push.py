"""`modelhost artifacts push`: the whole upload protocol from a folder, resumable, with progress."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from modelhost.cli.client import ApiClient, err
from modelhost.cli.output import out

SKIPPED_DIRS = {".git", ".cache", "__pycache__"}
CHUNK = 1024 * 1024


@dataclass(frozen=True)
class LocalFile:
    path: str
    full: Path
    size: int


def local_files(directory: Path) -> list[LocalFile]:
    """Every file below `directory`, with POSIX relative paths, skipping VCS and cache folders."""
    found = []
    for full in sorted(directory.rglob("*")):
        relative = full.relative_to(directory)
        if full.is_file() and not SKIPPED_DIRS.intersection(relative.parts[:-1]):
            found.append(LocalFile(relative.as_posix(), full, full.stat().st_size))
    return found


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def find_or_create_artifact(api: ApiClient, name: str, pipeline: str) -> dict[str, Any]:
    """Reuse the newest artifact with this name and pipeline (to resume or re-upload), else create one."""
    listed = api.call("GET", "/v1/model-artifacts")["data"]
    same = [a for a in listed if a["display_name"] == name and a["pipeline"] == pipeline]
    if same:
        artifact: dict[str, Any] = same[-1]
        return artifact
    created: dict[str, Any] = api.call(
        "POST", "/v1/model-artifacts", json={"display_name": name, "pipeline": pipeline}
    )
    return created


def open_session(api: ApiClient, artifact: dict[str, Any]) -> str:
    if artifact["status"] == "ingesting" and artifact.get("upload_id"):
        out.print(f"resuming upload session {artifact['upload_id']}")
        return str(artifact["upload_id"])
    started = api.call("POST", f"/v1/model-artifacts/{artifact['id']}/uploads")
    return str(started["upload_id"])


def push(api: ApiClient, directory: Path, name: str, pipeline: str) -> dict[str, Any]:
    """Upload `directory` as artifact `name`; returns the completed artifact (ready or failed)."""
    files = local_files(directory)
    artifact = find_or_create_artifact(api, name, pipeline)
    upload_id = open_session(api, artifact)
    base = f"/v1/model-artifacts/{artifact['id']}/uploads/{upload_id}"
    already = {f["path"]: f["sha256"] for f in api.call("GET", base)["files"]}
    total = sum(f.size for f in files)
    with _progress() as progress:
        task = progress.add_task(f"uploading 0/{len(files)} files", total=total)
        skipped = 0
        for done, item in enumerate(files, start=1):
            digest = sha256_of(item.full)
            if already.get(item.path) == digest:
                skipped += 1
                progress.advance(task, item.size)
            else:
                api.call(
                    "PUT",
                    f"{base}/files/{item.path}",
                    content=_read_chunks(item.full, lambda n: progress.advance(task, n)),
                    headers={"X-Content-SHA256": digest, "Content-Length": str(item.size)},
                )
            progress.update(task, description=f"uploading {done}/{len(files)} files")
    if skipped:
        out.print(f"skipped {skipped} file(s) already uploaded with the same SHA-256")
    out.print("inspecting...")
    finished: dict[str, Any] = api.call("POST", f"{base}/complete")
    return finished


def _read_chunks(path: Path, advance: Any) -> Iterator[bytes]:
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            advance(len(chunk))
            yield chunk


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=False,
    )
