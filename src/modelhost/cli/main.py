"""`modelhost`: run the server, manage the database, and drive the API from a terminal."""

from __future__ import annotations

import json
import os
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import quote

import typer

from modelhost.cli.audit import audit_app
from modelhost.cli.batches import batches_app, files_app
from modelhost.cli.client import ApiClient
from modelhost.cli.evals import evals_app
from modelhost.cli.fine_tuning import fine_tune_app
from modelhost.cli.generation import (
    ChatTemplate,
    ChatTemplateKwargs,
    FairTokenWeights,
    MaxModelLen,
    ReasoningParser,
    Reset,
    ToolParser,
    settings_body,
    show_settings,
)
from modelhost.cli.mcp_servers import mcp_servers_app
from modelhost.cli.options import DEFAULT_URL, AccountKey, AdminKey, Json, Url
from modelhost.cli.output import out, show
from modelhost.cli.rollouts import (
    GateEval,
    GateMargin,
    GateMaxErrorRate,
    GateMaxTtft,
    GateMinRequests,
    GateSteps,
    GateStepSeconds,
    gate_body,
    show_rollout,
)
from modelhost.cli.session import login, logout
from modelhost.cli.users import RoleChoice, users_app, whoami

if TYPE_CHECKING:
    from modelhost.config import Settings

app = typer.Typer(
    help="modelhost: serve your own Hugging Face models over HTTP.",
    no_args_is_help=True,
    rich_markup_mode="rich",
)
db_app = typer.Typer(help="Database schema (Alembic migrations).", no_args_is_help=True)
accounts_app = typer.Typer(help="Accounts (needs the admin key).", no_args_is_help=True)
keys_app = typer.Typer(help="API keys of your account.", no_args_is_help=True)
deployments_app = typer.Typer(help="Deployments of your account.", no_args_is_help=True)
artifacts_app = typer.Typer(help="Model artifacts of your account.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(accounts_app, name="accounts")
app.add_typer(keys_app, name="keys")
app.add_typer(deployments_app, name="deployments")
app.add_typer(artifacts_app, name="artifacts")
app.add_typer(files_app, name="files")
app.add_typer(batches_app, name="batches")
app.add_typer(evals_app, name="evals")
app.add_typer(fine_tune_app, name="fine-tune")
app.add_typer(audit_app, name="audit")
app.add_typer(users_app, name="users")
app.add_typer(mcp_servers_app, name="mcp-servers")
app.command("whoami")(whoami)
app.command("login")(login)
app.command("logout")(logout)

ACCOUNT_COLUMNS = ("id", "name", "credits", "credits_used", "limits", "created_at")
KEY_COLUMNS = (
    "id",
    "name",
    "kind",
    "deployments",
    "prefix",
    "role",
    "limits",
    "created_at",
    "expires_at",
    "revoked_at",
)
Rpm = Annotated[int | None, typer.Option("--rpm", help="Requests per minute (docs/limits.md).")]
Tpm = Annotated[int | None, typer.Option("--tpm", help="Tokens per minute (docs/limits.md).")]
Concurrency = Annotated[int | None, typer.Option("--concurrency", help="Requests at once (docs/limits.md).")]
PerDay = Annotated[float | None, typer.Option("--credits-per-day", help="Spend cap: credits per UTC day.")]
PerMonth = Annotated[
    float | None, typer.Option("--credits-per-month", help="Spend cap: credits per UTC month.")
]


def limits_of(
    rpm: int | None,
    tpm: int | None,
    concurrency: int | None,
    per_day: float | None = None,
    per_month: float | None = None,
) -> dict[str, float | None] | None:
    """The API's `limits` object from the CLI's options; None where none is given."""
    limits: dict[str, float | None] = {
        "requests_per_minute": rpm,
        "tokens_per_minute": tpm,
        "concurrent_requests": concurrency,
        "credits_per_day": per_day,
        "credits_per_month": per_month,
    }
    return limits if any(v is not None for v in limits.values()) else None


ARTIFACT_COLUMNS = ("id", "display_name", "pipeline", "status", "quantization", "size_gb", "updated_at")
USAGE_COLUMNS = ("credits_balance", "credits_used", "credits", "compute_credits", "storage_credits")
ARTIFACT_USAGE_COLUMNS = ("artifact_id", "display_name", "compute_credits", "storage_credits")
DEPLOYMENT_COLUMNS = (
    "id",
    "model",
    "pipeline",
    "readiness",
    "state",
    "replicas",
    "memory_gb",
    "engine_in_use",
    "artifact_id",
    "base_deployment",
)


class EngineName(StrEnum):
    """`--engine`'s choices: the API's `engine` (runtime.engine_choice.ENGINES)."""

    auto = "auto"
    vllm = "vllm"
    llamacpp = "llamacpp"
    onnxruntime = "onnxruntime"
    openvino = "openvino"
    transformers = "transformers"


class PrecisionName(StrEnum):
    """`--precision`'s choices: the API's `precision`."""

    float32 = "float32"
    int8 = "int8"


PRECISION_HELP = (
    "float32, or int8: an encoder on ONNX Runtime quantized, accepted only where its quality probe holds "
    "(measured now: the command waits for the first load)."
)

ENGINE_HELP = (
    "auto (generation: vLLM where installed and it can run the architecture; encoders: ONNX Runtime or "
    "OpenVINO where measured equal and faster), vllm, onnxruntime, openvino or transformers."
)

Workers = Annotated[
    int | None,
    typer.Option(
        "--workers",
        min=1,
        help="Gateway processes serving HTTP on the port (default: MODELHOST_WORKERS, else one per four "
        "cores, 1 to 8). They share every replica: requests from all of them are batched together.",
        show_default=False,
    ),
]


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (default: MODELHOST_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: MODELHOST_PORT).")] = None,
    workers: Workers = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
) -> None:
    """Run the server (applies database migrations first). Ctrl-C / SIGTERM drain it and shut it down."""
    from modelhost.config import get_settings
    from modelhost.server import serve as run_server

    settings = get_settings()
    if settings.admin_key_value is None:
        out.print(
            "[yellow]MODELHOST_ADMIN_KEY is not set: admin routes (account creation) are disabled.[/yellow]"
        )
    _refuse_weak_admin_key(settings)
    run_server(settings, host or settings.host, port or settings.port, _workers(settings, workers), log_level)


