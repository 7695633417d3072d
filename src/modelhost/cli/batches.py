"""`modelhost files` and `modelhost batches`: the Files and Batch APIs (docs/batch.md) from a terminal.

A batch is a JSONL file of requests, uploaded first (`batches create requests.jsonl` uploads it and
creates the batch in one step); the server answers its lines at low priority and writes an output and
an error file, which `files download` fetches. The objects are OpenAI's: `--json` prints them as the API
answers; tables show their Unix times as UTC dates and a batch's request counts as columns of their own.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, get_args
from urllib.parse import quote

import typer

from modelhost.cli.client import ApiClient, watch, when_changed
from modelhost.cli.options import DEFAULT_URL, AccountKey, Json, PageLimit, Url
from modelhost.cli.output import out, show
from modelhost.protocol.batches import BatchEndpoint

files_app = typer.Typer(
    help="Files of your account (a batch's input, output and errors).", no_args_is_help=True
)
batches_app = typer.Typer(
    help="Batches of your account: a file of requests answered at low priority.", no_args_is_help=True
)

FILE_COLUMNS = ("id", "filename", "purpose", "bytes", "created_at", "expires_at")
BATCH_COLUMNS = (
    "id",
    "status",
    "endpoint",
    "model",
    "completed",
    "failed",
    "total",
    "output_file_id",
    "error_file_id",
    "created_at",
)
ENDED = ("completed", "failed", "expired", "cancelled")  # a batch in these states changes no more
ENDPOINTS = ", ".join(get_args(BatchEndpoint))
TRANSFER_SECONDS = 600.0  # a batch's file may be hundreds of MB

FileId = Annotated[str, typer.Argument(help="File ID (file_...).")]
BatchId = Annotated[str, typer.Argument(help="Batch ID (batch_...).")]
After = Annotated[
    str | None,
    typer.Option(help="List those after this ID (the last of the previous page).", show_default=False),
]
Wait = Annotated[
    bool,
    typer.Option(
        "--wait",
        help="Wait until the batch ends, printing its progress (on stderr); exit 1 unless it completed. "
        "Ctrl-C stops the waiting, not the batch.",
    ),
]
Every = Annotated[float, typer.Option("--every", min=0.1, help="Seconds between two looks, with --wait.")]


# ------------------------------------------------------------------------------------------ files


@files_app.command("upload")
def files_upload(
    path: Annotated[Path, typer.Argument(help="The file to upload.", exists=True, dir_okay=False)],
    purpose: Annotated[
        str, typer.Option(help="OpenAI's purpose; batch input is checked as JSONL.")
    ] = "batch",
    expires_after: Annotated[
        int | None,
        typer.Option(
            help="Delete it this many seconds after its upload (3600 to 2592000).", show_default=False
        ),
    ] = None,
    url: Url = DEFAULT_URL,
    key: AccountKey = None,
    as_json: Json = False,
) -> None:
    """Upload a file (for a batch: a JSONL file of requests, checked by the server)."""
    uploaded = upload(ApiClient(url, key, TRANSFER_SECONDS), path, purpose, expires_after)
    present(uploaded, FILE_COLUMNS, as_json)


def upload(api: ApiClient, path: Path, purpose: str, expires_after: int | None) -> dict[str, Any]:
    """`POST /v1/files` as the openai SDK sends it: multipart, the file streamed from disk."""
    form = {"purpose": purpose}
    if expires_after is not None:
        form |= {"expires_after[anchor]": "created_at", "expires_after[seconds]": str(expires_after)}
    with path.open("rb") as content:
        uploaded: dict[str, Any] = api.call(
            "POST", "/v1/files", data=form, files={"file": (path.name, content)}
        )
    return uploaded


@files_app.command("list")
def files_list(
    purpose: Annotated[
        str | None, typer.Option(help="Only this purpose (batch, batch_output, ...).", show_default=False)
    ] = None,
    after: After = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="At most this many.")] = 100,
    order: Annotated[str, typer.Option(help="desc (newest first) or asc.")] = "desc",
    url: Url = DEFAULT_URL,
    key: AccountKey = None,
    as_json: Json = False,
) -> None:
    """List files: those uploaded, and batches' output and error files (purpose batch_output)."""
    params = drop_none({"purpose": purpose, "after": after, "limit": limit, "order": order})
    present(ApiClient(url, key).call("GET", "/v1/files", params=params), FILE_COLUMNS, as_json)


