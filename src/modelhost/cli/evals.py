"""`modelhost evals`: OpenAI's Evals API (docs/evals.md) from a terminal.

An eval and a run's data source are JSON objects as the API takes them (OpenAI's shapes), kept in files
a team versions beside its test set: `evals create capitals.json` makes the eval, `evals run EVAL
source.json --model my-chat --wait` grades a deployment and prints each criterion's pass rate, `evals
results` each item's. `--json` prints the objects as the API answers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import typer

from modelhost.cli.batches import drop_none, present
from modelhost.cli.client import ApiClient, watch, when_changed
from modelhost.cli.options import DEFAULT_URL, AccountKey, Json, PageLimit, Url
from modelhost.cli.output import out, show

evals_app = typer.Typer(
    help="Evals of your account: grade a deployment on your own test set (OpenAI's Evals API).",
    no_args_is_help=True,
)

EVAL_COLUMNS = ("id", "name", "criteria", "created_at")
RUN_COLUMNS = ("id", "status", "model", "total", "passed", "failed", "errored", "created_at")
ITEM_COLUMNS = ("id", "item", "status", "results")
ENDED = ("completed", "canceled", "failed")  # a run in these states changes no more

EvalId = Annotated[str, typer.Argument(help="Eval ID (eval_...).")]
RunId = Annotated[str, typer.Argument(help="Run ID (evalrun_...).")]
JsonFile = Annotated[Path, typer.Argument(help="A JSON file.", exists=True, dir_okay=False)]
After = Annotated[
    str | None,
    typer.Option(help="List those after this ID (the last of the previous page).", show_default=False),
]


def _read(path: Path) -> dict[str, Any]:
    """A JSON object from a file; a clear error (exit 2) for anything else."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise typer.BadParameter(f"{path} is not a JSON file: {exc}") from exc
    if not isinstance(data, dict):
        raise typer.BadParameter(f"{path} holds a JSON {type(data).__name__}, not an object")
    return data


def _runs_path(eval_id: str, run_id: str | None = None) -> str:
    path = f"/v1/evals/{quote(eval_id, safe='')}/runs"
    return path if run_id is None else f"{path}/{quote(run_id, safe='')}"


@evals_app.command("create")
def evals_create(
    definition: Annotated[
        Path,
        typer.Argument(
            help="The eval as a JSON object: name, data_source_config, testing_criteria, metadata.",
            exists=True,
            dir_okay=False,
        ),
    ],
    url: Url = DEFAULT_URL,
    key: AccountKey = None,
    as_json: Json = False,
) -> None:
    """Create an eval from a JSON file (what it grades and how, as OpenAI's API takes it)."""
    _show_eval(ApiClient(url, key).call("POST", "/v1/evals", json=_read(definition)), as_json)


@evals_app.command("list")
def evals_list(
    after: After = None,
    limit: PageLimit = 20,
    url: Url = DEFAULT_URL,
    key: AccountKey = None,
    as_json: Json = False,
) -> None:
    """List evals, newest first."""
    params = drop_none({"after": after, "limit": limit, "order": "desc"})
    _show_eval(ApiClient(url, key).call("GET", "/v1/evals", params=params), as_json)


@evals_app.command("get")
def evals_get(eval_id: EvalId, url: Url = DEFAULT_URL, key: AccountKey = None, as_json: Json = False) -> None:
    """Show an eval and its testing criteria."""
    data = ApiClient(url, key).call("GET", f"/v1/evals/{quote(eval_id, safe='')}")
    _show_eval(data, as_json)
    if not as_json:
        for criterion in data.get("testing_criteria") or []:
            out.print(
                f"criterion {criterion.get('name')}: {criterion.get('type')}", markup=False, highlight=False
            )


@evals_app.command("delete")
def evals_delete(
    eval_id: EvalId, url: Url = DEFAULT_URL, key: AccountKey = None, as_json: Json = False
) -> None:
    """Delete an eval, its runs and their results (a run under way stops)."""
    data = ApiClient(url, key).call("DELETE", f"/v1/evals/{quote(eval_id, safe='')}")
    show(data, ("eval_id", "object", "deleted"), as_json)


@evals_app.command("run")
def evals_run(
    eval_id: EvalId,
    data_source: Annotated[
        Path,
        typer.Argument(
            help="The run's data_source as a JSON object (completions with a template, or jsonl).",
            exists=True,
            dir_okay=False,
        ),
    ],
    model: Annotated[
        str | None,
        typer.Option(help="Sample this deployment (sets data_source.model).", show_default=False),
    ] = None,
    version: Annotated[
        str | None,
        typer.Option(
            help="Sample this version (artifact ID) of the deployment, whatever its rollout's split.",
            show_default=False,
        ),
    ] = None,
    name: Annotated[str | None, typer.Option(help="The run's name.", show_default=False)] = None,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait",
            help="Wait until the run ends, printing its progress (on stderr), then each criterion's pass "
            "rate; exit 1 unless it completed. Ctrl-C stops the waiting, not the run.",
        ),
    ] = False,
    every: Annotated[float, typer.Option("--every", min=0.1, help="Seconds between two looks.")] = 2.0,
    url: Url = DEFAULT_URL,
    key: AccountKey = None,
    as_json: Json = False,
) -> None:
    """Start a run of an eval on a data source: a deployment's answers graded by the eval's criteria."""
    source = _read(data_source)
    source |= drop_none({"model": model, "artifact_id": version})
    api = ApiClient(url, key)
    run = api.call("POST", _runs_path(eval_id), json=drop_none({"data_source": source, "name": name}))
    if wait:
        run = _wait_until_ended(api, eval_id, run, every)
    _show_run(run, as_json)
    if wait and run["status"] != "completed":
        raise typer.Exit(1)