@app.command()
def quickstart(
    host: Annotated[str | None, typer.Option(help="Bind address (default: MODELHOST_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: MODELHOST_PORT).")] = None,
    workers: Workers = None,
) -> None:
    """Serve with a ready demo: an account, all-MiniLM-L6-v2 pushed and deployed as `minilm` (hot)."""
    import secrets

    from modelhost.cli.quickstart import run_quickstart
    from modelhost.config import get_settings

    if not os.environ.get("MODELHOST_ADMIN_KEY") and get_settings().admin_key_value is None:
        os.environ["MODELHOST_ADMIN_KEY"] = "mh-admin-" + secrets.token_urlsafe(24)
        get_settings.cache_clear()
    settings = get_settings()
    _refuse_weak_admin_key(settings)
    run_quickstart(settings, host or settings.host, port or settings.port, _workers(settings, workers))


def _refuse_weak_admin_key(settings: Settings) -> None:
    """A server does not start with an admin key that could be guessed (auth.secrets.admin_key_weakness)."""
    from modelhost.auth.secrets import admin_key_weakness

    weakness = None if settings.admin_key_value is None else admin_key_weakness(settings.admin_key_value)
    if weakness is not None:
        out.print(f"[red]The server does not start with a guessable admin key. {weakness}.[/red]")
        raise typer.Exit(2)


def _workers(settings: Settings, given: int | None) -> int:
    from modelhost.server import workers_for

    try:
        return workers_for(settings, given)
    except ValueError as exc:
        out.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc


@db_app.command("upgrade")
def db_upgrade(revision: Annotated[str, typer.Argument(help="Target revision.")] = "head") -> None:
    """Apply migrations to the configured database (MODELHOST_DATABASE_URL)."""
    from modelhost.config import get_settings
    from modelhost.store import migrate
    from modelhost.store.db import Database

    database = Database(get_settings().database_url)
    try:
        migrate.upgrade(database, revision)
        out.print(f"database at revision {migrate.current_revision(database)}")
    finally:
        database.dispose()


@accounts_app.command("create")
def accounts_create(
    name: Annotated[str, typer.Argument(help="Account name.")],
    credits: Annotated[
        float | None,
        typer.Option(help="Initial credits (default: the server's MODELHOST_BILLING_INITIAL_CREDITS)."),
    ] = None,
    rpm: Rpm = None,
    tpm: Tpm = None,
    concurrency: Concurrency = None,
    credits_per_day: PerDay = None,
    credits_per_month: PerMonth = None,
    url: Url = DEFAULT_URL,
    admin_key: AdminKey = None,
    as_json: Json = False,
) -> None:
    """Create an account; prints its first account key (shown once)."""
    body: dict[str, object] = {"name": name} if credits is None else {"name": name, "credits": credits}
    if (limits := limits_of(rpm, tpm, concurrency, credits_per_day, credits_per_month)) is not None:
        body["limits"] = limits
    data = ApiClient(url, admin_key).call("POST", "/v1/admin/accounts", json=body)
    show(data, (*ACCOUNT_COLUMNS, "api_key"), as_json)


@accounts_app.command("credit")
def accounts_credit(
    account_id: Annotated[str, typer.Argument(help="Account ID (acct_...).")],
    credits: Annotated[float, typer.Argument(help="Credits to add; negative for a correction.")],
    url: Url = DEFAULT_URL,
    admin_key: AdminKey = None,
    as_json: Json = False,
) -> None:
    """Top up an account (service resumes at once if it was out of credits)."""
    path = f"/v1/admin/accounts/{quote(account_id, safe='')}/credits"
    show(ApiClient(url, admin_key).call("POST", path, json={"credits": credits}), ACCOUNT_COLUMNS, as_json)


@accounts_app.command("limit")
def accounts_limit(
    account_id: Annotated[str, typer.Argument(help="Account ID (acct_...).")],
    rpm: Rpm = None,
    tpm: Tpm = None,
    concurrency: Concurrency = None,
    credits_per_day: PerDay = None,
    credits_per_month: PerMonth = None,
    url: Url = DEFAULT_URL,
    admin_key: AdminKey = None,
    as_json: Json = False,
) -> None:
    """Set an account's rate limits (replacing them; none given: unlimited)."""
    path = f"/v1/admin/accounts/{quote(account_id, safe='')}"
    body = {"limits": limits_of(rpm, tpm, concurrency, credits_per_day, credits_per_month)}
    show(ApiClient(url, admin_key).call("PATCH", path, json=body), ACCOUNT_COLUMNS, as_json)


@accounts_app.command("list")
def accounts_list(url: Url = DEFAULT_URL, admin_key: AdminKey = None, as_json: Json = False) -> None:
    """List accounts."""
    show(ApiClient(url, admin_key).call("GET", "/v1/admin/accounts"), ACCOUNT_COLUMNS, as_json)