@files_app.command("get")
def files_get(file_id: FileId, url: Url = DEFAULT_URL, key: AccountKey = None, as_json: Json = False) -> None:
    """Show a file's object."""
    present(ApiClient(url, key).call("GET", f"/v1/files/{quote(file_id, safe='')}"), FILE_COLUMNS, as_json)


@files_app.command("download")
def files_download(
    file_id: FileId,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="Write it here (default, or -: standard output).", show_default=False
        ),
    ] = None,
    url: Url = DEFAULT_URL,
    key: AccountKey = None,
) -> None:
    """Write a file's content to a path or to standard output (a batch's output: one JSON line each)."""
    api = ApiClient(url, key, TRANSFER_SECONDS)
    path = f"/v1/files/{quote(file_id, safe='')}/content"
    if output is None or str(output) == "-":
        sink = typer.get_binary_stream("stdout")
        with api.stream("GET", path) as response:
            for chunk in response.iter_bytes():
                sink.write(chunk)
        sink.flush()
        return
    # Into a side file renamed at the end: a transfer cut short leaves no half file under the name asked.
    part = output.with_name(output.name + ".part")
    try:
        with api.stream("GET", path) as response, part.open("wb") as sink:
            for chunk in response.iter_bytes():
                sink.write(chunk)
        part.replace(output)
    finally:
        part.unlink(missing_ok=True)
    out.print(f"{output.stat().st_size} bytes written to {output}", markup=False, highlight=False)


@files_app.command("delete")
def files_delete(
    file_id: FileId, url: Url = DEFAULT_URL, key: AccountKey = None, as_json: Json = False
) -> None:
    """Delete a file and its bytes (a batch made from it keeps its own copy)."""
    data = ApiClient(url, key).call("DELETE", f"/v1/files/{quote(file_id, safe='')}")
    show(data, ("id", "object", "deleted"), as_json)


# ---------------------------------------------------------------------------------------- batches


