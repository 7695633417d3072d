"""`modelhost fine-tune`: OpenAI's fine-tuning jobs (docs/fine-tuning.md) from a terminal.

`fine-tune create train.jsonl --model qwen-base` uploads the dataset (purpose `fine-tune`) and creates
the job in one step; `--wait` follows it to its end, each step's losses on stderr. The objects are
OpenAI's: `--json` prints them as the API answers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import typer

from modelhost.cli.batches import TRANSFER_SECONDS, After, drop_none, labels, present, upload
from modelhost.cli.client import ApiClient, err, watch
from modelhost.cli.options import DEFAULT_URL, AccountKey, Json, PageLimit, Url

fine_tune_app = typer.Typer(
    help="Fine-tuning jobs of your account: LoRA adapters trained on a deployment's base.",
    no_args_is_help=True,
)

JOB_COLUMNS = (
    "id",
    "status",
    "model",
    "fine_tuned_model",
    "step",
    "total_steps",
    "created_at",
    "finished_at",
)
EVENT_COLUMNS = ("created_at", "level", "message")
CHECKPOINT_COLUMNS = ("id", "step_number", "fine_tuned_model_checkpoint", "created_at")
ENDED = ("succeeded", "failed", "cancelled")
JobId = Annotated[str, typer.Argument(help="Fine-tuning job ID (ftjob_...).")]
Wait = Annotated[
    bool,
    typer.Option(
        "--wait",
        help="Wait until the job ends, printing its steps (on stderr); exit 1 unless it succeeded. "
        "Ctrl-C stops the waiting, not the job.",
    ),
]
Every = Annotated[float, typer.Option("--every", min=0.1, help="Seconds between two looks, with --wait.")]


def _path(job_id: str, tail: str = "") -> str:
    return f"/v1/fine_tuning/jobs/{quote(job_id, safe='')}{tail}"


@fine_tune_app.command("create")
def create(
    training: Annotated[
        Path | None,
        typer.Argument(
            help="A local JSONL dataset: uploaded first.", exists=True, dir_okay=False, show_default=False
        ),
    ] = None,
    model: Annotated[str, typer.Option(help="The base: a deployment that can serve adapters.")] = "",
    training_file: Annotated[
        str | None,
        typer.Option("--training-file", help="An uploaded file instead (file_...).", show_default=False),
    ] = None,
    validation: Annotated[
        Path | None,
        typer.Option(
            help="A local JSONL validation set: uploaded first.",
            exists=True,
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
    suffix: Annotated[
        str | None, typer.Option(help="The fine-tuned model's suffix.", show_default=False)
    ] = None,
    epochs: Annotated[
        int | None, typer.Option(min=1, help="n_epochs (default: auto).", show_default=False)
    ] = None,
    batch_size: Annotated[int | None, typer.Option(min=1, help="Default: auto.", show_default=False)] = None,
    learning_rate_multiplier: Annotated[
        float | None, typer.Option(help="Default: auto.", show_default=False)
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Default: random.", show_default=False)] = None,
    metadata: Annotated[
        list[str] | None, typer.Option("--metadata", help="A label, as key=value (repeatable, up to 16).")
    ] = None,
    deploy: Annotated[
        bool, typer.Option("--deploy", help="Deploy the adapter on its base once trained.")
    ] = False,
    wait: Wait = False,
    every: Every = 2.0,
    url: Url = DEFAULT_URL,
    key: AccountKey = None,
    as_json: Json = False,
) -> None:
    """Create a fine-tuning job from a JSONL dataset (a local path, uploaded first, or --training-file)."""
    if (training is None) == (training_file is None):
        raise typer.BadParameter("give a local JSONL dataset or --training-file (one of them)")
    if not model:
        raise typer.BadParameter("name the base with --model")
    api = ApiClient(url, key, TRANSFER_SECONDS)
    if training is not None:
        training_file = upload(api, training, "fine-tune", None)["id"]
    hyper = drop_none(
        {"n_epochs": epochs, "batch_size": batch_size, "learning_rate_multiplier": learning_rate_multiplier}
    )
    body: dict[str, Any] = drop_none(
        {
            "model": model,
            "training_file": training_file,
            "suffix": suffix,
            "seed": seed,
            "validation_file": upload(api, validation, "fine-tune", None)["id"] if validation else None,
            "metadata": labels(metadata) if metadata else None,
            "method": {"type": "supervised", "supervised": {"hyperparameters": hyper}},
        }
    )
    if deploy:
        body["deploy"] = True
    _finish(api, api.call("POST", "/v1/fine_tuning/jobs", json=body), wait, every, as_json)


@fine_tune_app.command("list")
def list_jobs(
    after: After = None,
    limit: PageLimit = 20,
    url: Url = DEFAULT_URL,
    key: AccountKey = None,
    as_json: Json = False,
) -> None:
    """List fine-tuning jobs, newest first."""
    params = drop_none({"after": after, "limit": limit})
    present(ApiClient(url, key).call("GET", "/v1/fine_tuning/jobs", params=params), JOB_COLUMNS, as_json)


@fine_tune_app.command("get")
def get(
    job_id: JobId,
    wait: Wait = False,
    every: Every = 2.0,
    url: Url = DEFAULT_URL,
    key: AccountKey = None,
    as_json: Json = False,
) -> None:
    """Show a job; with --wait, once it has ended."""
    api = ApiClient(url, key)
    _finish(api, api.call("GET", _path(job_id)), wait, every, as_json)


@fine_tune_app.command("events")
def events(
    job_id: JobId,
    limit: PageLimit = 20,
    url: Url = DEFAULT_URL,
    key: AccountKey = None,
    as_json: Json = False,
) -> None:
    """A job's events, newest first: messages and each step's losses."""
    page = ApiClient(url, key).call("GET", _path(job_id, "/events"), params={"limit": limit})
    present(page, EVENT_COLUMNS, as_json)


@fine_tune_app.command("checkpoints")
def checkpoints(job_id: JobId, url: Url = DEFAULT_URL, key: AccountKey = None, as_json: Json = False) -> None:
    """A job's checkpoints, newest first."""
    present(ApiClient(url, key).call("GET", _path(job_id, "/checkpoints")), CHECKPOINT_COLUMNS, as_json)