@keys_app.command("create")
def keys_create(
    name: Annotated[str | None, typer.Option(help="A label for the key.")] = None,
    deployment: Annotated[
        list[str] | None,
        typer.Option(
            "--deployment", "-d", help="Scope to this deployment ID (repeatable). None: account key."
        ),
    ] = None,
    rpm: Rpm = None,
    tpm: Tpm = None,
    concurrency: Concurrency = None,
    expires_in: Annotated[
        int | None,
        typer.Option("--expires-in", min=1, help="Seconds until the key stops working.", show_default=False),
    ] = None,
    role: Annotated[
        RoleChoice | None, typer.Option("--role", help="Narrow the key to this role (default: yours).")
    ] = None,
    user: Annotated[
        str | None, typer.Option("--user", help="Another member's key (user_...; needs keys:manage).")
    ] = None,
    service: Annotated[
        bool, typer.Option("--service", help="A service key, owned by no one (needs keys:manage).")
    ] = False,
    weight: KeyWeight = None,
    url: Url = DEFAULT_URL,
    key: AccountKey = None,
    as_json: Json = False,
) -> None:
    """Create a key; prints its secret (shown once). Its limits may not exceed the account's."""
    body: dict[str, object] = {"name": name, "service": service}
    if weight is not None:
        body["weight"] = weight
    if role is not None:
        body["role"] = role.value
    if user is not None:
        body["user_id"] = user
    if deployment:
        body["deployments"] = deployment
    if expires_in is not None:
        body["expires_in"] = expires_in
    if (limits := limits_of(rpm, tpm, concurrency)) is not None:
        body["limits"] = limits
    show(ApiClient(url, key).call("POST", "/v1/keys", json=body), (*KEY_COLUMNS, "api_key"), as_json)


KeyWeight = Annotated[
    float | None,
    typer.Option(
        "--weight",
        help="Its share of a shared model against the account's other keys (needs keys:manage; default 1).",
        show_default=False,
    ),
]


@keys_app.command("list")
def keys_list(url: Url = DEFAULT_URL, key: AccountKey = None, as_json: Json = False) -> None:
    """List keys (never their secrets)."""
    show(ApiClient(url, key).call("GET", "/v1/keys"), KEY_COLUMNS, as_json)


@keys_app.command("limit")
def keys_limit(
    key_id: Annotated[str, typer.Argument(help="Key ID (key_...).")],
    rpm: Rpm = None,
    tpm: Tpm = None,
    concurrency: Concurrency = None,
    url: Url = DEFAULT_URL,
    key: AccountKey = None,
    as_json: Json = False,
) -> None:
    """Set a key's rate limits (replacing them; none given: unlimited), from its next request."""
    path = f"/v1/keys/{quote(key_id, safe='')}"
    body = {"limits": limits_of(rpm, tpm, concurrency)}
    show(ApiClient(url, key).call("PATCH", path, json=body), KEY_COLUMNS, as_json)


@keys_app.command("weight")
def keys_weight(
    key_id: Annotated[str, typer.Argument(help="Key ID (key_...).")],
    weight: Annotated[
        float, typer.Argument(help="Its share inside the account (0.01 to 1000; 1: the default).")
    ],
    url: Url = DEFAULT_URL,
    key: AccountKey = None,
    as_json: Json = False,
) -> None:
    """Set a key's share of a shared model against the account's other keys (needs keys:manage)."""
    path = f"/v1/keys/{quote(key_id, safe='')}"
    show(ApiClient(url, key).call("PATCH", path, json={"weight": weight}), (*KEY_COLUMNS, "weight"), as_json)


@keys_app.command("rotate")
def keys_rotate(
    key_id: Annotated[str, typer.Argument(help="Key ID (key_...).")],
    grace: Annotated[
        int, typer.Option("--grace", min=0, help="Seconds the old key keeps working (0: it stops at once).")
    ] = 0,
    url: Url = DEFAULT_URL,
    key: AccountKey = None,
    as_json: Json = False,
) -> None:
    """Replace a key: prints the new key's secret (shown once); the old one expires after --grace."""
    path = f"/v1/keys/{quote(key_id, safe='')}/rotate"
    data = ApiClient(url, key).call("POST", path, json={"grace_seconds": grace})
    show(data, (*KEY_COLUMNS, "api_key"), as_json)


@keys_app.command("revoke")
def keys_revoke(
    key_id: Annotated[str, typer.Argument(help="Key ID (key_...).")],
    url: Url = DEFAULT_URL,
    key: AccountKey = None,
    as_json: Json = False,
) -> None:
    """Revoke a key; it is refused at once."""
    show(
        ApiClient(url, key).call("DELETE", f"/v1/keys/{quote(key_id, safe='')}"),
        ("id", "object", "deleted"),
        as_json,
    )