@batches_app.command("create")
def batches_create(
    endpoint: Annotated[str, typer.Option(help=f"Where every line goes: {ENDPOINTS}.")],
    input_path: Annotated[
        Path | None,
        typer.Argument(
            help="A local JSONL file of requests: uploaded first.",
            exists=True,
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
    input_file_id: Annotated[
        str | None,
        typer.Option("--input-file-id", help="An uploaded file instead (file_...).", show_default=False),
    ] = None,
    metadata: Annotated[
        list[str] | None, typer.Option("--metadata", help="A label, as key=value (repeatable, up to 16).")
    ] = None,
    output_expires_after: Annotated[
        int | None,
        typer.Option(help="Delete its output and error files this many seconds after.", show_default=False),
    ] = None,
    wait: Wait = False,
    every: Every = 2.0,
    url: Url = DEFAULT_URL,
    key: AccountKey = None,
    as_json: Json = False,
) -> None:
    """Create a batch from a JSONL file (a local path, uploaded first, or --input-file-id)."""
    if (input_path is None) == (input_file_id is None):
        raise typer.BadParameter("give a local JSONL file or --input-file-id (one of them)")
    body: dict[str, Any] = {"endpoint": endpoint, "completion_window": "24h"}
    if metadata:
        body["metadata"] = labels(metadata)
    if output_expires_after is not None:
        body["output_expires_after"] = {"anchor": "created_at", "seconds": output_expires_after}
    api = ApiClient(url, key, TRANSFER_SECONDS)
    if input_path is not None:
        input_file_id = upload(api, input_path, "batch", None)["id"]
        if not as_json:
            out.print(f"uploaded {input_path.name} as {input_file_id}", markup=False, highlight=False)
    batch = api.call("POST", "/v1/batches", json={"input_file_id": input_file_id, **body})
    finish(api, batch, wait, every, as_json)


def labels(pairs: list[str]) -> dict[str, str]:
    """`--metadata key=value` options as the API's `metadata` object."""
    found = {}
    for pair in pairs:
        name, equals, value = pair.partition("=")
        if not equals or not name:
            raise typer.BadParameter(f"{pair!r} is not key=value", param_hint="'--metadata'")
        found[name] = value
    return found


@batches_app.command("get")
def batches_get(
    batch_id: BatchId,
    wait: Wait = False,
    every: Every = 2.0,
    url: Url = DEFAULT_URL,
    key: AccountKey = None,
    as_json: Json = False,
) -> None:
    """Show a batch: its status, request counts and files; with --wait, once it has ended."""
    api = ApiClient(url, key)
    finish(api, api.call("GET", f"/v1/batches/{quote(batch_id, safe='')}"), wait, every, as_json)


@batches_app.command("list")
def batches_list(
    after: After = None,
    limit: PageLimit = 20,
    url: Url = DEFAULT_URL,
    key: AccountKey = None,
    as_json: Json = False,
) -> None:
    """List batches, newest first."""
    params = drop_none({"after": after, "limit": limit})
    present(ApiClient(url, key).call("GET", "/v1/batches", params=params), BATCH_COLUMNS, as_json)


@batches_app.command("cancel")
def batches_cancel(
    batch_id: BatchId, url: Url = DEFAULT_URL, key: AccountKey = None, as_json: Json = False
) -> None:
    """Cancel a batch: the lines in flight finish, the answers so far go to its files."""
    path = f"/v1/batches/{quote(batch_id, safe='')}/cancel"
    present(ApiClient(url, key).call("POST", path), BATCH_COLUMNS, as_json)


def finish(api: ApiClient, batch: dict[str, Any], wait: bool, every: float, as_json: bool) -> None:
    """Show the batch (once it has ended, with --wait) and why it failed; --wait exits 1 unless it
    completed, so that a script can chain on it."""
    if wait:
        batch = wait_until_ended(api, batch, every)
    present(batch, BATCH_COLUMNS, as_json)
    if not as_json:
        for error in (batch.get("errors") or {}).get("data") or []:
            out.print(f"error: {describe_error(error)}", soft_wrap=True, markup=False, highlight=False)
    if wait and batch["status"] != "completed":
        raise typer.Exit(1)


def wait_until_ended(api: ApiClient, batch: dict[str, Any], every: float) -> dict[str, Any]:
    """Look at the batch every `every` seconds until it ends; each change of its progress is a line on
    stderr."""
    path = f"/v1/batches/{quote(batch['id'], safe='')}"
    return watch(batch, lambda _: api.call("GET", path), when_changed(progress), ENDED, every)


def progress(batch: dict[str, Any]) -> str:
    """`batch_...: in_progress, 420/1000 lines done (420 completed, 0 failed)`."""
    counts = batch["request_counts"] or {"total": 0, "completed": 0, "failed": 0}
    done = counts["completed"] + counts["failed"]
    return (
        f"{batch['id']}: {batch['status']}, {done}/{counts['total']} lines done "
        f"({counts['completed']} completed, {counts['failed']} failed)"
    )


def describe_error(error: dict[str, Any]) -> str:
    """One of a failed batch's `errors`: `line 2: <message> (model_not_found, body.model)`."""
    where = f"line {error['line']}: " if error.get("line") is not None else ""
    why = ", ".join(str(error[part]) for part in ("code", "param") if error.get(part))
    return f"{where}{error.get('message')}" + (f" ({why})" if why else "")


# ----------------------------------------------------------------------------------------- tables


def present(
    data: dict[str, Any],
    columns: tuple[str, ...],
    as_json: bool,
    row: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> None:
    """`show` for the OpenAI objects (one, or a page of them): JSON as answered; in a table, each item
    through `row` (what a kind of object adds as columns: a run's counts), then Unix times as UTC dates
    and a batch's `request_counts` as columns, and where a list has more, how to get the next page."""
    if as_json:
        show(data, columns, True)
        return
    items = data["data"] if data.get("object") == "list" else [data]
    show([table_row(row(item) if row else item) for item in items], columns, False)
    if data.get("has_more"):
        out.print(f"more: --after {data['last_id']}", markup=False, highlight=False)


def table_row(item: dict[str, Any]) -> dict[str, Any]:
    times = {
        name: datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        for name, value in item.items()
        if name.endswith("_at") and isinstance(value, int)
    }
    return {**item, **(item.get("request_counts") or {}), **times}


def drop_none(params: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in params.items() if value is not None}
