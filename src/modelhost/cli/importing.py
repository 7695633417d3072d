"""`modelhost artifacts import`: the server fetches an artifact from S3, HTTPS or a Hub; the CLI starts
the import and follows it with the same progress bar as a push."""

from __future__ import annotations

import time
from typing import Any

from modelhost.cli.client import ApiClient
from modelhost.cli.output import out
from modelhost.cli.push import _progress, find_or_create_artifact

POLL_SECONDS = 0.5
FINAL = ("completed", "failed", "cancelled")


def name_of(source: str) -> str:
    """A default display name: the source's last path segment (`s3://b/models/bert` → `bert`)."""
    rest = source.split("://", 1)[-1].split("@", 1)[0].rstrip("/")
    return rest.rsplit("/", 1)[-1] or rest


def import_artifact(
    api: ApiClient,
    source: str | list[str],
    name: str,
    pipeline: str,
    include: list[str] | None,
    exclude: list[str] | None,
    credentials: dict[str, Any] | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Start the import (or follow the one already filling the artifact `name`) until it ends; returns
    the import and the artifact as they end."""
    artifact = find_or_create_artifact(api, name, pipeline)
    base = f"/v1/model-artifacts/{artifact['id']}/imports"
    if artifact["status"] == "ingesting" and artifact.get("import_id"):
        out.print(f"following import {artifact['import_id']}")
        started = api.call("GET", f"{base}/{artifact['import_id']}")
    else:
        body: dict[str, Any] = {"source": source, "include": include, "exclude": exclude}
        if credentials is not None:
            body["credentials"] = credentials
        started = api.call("POST", base, json=body)
    shown = follow(api, f"{base}/{started['id']}")
    return shown, api.call("GET", f"/v1/model-artifacts/{artifact['id']}")


def follow(api: ApiClient, path: str) -> dict[str, Any]:
    """Poll the import, its bytes and files on a progress bar, until it ends."""
    with _progress() as progress:
        task = progress.add_task("listing files", total=None)
        while True:
            shown: dict[str, Any] = api.call("GET", path)
            files = shown["files"]
            done = sum(1 for f in files if f["status"] == "done")
            description = (
                f"importing {done}/{len(files)} files" if files else f"{shown['status']}: listing files"
            )
            progress.update(
                task, description=description, total=shown["bytes_total"], completed=shown["bytes_done"]
            )
            if shown["status"] in FINAL:
                return shown
            time.sleep(POLL_SECONDS)