@deployments_app.command("create")
def deployments_create(
    model: Annotated[str, typer.Argument(help="Your model ID for this deployment.")],
    artifact_id: Annotated[str, typer.Option("--artifact", help="A ready model artifact (art_...).")],
    readiness: Annotated[str, typer.Option(help="cold, warm or hot.")] = "cold",
    min_replicas: Annotated[int, typer.Option(help="Replicas kept when loaded.")] = 1,
    max_replicas: Annotated[int, typer.Option(help="Upper bound of replicas.")] = 1,
    engine: Annotated[EngineName, typer.Option(help=ENGINE_HELP)] = EngineName.auto,
    precision: Annotated[PrecisionName, typer.Option(help=PRECISION_HELP)] = PrecisionName.float32,
    base: Annotated[
        str | None,
        typer.Option(
            help="For a LoRA adapter artifact: the deployment (ID or model name) whose replicas serve it; "
            "readiness, replicas and engine are the base's (docs/adapters.md)."
        ),
    ] = None,
    max_model_len: MaxModelLen = None,
    chat_template: ChatTemplate = None,
    chat_template_kwargs: ChatTemplateKwargs = None,
    tool_parser: ToolParser = None,
    reasoning_parser: ReasoningParser = None,
    fair_token_weights: FairTokenWeights = None,
    url: Url = DEFAULT_URL,
    key: AccountKey = None,
    as_json: Json = False,
) -> None:
    """Deploy a ready artifact under a model ID (a LoRA adapter on its base, with --base)."""
    body: dict[str, object] = {
        "model": model,
        "artifact_id": artifact_id,
        "readiness": readiness,
        "min_replicas": min_replicas,
        "max_replicas": max_replicas,
        "engine": engine.value,
        "precision": precision.value,
    }
    if base is not None:
        body["base_deployment"] = base
    settings = (max_model_len, chat_template, chat_template_kwargs, tool_parser, reasoning_parser)
    body.update(settings_body(*settings, fair_token_weights))
    waits = 600.0 if precision is PrecisionName.int8 else 60.0  # int8: the probe loads the model first
    show_deployment(ApiClient(url, key, waits).call("POST", "/v1/deployments", json=body), as_json)