@evals_app.command("runs")
def evals_runs(
    eval_id: EvalId,
    after: After = None,
    limit: PageLimit = 20,
    url: Url = DEFAULT_URL,
    key: AccountKey = None,
    as_json: Json = False,
) -> None:
    """List an eval's runs, newest first."""
    params = drop_none({"after": after, "limit": limit, "order": "desc"})
    _show_run(ApiClient(url, key).call("GET", _runs_path(eval_id), params=params), as_json)


@evals_app.command("run-get")
def evals_run_get(
    eval_id: EvalId, run_id: RunId, url: Url = DEFAULT_URL, key: AccountKey = None, as_json: Json = False
) -> None:
    """Show a run: its status, counts and each criterion's pass rate."""
    _show_run(ApiClient(url, key).call("GET", _runs_path(eval_id, run_id)), as_json)


@evals_app.command("cancel")
def evals_cancel(
    eval_id: EvalId, run_id: RunId, url: Url = DEFAULT_URL, key: AccountKey = None, as_json: Json = False
) -> None:
    """Cancel a run: the items graded so far are kept."""
    _show_run(ApiClient(url, key).call("POST", _runs_path(eval_id, run_id)), as_json)


@evals_app.command("results")
def evals_results(
    eval_id: EvalId,
    run_id: RunId,
    status: Annotated[
        str | None, typer.Option(help="Only items that pass, fail or error.", show_default=False)
    ] = None,
    after: After = None,
    limit: PageLimit = 100,
    url: Url = DEFAULT_URL,
    key: AccountKey = None,
    as_json: Json = False,
) -> None:
    """List a run's items: each one's status and its score per criterion."""
    params = drop_none({"status": status, "after": after, "limit": limit, "order": "asc"})
    data = ApiClient(url, key).call("GET", f"{_runs_path(eval_id, run_id)}/output_items", params=params)
    if as_json:
        show(data, ITEM_COLUMNS, True)
        return
    rows = [
        {
            "id": item["id"],
            "item": item["datasource_item_id"],
            "status": item["status"],
            "results": ", ".join(_result(r) for r in item.get("results") or []),
        }
        for item in data["data"]
    ]
    show(rows, ITEM_COLUMNS, False)
    if data.get("has_more"):
        out.print(f"more: --after {data['last_id']}", markup=False, highlight=False)


def _result(result: dict[str, Any]) -> str:
    """`close 0.82 pass`: one criterion's grade of an item."""
    score = result.get("score")
    shown = f"{score:.3g}" if isinstance(score, int | float) else "-"
    return f"{result.get('name')} {shown} {'pass' if result.get('passed') else 'fail'}"


def _wait_until_ended(api: ApiClient, eval_id: str, run: dict[str, Any], every: float) -> dict[str, Any]:
    """Look at the run every `every` seconds until it ends; each change of its progress is a line on
    stderr."""
    path = _runs_path(eval_id, run["id"])
    return watch(run, lambda _: api.call("GET", path), when_changed(_progress), ENDED, every)


def _progress(run: dict[str, Any]) -> str:
    """`evalrun_...: in_progress, 3/8 items graded`."""
    counts = run.get("result_counts") or {}
    graded = sum(counts.get(k, 0) for k in ("passed", "failed", "errored"))
    return f"{run['id']}: {run['status']}, {graded}/{counts.get('total', 0)} items graded"


def _show_eval(data: dict[str, Any], as_json: bool) -> None:
    """An eval (or a page of them); in a table, how many criteria each has."""
    present(data, EVAL_COLUMNS, as_json, lambda e: {**e, "criteria": len(e.get("testing_criteria") or [])})


def _show_run(data: dict[str, Any], as_json: bool) -> None:
    """A run (or a page of runs) in a table: its counts as columns; a single run's criteria after it,
    each with its pass rate, and its error where it failed."""
    present(data, RUN_COLUMNS, as_json, lambda run: {**run, **(run.get("result_counts") or {})})
    if as_json or data.get("object") == "list":
        return
    for criterion in data.get("per_testing_criteria_results") or []:
        passed, failed = criterion["passed"], criterion["failed"]
        rate = passed / (passed + failed) if passed + failed else 0.0
        out.print(
            f"{criterion['testing_criteria']}: {passed}/{passed + failed} passed ({rate:.0%})",
            markup=False,
            highlight=False,
        )
    if data.get("error"):
        out.print(f"error: {data['error'].get('message')}", soft_wrap=True, markup=False, highlight=False)