def _move(action: str) -> Any:
    def command(job_id: JobId, url: Url = DEFAULT_URL, key: AccountKey = None, as_json: Json = False) -> None:
        present(ApiClient(url, key).call("POST", _path(job_id, f"/{action}")), JOB_COLUMNS, as_json)

    return command


fine_tune_app.command("cancel", help="Cancel a queued, running or paused job.")(_move("cancel"))
fine_tune_app.command("pause", help="Pause a job: it keeps its checkpoints.")(_move("pause"))
fine_tune_app.command("resume", help="Resume a paused job from its last checkpoint.")(_move("resume"))


def _finish(api: ApiClient, job: dict[str, Any], wait: bool, every: float, as_json: bool) -> None:
    if wait:
        job = _wait(api, job, every)
    present(job, JOB_COLUMNS, as_json)
    if not as_json and job.get("error"):
        error = job["error"]
        err.print(
            f"error: {error['message']} ({error['code']})", soft_wrap=True, markup=False, highlight=False
        )
    if wait and job["status"] != "succeeded":
        raise typer.Exit(1)


def _wait(api: ApiClient, job: dict[str, Any], every: float) -> dict[str, Any]:
    """Look every `every` seconds until the job ends; each new event is a line on stderr."""
    seen: set[str] = set()

    def new_events(current: dict[str, Any]) -> list[str]:
        page = api.call("GET", _path(current["id"], "/events"), params={"limit": 100})
        fresh = [event for event in reversed(page["data"]) if event["id"] not in seen]
        seen.update(event["id"] for event in fresh)
        return [f"{current['id']}: {event['message']}" for event in fresh]

    return watch(job, lambda current: api.call("GET", _path(current["id"])), new_events, ENDED, every)