@deployments_app.command("update")
def deployments_update(
    deployment_id: Annotated[str, typer.Argument(help="Deployment ID (dep_...).")],
    readiness: Annotated[str | None, typer.Option(help="cold, warm or hot.", show_default=False)] = None,
    min_replicas: Annotated[
        int | None, typer.Option(help="Replicas kept when loaded.", show_default=False)
    ] = None,
    max_replicas: Annotated[
        int | None, typer.Option(help="Upper bound of replicas.", show_default=False)
    ] = None,
    engine: Annotated[
        EngineName | None,
        typer.Option(
            help=ENGINE_HELP + " Given, it is chosen again (auto after installing vLLM).", show_default=False
        ),
    ] = None,
    max_model_len: MaxModelLen = None,
    chat_template: ChatTemplate = None,
    chat_template_kwargs: ChatTemplateKwargs = None,
    tool_parser: ToolParser = None,
    reasoning_parser: ReasoningParser = None,
    fair_token_weights: FairTokenWeights = None,
    reset: Reset = None,
    artifact: Annotated[
        str | None,
        typer.Option(
            help="Roll out this artifact (art_...): it loads beside the current one, takes the requests once "
            "ready, and the old one drains (docs/deploy.md). The previous artifact again is a rollback.",
            show_default=False,
        ),
    ] = None,
    traffic: Annotated[
        list[str] | None,
        typer.Option(
            help="A canary: ART_ID=PERCENT, once per version (the percents sum to 100).", show_default=False
        ),
    ] = None,
    strategy: Annotated[
        str | None,
        typer.Option(help="rolling (beside the old) or replace (the old stops first).", show_default=False),
    ] = None,
    sticky: Annotated[
        str | None,
        typer.Option(
            help="Keep each caller of a canary on one version: user, key or none.", show_default=False
        ),
    ] = None,
    gate_eval: GateEval = None,
    gate_steps: GateSteps = None,
    gate_margin: GateMargin = None,
    gate_step_seconds: GateStepSeconds = None,
    gate_min_requests: GateMinRequests = None,
    gate_max_error_rate: GateMaxErrorRate = None,
    gate_max_ttft_p50_ms: GateMaxTtft = None,
    url: Url = DEFAULT_URL,
    key: AccountKey = None,
    as_json: Json = False,
) -> None:
    """Change a deployment's readiness, replica bounds, engine or generation settings (takes effect at
    once; new generation settings reload its replicas), or roll it to another artifact (gated on an eval
    with --gate-eval) or a canary."""
    changes = {"readiness": readiness, "min_replicas": min_replicas, "max_replicas": max_replicas}
    changes |= {"artifact_id": artifact, "strategy": strategy}
    body: dict[str, Any] = {name: value for name, value in changes.items() if value is not None}
    if engine is not None:
        body["engine"] = engine.value
    if traffic:
        body["traffic"] = traffic_split(traffic)
    if sticky is not None:
        body["sticky"] = None if sticky == "none" else sticky
    gate = gate_body(
        gate_eval, gate_steps, gate_margin, gate_step_seconds, gate_min_requests, gate_max_error_rate,
        gate_max_ttft_p50_ms,
    )  # fmt: skip
    if gate is not None:
        body["gate"] = gate
    settings = (max_model_len, chat_template, chat_template_kwargs, tool_parser, reasoning_parser)
    body.update(settings_body(*settings, fair_token_weights, reset))
    path = f"/v1/deployments/{quote(deployment_id, safe='')}"
    show_deployment(ApiClient(url, key).call("PATCH", path, json=body), as_json)


def traffic_split(pairs: list[str]) -> dict[str, int]:
    """`--traffic art_a=90 --traffic art_b=10` as the API's `traffic` object."""
    split: dict[str, int] = {}
    for pair in pairs:
        artifact_id, equals, percent = pair.partition("=")
        if not equals or not percent.strip().isdigit():
            raise typer.BadParameter(f"{pair!r} is not ART_ID=PERCENT", param_hint="--traffic")
        split[artifact_id.strip()] = int(percent)
    return split


def show_deployment(deployment: dict[str, Any], as_json: bool) -> None:
    """One deployment as a table, and why its engine where `auto` or a fallback chose it."""
    show(deployment, DEPLOYMENT_COLUMNS, as_json)
    if not as_json and deployment.get("engine_reason"):
        out.print(f"engine: {deployment['engine_reason']}", soft_wrap=True, markup=False, highlight=False)
    if not as_json and deployment.get("precision_quality"):
        quality = f"int8: {deployment['precision_quality']}"
        out.print(quality, soft_wrap=True, markup=False, highlight=False)
    versions = deployment.get("versions") or []
    if not as_json and len(versions) > 1:  # a rollout or a canary under way
        for version in versions:
            line = f"version {version['artifact_id']}: {version['state']}, {version['traffic']} % of requests"
            out.print(line, soft_wrap=True, markup=False, highlight=False)
    if not as_json:
        show_settings(deployment)
        show_rollout(deployment.get("rollout"))


@deployments_app.command("get")
def deployments_get(
    deployment_id: Annotated[str, typer.Argument(help="Deployment ID (dep_...).")],
    url: Url = DEFAULT_URL,
    key: AccountKey = None,
    as_json: Json = False,
) -> None:
    """Show a deployment: its live state, versions, settings, and its gated rollout's steps and decisions."""
    show_deployment(
        ApiClient(url, key).call("GET", f"/v1/deployments/{quote(deployment_id, safe='')}"), as_json
    )


@deployments_app.command("list")
def deployments_list(url: Url = DEFAULT_URL, key: AccountKey = None, as_json: Json = False) -> None:
    """List deployments with their live state."""
    show(ApiClient(url, key).call("GET", "/v1/deployments"), DEPLOYMENT_COLUMNS, as_json)


@deployments_app.command("delete")
def deployments_delete(
    deployment_id: Annotated[str, typer.Argument(help="Deployment ID (dep_...).")],
    url: Url = DEFAULT_URL,
    key: AccountKey = None,
    as_json: Json = False,
) -> None:
    """Delete a deployment (unloads it and frees its artifact)."""
    data = ApiClient(url, key).call("DELETE", f"/v1/deployments/{quote(deployment_id, safe='')}")
    show(data, ("id", "object", "deleted"), as_json)


@artifacts_app.command("push")
def artifacts_push(
    directory: Annotated[
        Path, typer.Argument(help="Folder with the model files.", exists=True, file_okay=False)
    ],
    name: Annotated[str, typer.Option(help="Artifact display name (reused to resume or re-upload).")],
    pipeline: Annotated[str, typer.Option(help="Pipeline task, e.g. feature-extraction.")],
    deploy: Annotated[
        str | None, typer.Option(help="Also deploy it under this model ID once ready.", show_default=False)
    ] = None,
    readiness: Annotated[str, typer.Option(help="Readiness of the deployment made by --deploy.")] = "cold",
    url: Url = DEFAULT_URL,
    key: AccountKey = None,
    as_json: Json = False,
) -> None:
    """Upload a model folder as an artifact (resumable), inspect it, and optionally deploy it."""
    from modelhost.cli.push import push

    api = ApiClient(url, key, timeout=600)
    finished = push(api, directory, name, pipeline)
    artifact = finished["artifact"]
    if as_json:
        print(json.dumps(finished, indent=2))
    else:
        show_artifact(artifact)
        out.print(finished["message"])
    if artifact["status"] != "ready" or artifact.get("error"):
        raise typer.Exit(1)  # inspection failed (for a re-upload, the previous version stays ready)
    if deploy:
        body = {"model": deploy, "artifact_id": artifact["id"], "readiness": readiness}
        show_deployment(api.call("POST", "/v1/deployments", json=body), as_json)


@artifacts_app.command("import")
def artifacts_import(
    source: Annotated[
        list[str],
        typer.Argument(
            help="s3://bucket/prefix, hf://org/name\\[@revision], an https:// file URL or archive (.tar, "
            ".tar.gz, .zip), or several https:// file URLs.",
            show_default=False,
        ),
    ],
    pipeline: Annotated[str, typer.Option(help="Pipeline task, e.g. feature-extraction.")],
    name: Annotated[
        str | None,
        typer.Option(help="Artifact display name (reused, as by push); default: the source's last segment."),
    ] = None,
    include: Annotated[
        list[str] | None, typer.Option(help="Import only paths matching this fnmatch pattern (repeatable).")
    ] = None,
    exclude: Annotated[
        list[str] | None, typer.Option(help="Leave out paths matching this fnmatch pattern (repeatable).")
    ] = None,
    credentials_file: Annotated[
        Path | None,
        typer.Option(
            help="JSON file of the source's credentials, sent once and kept encrypted by the server while "
            "the import runs: s3 {aws_access_key_id, aws_secret_access_key, aws_session_token?, "
            "endpoint_url?, region?}, hf {token}, https {bearer_token} or {headers}.",
            exists=True,
            dir_okay=False,
        ),
    ] = None,
    url: Url = DEFAULT_URL,
    key: AccountKey = None,
    as_json: Json = False,
) -> None:
    """Have the server import a model from S3, HTTPS or a Hugging Face Hub into an artifact, with a
    progress bar until it is ready (exit 1 if it fails, with why)."""
    from modelhost.cli.importing import import_artifact, name_of

    credentials = json.loads(credentials_file.read_text()) if credentials_file else None
    given: str | list[str] = source[0] if len(source) == 1 else source
    api = ApiClient(url, key, timeout=120)
    shown, artifact = import_artifact(
        api, given, name or name_of(source[0]), pipeline, include, exclude, credentials
    )
    if as_json:
        print(json.dumps({"import": shown, "artifact": artifact}, indent=2))
    else:
        show_artifact(artifact)
    if shown["status"] != "completed":
        error = shown.get("error") or {}
        reason = f"{error.get('code')}: {error.get('message')}" if error else shown["status"]
        out.print(f"import {shown['status']}: {reason}", soft_wrap=True, markup=False, highlight=False)
        raise typer.Exit(1)
    out.print("Import complete: artifact is ready.")


@artifacts_app.command("list")
def artifacts_list(url: Url = DEFAULT_URL, key: AccountKey = None, as_json: Json = False) -> None:
    """List model artifacts."""
    listed = ApiClient(url, key).call("GET", "/v1/model-artifacts")
    if as_json:
        show(listed, ARTIFACT_COLUMNS, True)
    else:
        show([_readable(a) for a in listed["data"]], ARTIFACT_COLUMNS, False)


def show_artifact(artifact: dict[str, Any]) -> None:
    """One artifact as a table, then where a quantized one can be served (and why not elsewhere)."""
    show(_readable(artifact), ARTIFACT_COLUMNS, False)
    for engine, devices in (artifact.get("serving") or {}).items():
        for device, reason in devices.items():
            line = f"{engine} on {device}: {reason or 'servable'}"
            out.print(line, soft_wrap=True, markup=False, highlight=False)


def _readable(artifact: dict[str, Any]) -> dict[str, Any]:
    """`quantization` in a word or three: `gptq 4-bit g128`, `gguf Q4_K_M`, `compressed-tensors W4A16 g32`."""
    found = artifact.get("quantization")
    if not found:
        return {**artifact, "quantization": None}
    if found["method"] == "gguf":
        return {**artifact, "quantization": f"gguf {found['scheme']}"}
    words = [found["method"], found.get("scheme") or (f"{found['bits']}-bit" if found.get("bits") else None)]
    if found.get("group_size"):
        words.append(f"g{found['group_size']}")
    return {**artifact, "quantization": " ".join(w for w in words if w)}


@artifacts_app.command("delete")
def artifacts_delete(
    artifact_id: Annotated[str, typer.Argument(help="Artifact ID (art_...).")],
    url: Url = DEFAULT_URL,
    key: AccountKey = None,
    as_json: Json = False,
) -> None:
    """Delete a model artifact no deployment uses."""
    data = ApiClient(url, key).call("DELETE", f"/v1/model-artifacts/{quote(artifact_id, safe='')}")
    show(data, ("id", "object", "deleted"), as_json)


if __name__ == "__main__":
    app()


@app.command()
def usage(
    start: Annotated[
        str | None, typer.Option(help="Range start: ISO date/time or Unix seconds (default: this month).")
    ] = None,
    end: Annotated[
        str | None, typer.Option(help="Range end, exclusive (default: end of this month).")
    ] = None,
    url: Url = DEFAULT_URL,
    key: AccountKey = None,
    as_json: Json = False,
) -> None:
    """Your credits: balance, and compute and storage credits by deployment, artifact and day."""
    params = {name: value for name, value in (("start", start), ("end", end)) if value is not None}
    data = ApiClient(url, key).call("GET", "/v1/usage", params=params)
    if as_json:
        show(data, (), as_json=True)
        return
    out.print(f"usage from {data['start']} to {data['end']}", markup=False, highlight=False)
    show(data, USAGE_COLUMNS, False, title="credits")
    show(data["by_deployment"], ("deployment_id", "model", "compute_credits"), False, title="by deployment")
    show(data["by_artifact"], ARTIFACT_USAGE_COLUMNS, False, title="by artifact")
    show(data["by_day"], ("date", "compute_credits", "storage_credits", "credits"), False, title="by day")
