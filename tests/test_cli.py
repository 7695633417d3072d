"""The `modelhost` CLI, driven with typer's `CliRunner` against a live gateway on SQLite."""

from __future__ import annotations

import json
import re
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
from sqlalchemy import update
from typer.testing import CliRunner, Result

from modelhost.billing.ledger import ComputeReading
from modelhost.cli import client as cli_client
from modelhost.cli import output as cli_output
from modelhost.cli.main import app
from modelhost.config import Settings, get_settings
from modelhost.container import Services
from modelhost.store import migrate
from modelhost.store.db import Database
from modelhost.store.models import AuditRow, ModelArtifact
from tests.conftest import make_settings
from tests.helpers import ADMIN_KEY, assert_error, bearer, push_folder_sync, ready_artifact
from tests.live import live_server

CLI_ENV = ("MODELHOST_URL", "MODELHOST_API_KEY", "MODELHOST_ADMIN_KEY", "MODELHOST_DATABASE_URL")
KEY_PATTERN = re.compile(r"mh-[A-Za-z0-9_-]+")


# --------------------------------------------------------------------------- fixtures and helpers


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    tmp_path = tmp_path_factory.mktemp("cli")
    # batches are looked for every 0.2 s (the batch commands' tests wait for them)
    return make_settings(tmp_path, f"sqlite:///{tmp_path / 't.db'}", worker_threads=1, batch_poll_seconds=0.2)


@pytest.fixture(scope="module")
def url(settings: Settings) -> Iterator[str]:
    """One live gateway for the whole module."""
    with live_server(settings) as base_url:
        yield base_url


@pytest.fixture(scope="module")
def store(settings: Settings, url: str) -> Iterator[Services]:
    """Services on the live server's database, only to insert rows the API cannot make yet."""
    built = Services.build(settings)
    yield built
    built.close()


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No stray MODELHOST_* from the caller's shell; a wide terminal so tables are not truncated.

    The consoles measure the terminal at each print, as in a shell; a COLUMNS present when they were
    made (pytest-xdist's workers get COLUMNS=80) would otherwise fix their width for the whole session."""
    for name in CLI_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLUMNS", "200")
    for console in (cli_output.out, cli_client.err):
        monkeypatch.setattr(console, "_width", None)


@pytest.fixture
def account(url: str) -> dict[str, Any]:
    """A fresh account (made over HTTP, not through the CLI under test)."""
    response = httpx.post(
        f"{url}/v1/admin/accounts",
        json={"name": f"acct-{secrets.token_hex(4)}", "credits": 10},
        headers=bearer(ADMIN_KEY),
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def cli(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(app, list(args), env=env, prog_name="modelhost")


def ok(*args: str, env: dict[str, str] | None = None) -> Result:
    """Run the CLI and require success, showing its output otherwise."""
    result = cli(*args, env=env)
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr, result.exception)
    assert result.stderr == ""
    return result


def ok_json(*args: str, env: dict[str, str] | None = None) -> Any:
    return json.loads(ok(*args, "--json", env=env).stdout)


def table_rows(stdout: str) -> list[dict[str, str]]:
    """Parse a rich table (heavy-edged header, light-edged body) into one dict per row."""
    lines = stdout.splitlines()
    headers = [line for line in lines if line.startswith("┃")]
    assert len(headers) == 1, stdout
    columns = [cell.strip() for cell in headers[0].strip("┃").split("┃")]
    rows = []
    for line in lines:
        if line.startswith("│"):
            cells = [cell.strip() for cell in line.strip("│").split("│")]
            assert len(cells) == len(columns), line
            rows.append(dict(zip(columns, cells, strict=True)))
    return rows


def new_deployment(url: str, store: Services, account: dict[str, Any], model: str) -> dict[str, Any]:
    artifact_id = ready_artifact(store, account["id"])
    body: dict[str, Any] = ok_json(
        "deployments", "create", model, "--artifact", artifact_id, "--url", url, "--key", account["api_key"]
    )
    return body


def artifact_deployment_count(store: Services, artifact_id: str) -> int:
    with store.database.transaction() as session:
        artifact = session.get(ModelArtifact, artifact_id)
        assert artifact is not None
        return artifact.deployment_count


# --------------------------------------------------------------------------------------------- help


HELP_SUMMARIES: list[tuple[tuple[str, ...], str]] = [
    ((), "serve your own Hugging Face models over HTTP"),
    (("serve",), "Run the server (applies database migrations first)."),
    (("quickstart",), "Serve with a ready demo"),
    (("db",), "Database schema (Alembic migrations)."),
    (("db", "upgrade"), "Apply migrations to the configured database (MODELHOST_DATABASE_URL)."),
    (("accounts",), "Accounts (needs the admin key)."),
    (("accounts", "create"), "Create an account; prints its first account key (shown once)."),
    (("accounts", "list"), "List accounts."),
    (("accounts", "credit"), "Top up an account (service resumes at once if it was out of credits)."),
    (("accounts", "limit"), "Set an account's rate limits (replacing them; none given: unlimited)."),
    (("usage",), "Your credits: balance, and compute and storage credits by deployment, artifact and day."),
    (("keys",), "API keys of your account."),
    (("keys", "create"), "Create a key; prints its secret (shown once)."),
    (("keys", "list"), "List keys (never their secrets)."),
    (("keys", "revoke"), "Revoke a key; it is refused at once."),
    (
        ("keys", "limit"),
        "Set a key's rate limits (replacing them; none given: unlimited), from its next request.",
    ),
    (("deployments",), "Deployments of your account."),
    (("deployments", "create"), "Deploy a ready artifact under a model ID (a LoRA adapter on its base"),
    (("deployments", "list"), "List deployments with their live state."),
    (("deployments", "get"), "Show a deployment: its live state, versions, settings, and its gated"),
    (("deployments", "update"), "Change a deployment's readiness, replica bounds, engine or generation"),
    (("deployments", "delete"), "Delete a deployment (unloads it and frees its artifact)."),
    (("artifacts",), "Model artifacts of your account."),
    (("artifacts", "push"), "Upload a model folder as an artifact (resumable)"),
    (("artifacts", "import"), "Have the server import a model from S3, HTTPS or a Hugging Face Hub into"),
    (("artifacts", "list"), "List model artifacts."),
    (("artifacts", "delete"), "Delete a model artifact no deployment uses."),
    (("files",), "Files of your account (a batch's input, output and errors)."),
    (("files", "upload"), "Upload a file (for a batch: a JSONL file of requests, checked by the server)."),
    (("files", "list"), "List files: those uploaded, and batches' output and error files"),
    (("files", "get"), "Show a file's object."),
    (("files", "download"), "Write a file's content to a path or to standard output"),
    (("files", "delete"), "Delete a file and its bytes (a batch made from it keeps its own copy)."),
    (("batches",), "Batches of your account: a file of requests answered at low priority."),
    (("batches", "create"), "Create a batch from a JSONL file (a local path, uploaded first, or"),
    (("batches", "get"), "Show a batch: its status, request counts and files; with --wait, once it"),
    (("batches", "list"), "List batches, newest first."),
    (("batches", "cancel"), "Cancel a batch: the lines in flight finish, the answers so far go to its"),
    (("keys", "rotate"), "Replace a key: prints the new key's secret (shown once); the old one expires"),
    (("keys", "weight"), "Set a key's share of a shared model against the account's other keys"),
    (("audit",), "The audit log: who changed what"),
    (("audit", "list"), "List audit rows, newest first (with --admin-key: every account's)."),
    (("audit", "verify"), "Recompute the audit log's hash chain (admin key); exits 1 naming each edited,"),
    (("users",), "People of your account and their roles (docs/access.md)."),
    (("users", "add"), "Add a person to your account with a role."),
    (("users", "list"), "List your account's people and their roles."),
    (("users", "role"), "Change a person's role: their keys follow at once."),
    (("users", "disable"), "Disable a person in your account: their keys here are refused"),
    (("users", "enable"), "Enable a disabled person again."),
    (("users", "remove"), "Remove a person from your account: their keys here stop at once."),
    (("users", "invite"), "Invite an email to your account with a role: offered to whoever signs in"),
    (("users", "invitations"), "List your account's invitations not yet accepted."),
    (("users", "uninvite"), "Withdraw an invitation."),
    (("users", "sign-out-everywhere"), "Sign a person out of your account everywhere: their sessions here"),
    (("users", "quota"), "Set a person's own quota over every key they own and their sessions"),
    (("users", "role-quota"), "Set a role's default quota in your account (no limit given: remove it)"),
    (("users", "role-weight"), "Set a role's weight in your account, or list them: a key's share of a"),
    (("mcp-servers",), "MCP servers your account's hosted MCP tools may reach"),
    (("mcp-servers", "list"), "List the MCP server URLs on your account's allow-list."),
    (("mcp-servers", "add"), "Add MCP server URLs to your account's allow-list (owners and admins)."),
    (("fine-tune",), "Fine-tuning jobs of your account: LoRA adapters trained on a deployment's base."),
    (("fine-tune", "create"), "Create a fine-tuning job from a JSONL dataset (a local path, uploaded first"),
    (("fine-tune", "list"), "List fine-tuning jobs, newest first."),
    (("fine-tune", "get"), "Show a job; with --wait, once it has ended."),
    (("fine-tune", "events"), "A job's events, newest first: messages and each step's losses."),
    (("fine-tune", "checkpoints"), "A job's checkpoints, newest first."),
    (("fine-tune", "cancel"), "Cancel a queued, running or paused job."),
    (("fine-tune", "pause"), "Pause a job: it keeps its checkpoints."),
    (("fine-tune", "resume"), "Resume a paused job from its last checkpoint."),
    (("evals",), "Evals of your account: grade a deployment on your own test set"),
    (("evals", "create"), "Create an eval from a JSON file (what it grades and how, as OpenAI's API"),
    (("evals", "list"), "List evals, newest first."),
    (("evals", "get"), "Show an eval and its testing criteria."),
    (("evals", "delete"), "Delete an eval, its runs and their results (a run under way stops)."),
    (("evals", "run"), "Start a run of an eval on a data source: a deployment's answers graded by"),
    (("evals", "runs"), "List an eval's runs, newest first."),
    (("evals", "run-get"), "Show a run: its status, counts and each criterion's pass rate."),
    (("evals", "cancel"), "Cancel a run: the items graded so far are kept."),
    (("evals", "results"), "List a run's items: each one's status and its score per criterion."),
    (("mcp-servers", "remove"), "Remove MCP server URLs (as listed) from your account's allow-list."),
    (("whoami",), "Who your key acts as: account, role, person and what it may do."),
    (("login",), "Sign in through your organization's identity provider (a code to confirm in a browser)."),
    (("logout",), "Sign out: the session ends on the server, and its token is removed from this computer."),
]


def command_paths(command: Any, path: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Every command and group of the CLI, as paths of names (typer bundles its own click)."""
    paths = {path}
    for name, sub in getattr(command, "commands", {}).items():
        paths |= command_paths(sub, (*path, name))
    return paths


def test_the_help_tests_cover_every_command() -> None:
    assert command_paths(typer.main.get_command(app)) == {command for command, _ in HELP_SUMMARIES}


@pytest.mark.parametrize(
    ("command", "summary"),
    HELP_SUMMARIES,
    ids=["-".join(command) or "modelhost" for command, _ in HELP_SUMMARIES],
)
def test_every_command_answers_help(command: tuple[str, ...], summary: str) -> None:
    result = ok(*command, "--help")
    assert re.search(rf"Usage: modelhost {re.escape(' '.join(command))}\s*\[OPTIONS\]", result.stdout)
    assert summary in result.stdout


def test_a_group_without_a_command_shows_its_help_and_fails() -> None:
    result = cli("keys")
    assert result.exit_code == 2
    assert "Usage: modelhost keys [OPTIONS] COMMAND" in result.stdout + result.stderr


# ----------------------------------------------------------------------------------------- accounts


def test_accounts_create_prints_the_key_once_in_a_table(url: str) -> None:
    result = ok(
        "accounts", "create", "cli-table", "--credits", "12.5", "--url", url, "--admin-key", ADMIN_KEY
    )
    [row] = table_rows(result.stdout)
    assert row["name"] == "cli-table"
    assert float(row["credits"]) == 12.5
    assert row["id"].startswith("acct_")
    assert KEY_PATTERN.fullmatch(row["api_key"]), row
    assert set(KEY_PATTERN.findall(result.stdout)) == {row["api_key"]}  # no other key (the admin's)
    # The printed key is the whole secret: it authenticates as the new account.
    response = httpx.get(f"{url}/v1/keys", headers=bearer(row["api_key"]))
    assert response.status_code == 200, response.text
    assert [key["kind"] for key in response.json()["data"]] == ["account"]


def test_accounts_create_json_takes_the_admin_key_from_the_environment(url: str) -> None:
    created = ok_json(
        "accounts",
        "create",
        "cli-json",
        "--credits",
        "3",
        "--url",
        url,
        env={"MODELHOST_ADMIN_KEY": ADMIN_KEY},
    )
    assert set(created) == {
        "id",
        "name",
        "credits",
        "credits_granted",
        "credits_used",
        "limits",
        "weight",
        "created_at",
        "api_key",
    }
    assert created["name"] == "cli-json"
    assert created["credits"] == 3.0
    assert KEY_PATTERN.fullmatch(created["api_key"])
    assert httpx.get(f"{url}/v1/keys", headers=bearer(created["api_key"])).status_code == 200


def test_accounts_list_json_includes_new_accounts_without_secrets(url: str, account: dict[str, Any]) -> None:
    listed = ok_json("accounts", "list", "--url", url, "--admin-key", ADMIN_KEY)
    assert set(listed) == {"object", "data"}
    mine = [item for item in listed["data"] if item["id"] == account["id"]]
    assert mine == [
        {
            "id": account["id"],
            "name": account["name"],
            "credits": account["credits"],
            "credits_granted": account["credits_granted"],
            "credits_used": account["credits_used"],
            "limits": None,
            "weight": 1.0,
            "created_at": account["created_at"],
        }
    ]
    assert all("api_key" not in item for item in listed["data"])


def test_accounts_list_prints_a_table_row_per_account(url: str, account: dict[str, Any]) -> None:
    result = ok("accounts", "list", "--url", url, env={"MODELHOST_ADMIN_KEY": ADMIN_KEY})
    rows = {row["id"]: row for row in table_rows(result.stdout)}
    assert rows[account["id"]]["name"] == account["name"]
    assert "mh-" not in result.stdout


def test_accounts_need_the_admin_key_not_an_account_key(url: str, account: dict[str, Any]) -> None:
    result = cli("accounts", "list", "--url", url, "--admin-key", account["api_key"])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "This route needs the admin key." in result.stderr
    assert "401" in result.stderr


# --------------------------------------------------------------------------------------------- keys


def test_keys_create_makes_a_working_account_key(url: str, account: dict[str, Any]) -> None:
    created = ok_json("keys", "create", "--name", "ci", "--url", url, "--key", account["api_key"])
    assert created["name"] == "ci"
    assert created["kind"] == "account"
    assert created["deployments"] is None
    assert created["revoked_at"] is None
    assert created["api_key"].startswith(created["prefix"])
    assert created["api_key"] != account["api_key"]
    assert httpx.get(f"{url}/v1/keys", headers=bearer(created["api_key"])).status_code == 200


def test_mcp_servers_add_list_and_remove_the_accounts_allowed_mcp_urls(
    url: str, account: dict[str, Any]
) -> None:
    owner = ("--url", url, "--key", account["api_key"])
    assert ok_json("mcp-servers", "list", *owner) == {"urls": []}
    added = ok("mcp-servers", "add", "https://MCP.example.com/mcp/", "https://b.example", *owner)
    assert added.stdout.split() == ["https://b.example", "https://mcp.example.com/mcp"]
    assert ok_json("mcp-servers", "remove", "https://b.example", *owner) == {
        "urls": ["https://mcp.example.com/mcp"]
    }
    refused = cli("mcp-servers", "remove", "https://never.example", *owner)
    assert refused.exit_code == 2 and "not on the list" in refused.stderr


def test_users_add_a_person_whose_key_follows_their_role_and_whoami_says_so(
    url: str, account: dict[str, Any]
) -> None:
    owner = ("--url", url, "--key", account["api_key"])
    person = ok_json("users", "add", "dana@example.com", "--role", "developer", *owner)
    assert (person["email"], person["role"], person["disabled"]) == ("dana@example.com", "developer", False)
    made = ok_json("keys", "create", "--user", person["id"], "--role", "developer", *owner)
    assert (made["user_id"], made["role"]) == (person["id"], "developer")
    mine = ("--url", url, "--key", made["api_key"])
    [row] = table_rows(ok("whoami", *mine).stdout)
    assert (row["role"], row["user"]) == ("developer", "dana@example.com")
    ok("users", "quota", person["id"], "--requests-per-day", "50", "--tokens-per-month", "9000", *owner)
    assert httpx.post(f"{url}/v1/conversations", json={}, headers=bearer(made["api_key"])).status_code == 200
    printed = ok("whoami", *mine).stdout
    assert "quota: their own" in printed
    assert re.search(r"today \(\d{4}-\d\d-\d\d, UTC\): 1 requests of 50 \(49 left\), 0 tokens\n", printed)
    assert re.search(r"this month \(\d{4}-\d\d, UTC\): 1 requests, 0 tokens of 9000 \(9000 left\)", printed)
    assert "weights: account 1, key 1\n" in printed
    rows = table_rows(ok("users", "role-weight", "developer", "2.5", *owner).stdout)
    assert {r["role"]: r["weight"] for r in rows} == {
        "owner": "1.0",
        "admin": "1.0",
        "developer": "2.5",
        "viewer": "1.0",
        "billing": "1.0",
    }
    ok("keys", "weight", made["id"], "2", *owner)
    assert ok_json("whoami", *mine)["weights"] == {"account": 1.0, "key": 5.0}
    assert ok_json("users", "role-weight", "developer", *owner)["developer"] == 1.0  # no weight: 1 again
    ok("users", "role", person["id"], "--role", "viewer", *owner)
    assert ok_json("whoami", *mine)["actions"] == [
        "agents:read",
        "artifacts:read",
        "deployments:read",
        "me:read",
    ]
    denied = cli("keys", "create", *mine)
    assert denied.exit_code == 1 and "403" in denied.stderr
    assert [u["email"] for u in ok_json("users", "list", *owner)["data"]] == ["dana@example.com"]
    ok("users", "remove", person["id"], *owner)
    assert "401" in cli("whoami", *mine).stderr


def test_users_invite_list_and_withdraw_invitations_and_sign_a_person_out_everywhere(
    url: str, account: dict[str, Any]
) -> None:
    owner = ("--url", url, "--key", account["api_key"])
    invited = ok_json("users", "invite", "Erin@example.com", "--role", "viewer", *owner)
    assert (invited["email"], invited["role"], invited["id"][:4]) == ("erin@example.com", "viewer", "inv_")
    [row] = table_rows(ok("users", "invitations", *owner).stdout)
    assert (row["id"], row["email"]) == (invited["id"], "erin@example.com")
    assert ok_json("users", "uninvite", invited["id"], *owner)["deleted"] is True
    assert ok_json("users", "invitations", *owner)["data"] == []

    person = ok_json("users", "add", "fay@example.com", "--role", "developer", *owner)
    made = ok_json("keys", "create", "--user", person["id"], "--role", "developer", *owner)
    ended = ok_json("users", "sign-out-everywhere", person["id"], *owner)
    assert (ended["sessions_ended"], ended["keys_revoked"]) == (0, 1)
    assert "401" in cli("whoami", "--url", url, "--key", made["api_key"]).stderr


def test_keys_create_prints_the_secret_in_a_table(url: str, account: dict[str, Any]) -> None:
    result = ok("keys", "create", "--url", url, "--key", account["api_key"])
    [row] = table_rows(result.stdout)
    assert row["kind"] == "account"
    assert row["deployments"] == "-"
    assert row["api_key"].startswith(row["prefix"])
    assert httpx.get(f"{url}/v1/keys", headers=bearer(row["api_key"])).status_code == 200


def test_keys_create_with_a_deployment_makes_a_deployment_key(
    url: str, store: Services, account: dict[str, Any]
) -> None:
    deployment = new_deployment(url, store, account, "scoped-model")
    new_deployment(url, store, account, "other-model")
    created = ok_json("keys", "create", "-d", deployment["id"], "--url", url, "--key", account["api_key"])
    assert created["kind"] == "deployment"
    assert created["deployments"] == [deployment["id"]]
    # It sees only its deployment, and cannot manage the account.
    models = httpx.get(f"{url}/v1/models", headers=bearer(created["api_key"]))
    assert models.status_code == 200, models.text
    assert [model["id"] for model in models.json()["data"]] == ["scoped-model"]
    refused = cli("keys", "list", "--url", url, "--key", created["api_key"])
    assert refused.exit_code == 1
    assert "This route needs an account key." in refused.stderr


def test_keys_list_json_shows_no_secrets(url: str, account: dict[str, Any]) -> None:
    created = ok_json("keys", "create", "--name", "listed", "--url", url, "--key", account["api_key"])
    result = ok("keys", "list", "--json", "--url", url, env={"MODELHOST_API_KEY": account["api_key"]})
    listed = json.loads(result.stdout)
    assert [key["name"] for key in listed["data"]] == ["default", "listed"]
    assert listed["data"][1]["id"] == created["id"]
    assert all(
        set(key)
        == {
            "id",
            "name",
            "kind",
            "deployments",
            "prefix",
            "limits",
            "use",
            "created_at",
            "revoked_at",
            "expires_at",
            "role",
            "user_id",
            "cache_salt",
            "weight",
        }
        for key in listed["data"]
    )
    assert created["api_key"] not in result.stdout
    assert account["api_key"] not in result.stdout


UNLIMITED = dict.fromkeys(
    (
        "requests_per_minute",
        "tokens_per_minute",
        "concurrent_requests",
        "credits_per_day",
        "credits_per_month",
    )
)


def test_limits_are_set_from_the_cli_on_accounts_and_keys(url: str, account: dict[str, Any]) -> None:
    admin = ("--url", url, "--admin-key", ADMIN_KEY)
    capped = ok_json("accounts", "limit", account["id"], "--rpm", "600", "--credits-per-day", "2.5", *admin)
    assert capped["limits"] == {**UNLIMITED, "requests_per_minute": 600, "credits_per_day": 2.5}
    limited = ok_json("accounts", "limit", account["id"], "--rpm", "600", "--concurrency", "8", *admin)
    assert limited["limits"] == {**UNLIMITED, "requests_per_minute": 600, "concurrent_requests": 8}
    mine = ("--url", url, "--key", account["api_key"])
    created = ok_json("keys", "create", "--rpm", "60", "--tpm", "1000", *mine)
    assert created["limits"] == {**UNLIMITED, "requests_per_minute": 60, "tokens_per_minute": 1000}
    changed = ok_json("keys", "limit", created["id"], "--concurrency", "2", *mine)
    assert changed["limits"] == {**UNLIMITED, "concurrent_requests": 2}
    table = ok("keys", "list", *mine).stdout
    assert "concurrent_requests=2" in table
    refused = cli("keys", "create", "--rpm", "601", *mine)
    assert refused.exit_code == 1 and "would exceed its account's" in refused.stderr
    assert ok_json("accounts", "limit", account["id"], *admin)["limits"] is None  # none given: unlimited


def test_keys_revoke_makes_the_server_refuse_the_key(url: str, account: dict[str, Any]) -> None:
    created = ok_json("keys", "create", "--url", url, "--key", account["api_key"])
    assert httpx.get(f"{url}/v1/keys", headers=bearer(created["api_key"])).status_code == 200

    result = ok("keys", "revoke", created["id"], "--url", url, "--key", account["api_key"])
    assert table_rows(result.stdout) == [
        {"id": created["id"], "object": "api_key.deleted", "deleted": "True"}
    ]

    assert_error(httpx.get(f"{url}/v1/keys", headers=bearer(created["api_key"])), 401, "invalid_api_key")
    listed = ok_json("keys", "list", "--url", url, "--key", account["api_key"])
    revoked = {key["id"]: key["revoked_at"] for key in listed["data"]}
    assert revoked[created["id"]] is not None
    assert revoked[listed["data"][0]["id"]] is None


def test_keys_revoke_of_an_unknown_key_prints_not_found(url: str, account: dict[str, Any]) -> None:
    result = cli("keys", "revoke", "key_does_not_exist", "--url", url, "--key", account["api_key"])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.strip() == "error: Key not found (404 key_not_found)"


def test_keys_create_with_expires_in_then_rotate_ends_the_old_key(url: str, account: dict[str, Any]) -> None:
    env = {"MODELHOST_API_KEY": account["api_key"]}
    old = ok_json("keys", "create", "--name", "ci", "--expires-in", "3600", "--url", url, env=env)
    assert old["expires_at"] is not None
    new = ok_json("keys", "rotate", old["id"], "--grace", "0", "--url", url, env=env)
    assert (new["name"], new["expires_at"]) == ("ci", old["expires_at"])  # it keeps the old key's expiry
    assert_error(httpx.get(f"{url}/v1/keys", headers=bearer(old["api_key"])), 401, "expired_api_key")
    assert httpx.get(f"{url}/v1/keys", headers=bearer(new["api_key"])).status_code == 200
    table = ok("keys", "rotate", new["id"], "--grace", "600", "--url", url, env=env)
    row = table_rows(table.stdout)[0]  # the secret, next to its expiry, wraps onto a second line
    assert row["name"] == "ci" and row["api_key"].startswith(row["prefix"])


def test_audit_lists_the_accounts_changes_and_verify_names_an_edited_row(
    url: str, store: Services, account: dict[str, Any]
) -> None:
    created = ok_json("keys", "create", "--name", "audited", "--url", url, "--key", account["api_key"])
    listed = ok_json("audit", "list", "--action", "key.created", "--url", url, "--key", account["api_key"])
    assert listed["data"][0]["target"]["id"] == created["id"]  # newest first
    assert {row["account_id"] for row in listed["data"]} == {account["id"]}
    assert created["api_key"] not in json.dumps(listed)
    rows = table_rows(ok("audit", "list", "--limit", "1", "--url", url, "--key", account["api_key"]).stdout)
    assert rows[0]["action"] == "key.created" and rows[0]["target"] == f"key {created['id']}"
    checked = ok("audit", "verify", "--url", url, "--admin-key", ADMIN_KEY)
    assert "ok: every row matches its hash" in checked.stdout
    [row] = [row for row in listed["data"] if row["target"]["id"] == created["id"]]
    with store.database.transaction() as session:  # someone edits the row in the database
        session.execute(update(AuditRow).where(AuditRow.id == row["id"]).values(target_id="key_else"))
    try:
        refused = cli("audit", "verify", "--url", url, "--admin-key", ADMIN_KEY)
        assert refused.exit_code == 1
        assert f"row {row['seq']} ({row['id']}): its contents do not match its hash" in refused.stderr
    finally:
        with store.database.transaction() as session:
            session.execute(update(AuditRow).where(AuditRow.id == row["id"]).values(target_id=created["id"]))
    ok("audit", "verify", "--url", url, "--admin-key", ADMIN_KEY)


# -------------------------------------------------------------------------------------- deployments


def test_deployments_create_json_deploys_a_ready_artifact(
    url: str, store: Services, account: dict[str, Any]
) -> None:
    artifact_id = ready_artifact(store, account["id"])
    created = ok_json(
        "deployments",
        "create",
        "my-embedder",
        "--artifact",
        artifact_id,
        "--readiness",
        "warm",
        "--min-replicas",
        "0",
        "--max-replicas",
        "2",
        "--url",
        url,
        "--key",
        account["api_key"],
    )
    assert created["id"].startswith("dep_")
    assert created["model"] == "my-embedder"
    assert created["artifact_id"] == artifact_id
    assert created["pipeline"] == "feature-extraction"
    assert created["readiness"] == "warm"
    assert (created["min_replicas"], created["max_replicas"]) == (0, 2)
    assert created["state"] == "loading"  # warm: loading starts at creation
    assert artifact_deployment_count(store, artifact_id) == 1


def test_deployments_create_and_update_take_an_engine_and_show_the_one_in_use(
    url: str, store: Services, account: dict[str, Any]
) -> None:
    artifact_id = ready_artifact(store, account["id"], "text-generation")
    key = ("--url", url, "--key", account["api_key"])
    created = ok("deployments", "create", "chat", "--artifact", artifact_id, *key)
    [row] = table_rows(created.stdout)
    assert row["engine_in_use"] == "transformers"
    # where auto chose, the table is followed by why (vLLM is off in the tests)
    assert "engine: auto chose transformers: vLLM is turned off" in " ".join(created.stdout.split())

    updated = ok_json(
        "deployments", "update", row["id"], "--engine", "transformers", "--max-replicas", "2", *key
    )
    assert (updated["engine"], updated["engine_in_use"], updated["engine_reason"]) == (
        "transformers",
        "transformers",
        None,
    )
    assert updated["max_replicas"] == 2
    shown = ok("deployments", "update", row["id"], "--readiness", "cold", *key)
    assert "engine:" not in shown.stdout

    refused = cli("deployments", "update", row["id"], "--engine", "vllm", *key)
    assert refused.exit_code == 1
    assert "(400 engine_not_supported)" in refused.stderr
    assert (
        cli("deployments", "create", "x", "--artifact", artifact_id, "--engine", "onnx", *key).exit_code == 2
    )


def test_deployments_update_rolls_a_deployment_to_another_artifact_and_back(
    url: str, store: Services, account: dict[str, Any]
) -> None:
    first, second = (ready_artifact(store, account["id"], "text-generation") for _ in range(2))
    key = ("--url", url, "--key", account["api_key"])
    created = ok_json("deployments", "create", "rolled", "--artifact", first, *key)
    rolled = ok_json("deployments", "update", created["id"], "--artifact", second, *key)  # cold: it switches
    assert rolled["artifact_id"] == second and [v["artifact_id"] for v in rolled["versions"]] == [second]
    back = ok_json("deployments", "update", created["id"], "--artifact", first, "--strategy", "replace", *key)
    assert back["artifact_id"] == first and [h["to"] for h in back["history"]][-2:] == [
        {second: 100},
        {first: 100},
    ]
    bad = cli("deployments", "update", created["id"], "--traffic", f"{first}=ninety", *key)
    assert bad.exit_code == 2 and "ART_ID=PERCENT" in bad.stderr
    refused = cli(
        "deployments", "update", created["id"], "--traffic", f"{first}=90", "--traffic", f"{second}=5", *key
    )
    assert refused.exit_code == 1 and "100" in refused.stderr


def test_deployments_create_and_update_set_and_reset_generation_settings(
    url: str, store: Services, account: dict[str, Any], tmp_path: Path
) -> None:
    template = tmp_path / "chat_template.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    key = ("--url", url, "--key", account["api_key"])
    artifact_id = ready_artifact(store, account["id"], "text-generation")
    settings = ("--max-model-len", "512", "--chat-template", str(template), "--tool-parser", "mistral")
    created = ok("deployments", "create", "tuned", "--artifact", artifact_id, *settings, *key)
    [row] = table_rows(created.stdout)
    shown = " ".join(created.stdout.split())
    assert "max_model_len: 512" in shown and "chat_template: set (50 characters)" in shown
    assert "tool_parser: mistral" in shown
    kwargs = ("--chat-template-kwargs", '{"enable_thinking": false}', "--reasoning-parser", "none")
    updated = ok_json("deployments", "update", row["id"], *kwargs, "--reset", "max_model_len", *key)
    assert (updated["max_model_len"], updated["chat_template"]) == (None, template.read_text())
    assert (updated["chat_template_kwargs"], updated["reasoning_parser"]) == (
        {"enable_thinking": False},
        "none",
    )
    refused = cli("deployments", "update", row["id"], "--tool-parser", "nope", *key)
    assert refused.exit_code == 1 and "tool_parser 'nope' is not one of" in " ".join(refused.stderr.split())
    not_json = cli("deployments", "update", row["id"], "--chat-template-kwargs", "{nope", *key)
    assert not_json.exit_code == 2 and "not JSON" in not_json.stderr
    weighted = ok("deployments", "update", row["id"], "--fair-token-weights", "1:4", *key)
    assert "fair_token_weights: 1:4" in " ".join(weighted.stdout.split())
    reset = ok_json("deployments", "update", row["id"], "--reset", "fair_token_weights", *key)
    assert reset["fair_token_weights"] == {}  # back to 1 and 2
    not_two = cli("deployments", "update", row["id"], "--fair-token-weights", "2", *key)
    assert not_two.exit_code == 2 and "PROMPT:OUTPUT" in not_two.stderr


def test_deployments_list_shows_each_deployment_in_a_table(
    url: str, store: Services, account: dict[str, Any]
) -> None:
    first = new_deployment(url, store, account, "alpha")
    second = new_deployment(url, store, account, "beta")
    result = ok("deployments", "list", "--url", url, "--key", account["api_key"])
    rows = table_rows(result.stdout)
    assert [(row["id"], row["model"], row["artifact_id"]) for row in rows] == [
        (first["id"], "alpha", first["artifact_id"]),
        (second["id"], "beta", second["artifact_id"]),
    ]
    assert all(row["readiness"] == "cold" and row["state"] == "unloaded" for row in rows)


def test_deployments_delete_removes_it_and_frees_its_artifact(
    url: str, store: Services, account: dict[str, Any]
) -> None:
    deployment = new_deployment(url, store, account, "doomed")
    kept = new_deployment(url, store, account, "kept")
    deleted = ok_json("deployments", "delete", deployment["id"], "--url", url, "--key", account["api_key"])
    assert deleted == {"id": deployment["id"], "object": "deployment.deleted", "deleted": True}
    listed = ok_json("deployments", "list", "--url", url, "--key", account["api_key"])
    assert [item["id"] for item in listed["data"]] == [kept["id"]]
    assert artifact_deployment_count(store, deployment["artifact_id"]) == 0

    again = cli("deployments", "delete", deployment["id"], "--url", url, "--key", account["api_key"])
    assert again.exit_code == 1
    assert again.stderr.strip() == "error: Deployment not found (404 deployment_not_found)"


def test_deployments_create_with_an_unknown_artifact_prints_not_found(
    url: str, account: dict[str, Any]
) -> None:
    result = cli(
        "deployments", "create", "m", "--artifact", "art_nope", "--url", url, "--key", account["api_key"]
    )
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.strip() == "error: Model artifact not found (404 artifact_not_found)"


# ---------------------------------------------------------------------------------- files and batches


@pytest.fixture(scope="module")
def batcher(url: str, recipes: Path) -> tuple[str, ...]:
    """An account whose warm `embedder` deployment (the tiny sentence-transformers recipe) answers the
    batch commands' lines; its `--url` and `--key` options."""
    with httpx.Client(base_url=url, timeout=120) as http:
        created = http.post(
            "/v1/admin/accounts", json={"name": "batcher", "credits": 100}, headers=bearer(ADMIN_KEY)
        )
        key = created.json()["api_key"]
        folder = recipes / "t03_feature_extraction" / "st"
        artifact = push_folder_sync(http, key, folder, "feature-extraction")
        deployed = http.post(
            "/v1/deployments",
            json={"model": "embedder", "artifact_id": artifact, "readiness": "warm"},
            headers=bearer(key),
        )
        assert deployed.status_code == 201, deployed.text
    return ("--url", url, "--key", key)


def requests_file(folder: Path, texts: list[Any], model: str = "embedder") -> Path:
    """A batch input file: one embeddings request per text, `r0`, `r1`, ..."""
    path = folder / "requests.jsonl"
    lines = [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": model, "input": t},
        }
        for i, t in enumerate(texts)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def uploaded(batcher: tuple[str, ...], path: Path) -> str:
    """A file uploaded over HTTP (not through the CLI under test); its ID."""
    url, key = batcher[1], batcher[3]
    with path.open("rb") as content:
        answer = httpx.post(
            f"{url}/v1/files",
            files={"file": (path.name, content)},
            data={"purpose": "batch"},
            headers=bearer(key),
        )
    assert answer.status_code == 200, answer.text
    file_id: str = answer.json()["id"]
    return file_id


def jsonl_of(stdout: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines()]


DATE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


def test_files_upload_get_list_download_and_delete_a_file(batcher: tuple[str, ...], tmp_path: Path) -> None:
    path = requests_file(tmp_path, ["one", "two"])
    [row] = table_rows(ok("files", "upload", str(path), *batcher).stdout)
    assert (row["filename"], row["purpose"], int(row["bytes"])) == (
        "requests.jsonl",
        "batch",
        path.stat().st_size,
    )
    assert DATE.fullmatch(row["created_at"]) and row["expires_at"] == "-"  # Unix times shown as UTC dates
    file_id = row["id"]
    shown = ok_json("files", "get", file_id, *batcher)
    assert shown == httpx.get(f"{batcher[1]}/v1/files/{file_id}", headers=bearer(batcher[3])).json()
    assert isinstance(shown["created_at"], int)  # --json: the object as the API answers it
    listed = ok_json("files", "list", "--purpose", "batch", *batcher)
    assert file_id in [item["id"] for item in listed["data"]]
    assert ok_json("files", "list", "--purpose", "batch_output", *batcher)["data"] == []

    assert ok("files", "download", file_id, *batcher).stdout_bytes == path.read_bytes()
    target = tmp_path / "copy.jsonl"
    saved = ok("files", "download", file_id, "--output", str(target), *batcher)
    assert target.read_bytes() == path.read_bytes()
    assert saved.stdout.strip() == f"{path.stat().st_size} bytes written to {target}"

    deleted = ok_json("files", "delete", file_id, *batcher)
    assert deleted == {"id": file_id, "object": "file", "deleted": True}
    missing = cli("files", "download", file_id, "-o", str(tmp_path / "gone.jsonl"), *batcher)
    assert missing.exit_code == 1 and missing.stdout == ""
    assert missing.stderr.strip() == f"error: No such File object: {file_id} (404 file_not_found)"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy.jsonl", "requests.jsonl"]  # no half file


def test_files_upload_with_an_expiry_and_a_file_that_is_not_jsonl(
    batcher: tuple[str, ...], tmp_path: Path
) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("hello")
    kept = ok_json(
        "files", "upload", str(notes), "--purpose", "user_data", "--expires-after", "3600", *batcher
    )
    assert kept["purpose"] == "user_data" and kept["expires_at"] == kept["created_at"] + 3600
    refused = cli("files", "upload", str(notes), *batcher)  # purpose batch: checked as JSONL
    assert refused.exit_code == 1 and refused.stdout == ""
    assert "(400 invalid_file_format)" in refused.stderr


def test_batches_create_uploads_a_local_file_and_waits_showing_progress(
    batcher: tuple[str, ...], tmp_path: Path
) -> None:
    # an empty input is refused by the route: that line goes to the errors file
    path = requests_file(tmp_path, ["the first line", "the second line", []])
    waited = cli(
        "batches", "create", str(path), "--endpoint", "/v1/embeddings", "--metadata", "job=nightly",
        "--metadata", "team=search", "--wait", "--every", "0.2", "--json", *batcher,
    )  # fmt: skip
    assert waited.exit_code == 0, (waited.stdout, waited.stderr, waited.exception)
    batch = json.loads(waited.stdout)  # stdout: the batch only; its progress went to stderr
    assert (batch["status"], batch["endpoint"], batch["model"]) == ("completed", "/v1/embeddings", "embedder")
    assert batch["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    assert batch["metadata"] == {"job": "nightly", "team": "search"}
    progress = waited.stderr.splitlines()
    assert progress[0] == f"{batch['id']}: validating, 0/0 lines done (0 completed, 0 failed)"
    assert progress[-1] == f"{batch['id']}: completed, 3/3 lines done (2 completed, 1 failed)"
    source = ok_json("files", "get", batch["input_file_id"], *batcher)
    assert (source["filename"], source["purpose"]) == ("requests.jsonl", "batch")  # uploaded first

    output = jsonl_of(ok("files", "download", batch["output_file_id"], *batcher).stdout_bytes)
    assert [(line["custom_id"], line["response"]["status_code"]) for line in output] == [
        ("r0", 200),
        ("r1", 200),
    ]
    assert len(output[0]["response"]["body"]["data"][0]["embedding"]) > 0
    errors = jsonl_of(ok("files", "download", batch["error_file_id"], *batcher).stdout_bytes)
    assert [(line["custom_id"], line["response"]["status_code"]) for line in errors] == [("r2", 400)]
    outputs = ok_json("files", "list", "--purpose", "batch_output", *batcher)["data"]
    assert {batch["output_file_id"], batch["error_file_id"]} <= {item["id"] for item in outputs}


def test_batches_create_from_an_uploaded_file_then_list_and_get_show_it_in_tables(
    batcher: tuple[str, ...], tmp_path: Path
) -> None:
    file_id = uploaded(batcher, requests_file(tmp_path, ["alpha", "beta"]))
    [created] = table_rows(
        ok("batches", "create", "--input-file-id", file_id, "--endpoint", "/v1/embeddings", *batcher).stdout
    )
    assert created["status"] == "validating" and (created["completed"], created["total"]) == ("0", "0")
    assert created["output_file_id"] == "-" and DATE.fullmatch(created["created_at"])
    result = cli("batches", "get", created["id"], "--wait", "--every", "0.2", *batcher)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    [done] = table_rows(result.stdout)
    assert (done["id"], done["status"], done["model"]) == (created["id"], "completed", "embedder")
    assert (done["completed"], done["failed"], done["total"]) == ("2", "0", "2")
    assert done["output_file_id"].startswith("file") and done["error_file_id"] == "-"
    assert result.stderr.splitlines()[-1].endswith("completed, 2/2 lines done (2 completed, 0 failed)")

    rows = table_rows(ok("batches", "list", *batcher).stdout)
    assert rows[0]["id"] == created["id"]  # newest first
    assert rows[0] == done
    page = ok_json("batches", "list", "--limit", "1", *batcher)
    assert [b["id"] for b in page["data"]] == [created["id"]] and page["has_more"]
    paged = ok("batches", "list", "--limit", "1", *batcher).stdout
    assert paged.splitlines()[-1] == f"more: --after {created['id']}"
    after = ok_json("batches", "list", "--after", created["id"], "--limit", "100", *batcher)
    assert created["id"] not in [b["id"] for b in after["data"]] and after["data"]


def test_a_batch_whose_line_names_an_unknown_model_fails_and_says_which_line(
    batcher: tuple[str, ...], tmp_path: Path
) -> None:
    wrong = requests_file(tmp_path, ["lost"], model="no-such-model")
    batch = ok_json("batches", "create", str(wrong), "--endpoint", "/v1/embeddings", *batcher)
    failed = cli("batches", "get", batch["id"], "--wait", "--every", "0.2", *batcher)
    assert failed.exit_code == 1  # --wait: it did not complete
    [row] = table_rows(failed.stdout)
    assert (row["status"], row["output_file_id"]) == ("failed", "-")
    assert re.search(r"^error: line 1: .+ \(model_not_found, body\.model\)$", failed.stdout, re.MULTILINE)


def test_batches_cancel_stops_a_running_batch_and_keeps_its_answers(
    batcher: tuple[str, ...], tmp_path: Path
) -> None:
    file_id = uploaded(batcher, requests_file(tmp_path, [f"sentence {i}" for i in range(20_000)]))
    batch = ok_json("batches", "create", "--input-file-id", file_id, "--endpoint", "/v1/embeddings", *batcher)
    [cancelling] = table_rows(ok("batches", "cancel", batch["id"], *batcher).stdout)
    assert cancelling["status"] == "cancelling"
    ended = cli("batches", "get", batch["id"], "--wait", "--every", "0.2", "--json", *batcher)
    assert ended.exit_code == 1, ended.stderr  # it ended, but not completed
    cancelled = json.loads(ended.stdout)
    counts = cancelled["request_counts"]
    # cancelled before its validation (counts all 0) or while it ran: not every line answered
    assert cancelled["status"] == "cancelled" and counts["completed"] + counts["failed"] < 20_000
    if counts["completed"]:  # the answers so far are in its output file
        output = ok("files", "download", cancelled["output_file_id"], *batcher).stdout_bytes
        assert len(output.splitlines()) == counts["completed"]
    again = cli("batches", "cancel", batch["id"], *batcher)
    assert again.exit_code == 1
    assert (
        again.stderr.strip()
        == "error: Cannot cancel a batch with status 'cancelled'. (409 batch_not_cancellable)"
    )


def test_batches_create_needs_one_input_and_metadata_as_key_value(
    batcher: tuple[str, ...], tmp_path: Path
) -> None:
    path = requests_file(tmp_path, ["x"])
    neither = cli("batches", "create", "--endpoint", "/v1/embeddings", *batcher)
    both = cli(
        "batches", "create", str(path), "--input-file-id", "file_x", "--endpoint", "/v1/embeddings", *batcher
    )
    for refused in (neither, both):
        assert refused.exit_code == 2 and "--input-file-id" in refused.output
    unlabelled = cli(
        "batches", "create", str(path), "--endpoint", "/v1/embeddings", "--metadata", "nightly", *batcher
    )
    assert unlabelled.exit_code == 2 and "'nightly' is not key=value" in unlabelled.output
    wrong = cli("batches", "create", str(path), "--endpoint", "/v1/images/generations", *batcher)
    assert wrong.exit_code == 1 and "(400 " in wrong.stderr
    unknown = cli("batches", "get", "batch_nope", *batcher)
    assert unknown.stderr.strip() == "error: No such Batch object: batch_nope (404 batch_not_found)"


# ------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("weak", ["mh-admin-short", "mh-" + "ab" * 20])
def test_serve_refuses_to_start_with_a_guessable_admin_key(
    weak: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from modelhost.config import get_settings

    monkeypatch.setenv("MODELHOST_ADMIN_KEY", weak)
    get_settings.cache_clear()
    try:
        result = cli("serve", "--port", "1")  # refused before anything listens
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 2, (result.stdout, result.exception)
    assert "MODELHOST_ADMIN_KEY" in result.stdout and "does not start" in result.stdout


def test_a_wrong_key_prints_the_servers_error_message_and_exits_1(url: str) -> None:
    wrong = "mh-" + secrets.token_urlsafe(32)
    expected = assert_error(httpx.get(f"{url}/v1/keys", headers=bearer(wrong)), 401, "invalid_api_key")
    result = cli("keys", "list", "--url", url, "--key", wrong)
    assert result.exit_code == 1
    assert isinstance(result.exception, SystemExit)
    assert result.stdout == ""
    assert result.stderr.strip() == f"error: {expected['message']} (401 invalid_api_key)"


def test_a_missing_key_is_refused_with_the_servers_message(url: str) -> None:
    result = cli("accounts", "create", "nobody", "--url", url)
    assert result.exit_code == 1
    assert "Missing API key" in result.stderr
    assert "(401 invalid_api_key)" in result.stderr


def test_an_invalid_request_prints_the_validation_message(url: str) -> None:
    result = cli("accounts", "create", "neg", "--credits", "-1", "--url", url, "--admin-key", ADMIN_KEY)
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        "error: credits: Input should be greater than or equal to 0 (400 invalid_request)"
    )


def test_an_unreachable_url_exits_1_with_a_readable_message() -> None:
    # A bound socket that never listens: connections to its port are refused, and no one else gets it.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        result = cli("accounts", "list", "--url", f"http://127.0.0.1:{port}", "--admin-key", ADMIN_KEY)
    assert result.exit_code == 1
    assert isinstance(result.exception, SystemExit)
    assert result.stdout == ""
    assert result.stderr.startswith(f"error: cannot reach http://127.0.0.1:{port}")
    assert "Traceback" not in result.output


# ------------------------------------------------------------------------------------------ database


def test_db_upgrade_migrates_a_fresh_database_and_prints_the_revision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    database_url = f"sqlite:///{tmp_path / 'fresh' / 'fresh.db'}"
    monkeypatch.setenv("MODELHOST_DATABASE_URL", database_url)
    get_settings.cache_clear()
    try:
        result = ok("db", "upgrade")
        again = ok("db", "upgrade")  # idempotent
    finally:
        get_settings.cache_clear()
    head = migrate.head_revision()
    assert head is not None
    assert result.stdout == f"database at revision {head}\n"
    assert again.stdout == result.stdout
    database = Database(database_url)
    try:
        assert migrate.current_revision(database) == head
    finally:
        database.dispose()


# ------------------------------------------------------------------------------------ the test server


def test_the_live_server_stops_cleanly_and_frees_its_port(tmp_path: Path) -> None:
    before = set(threading.enumerate())
    with live_server(make_settings(tmp_path, f"sqlite:///{tmp_path / 'x.db'}")) as base_url:
        assert httpx.get(f"{base_url}/ready").json()["status"] == "ready"
        assert len(set(threading.enumerate()) - before) >= 1
    # AnyIO's worker threads are told to stop when the server's loop ends and leave a moment later
    deadline = time.monotonic() + 5
    for thread in set(threading.enumerate()) - before:
        thread.join(max(0.0, deadline - time.monotonic()))
    assert {thread for thread in threading.enumerate() if thread not in before} == set()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{base_url}/health")


# ------------------------------------------------------------------------------- output safety


def test_a_narrow_terminal_still_shows_the_whole_key(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    result = ok("accounts", "create", "narrow", "--url", url, "--admin-key", ADMIN_KEY)
    printed = set(KEY_PATTERN.findall(result.stdout))
    assert printed
    # Some printed `mh-` token is the whole secret (a cut-short one is refused).
    statuses = {httpx.get(f"{url}/v1/keys", headers=bearer(key)).status_code for key in printed}
    assert 200 in statuses, (statuses, result.stdout)


def test_an_account_name_with_brackets_is_printed_verbatim(tmp_path: Path) -> None:
    # Its own server: such an account would also break `accounts list` for the module's other tests.
    with live_server(make_settings(tmp_path, f"sqlite:///{tmp_path / 'm.db'}")) as url:
        result = cli("accounts", "create", "[/team]", "--url", url, "--admin-key", ADMIN_KEY)
    assert result.exit_code == 0, result.exception
    [row] = table_rows(result.stdout)
    assert row["name"] == "[/team]"


def test_an_error_message_with_brackets_is_printed_as_an_error(url: str, account: dict[str, Any]) -> None:
    result = cli("deployments", "delete", "[/x]", "--url", url, "--key", account["api_key"])
    assert isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ")
    assert "(404 " in result.stderr


# ------------------------------------------------------------------------------------------ billing


def test_usage_prints_the_balance_and_each_breakdown_as_the_api_returns_it(
    url: str, store: Services, account: dict[str, Any]
) -> None:
    artifact_id = ready_artifact(store, account["id"])
    ledger, now = store.billing.ledger, store.billing.clock.now_ms()
    meter = ledger.open_compute(
        owner="gw_test",
        account_id=account["id"],
        deployment_id="dep_x",
        model="m",
        artifact_id=artifact_id,
        now_ms=now,
    )
    ledger.bill_compute([ComputeReading(meter, now + 2000, 10**9)], close=True)  # 1 GB × 2 s = 0.002
    args = ("usage", "--url", url, "--key", account["api_key"])
    as_json = ok_json(*args)
    assert as_json == httpx.get(f"{url}/v1/usage", headers=bearer(account["api_key"])).json()
    assert (as_json["credits_balance"], as_json["compute_credits"]) == (9.998, 0.002)
    text = ok(*args).stdout
    for title in ("credits", "by deployment", "by artifact", "by day"):
        assert title in text
    assert "dep_x" in text and artifact_id in text and "9.998" in text


def test_accounts_credit_tops_up_and_a_bad_range_is_explained(url: str, account: dict[str, Any]) -> None:
    topped = ok_json("accounts", "credit", account["id"], "2.5", "--url", url, "--admin-key", ADMIN_KEY)
    assert topped["credits"] == account["credits"] + 2.5
    result = cli(
        "usage", "--start", "2026-02-01", "--end", "2026-01-01", "--url", url, "--key", account["api_key"]
    )
    assert result.exit_code == 1 and "end" in result.stderr and "400" in result.stderr


def test_serve_and_quickstart_take_the_number_of_gateway_processes() -> None:
    for command in ("serve", "quickstart"):
        assert "--workers" in ok(command, "--help").stdout


# ------------------------------------------------------------------------------------------- evals


def test_evals_create_run_and_results_grade_a_test_set_and_show_each_criterions_pass_rate(
    batcher: tuple[str, ...], tmp_path: Path
) -> None:
    """An eval made from a JSON file, run on a `jsonl` data source (the answers given beside the items),
    waited for: each criterion's pass rate, then each item's grades; a run that fails exits 1."""
    criteria = [
        {"type": "string_check", "name": "names it", "input": "{{sample.output_text}}",
         "reference": "{{item.answer}}", "operation": "ilike"},
    ]  # fmt: skip
    definition = tmp_path / "capitals.json"
    config = {"type": "custom", "item_schema": {"type": "object"}, "include_sample_schema": True}
    definition.write_text(
        json.dumps({"name": "capitals", "data_source_config": config, "testing_criteria": criteria})
    )
    created = ok_json("evals", "create", str(definition), *batcher, "--json")
    assert created["object"] == "eval" and created["name"] == "capitals"
    rows = [
        {"item": {"answer": "Paris"}, "sample": {"output_text": "It is Paris."}},
        {"item": {"answer": "Rome"}, "sample": {"output_text": "Milan."}},
        {"item": {"answer": "Bern"}, "sample": {"output_text": "bern, of course"}},
    ]
    source = tmp_path / "source.json"
    source.write_text(json.dumps({"type": "jsonl", "source": {"type": "file_content", "content": rows}}))
    result = cli("evals", "run", created["id"], str(source), "--wait", "--every", "0.2", *batcher)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert "names it: 2/3 passed (67%)" in result.stdout and "completed" in result.stdout
    assert "3/3 items graded" in result.stderr
    [run] = ok_json("evals", "runs", created["id"], *batcher, "--json")["data"]
    results = ok("evals", "results", created["id"], run["id"], *batcher).stdout
    assert results.count("names it 1 pass") == 2 and results.count("names it 0 fail") == 1
    failing = ok("evals", "results", created["id"], run["id"], "--status", "fail", *batcher).stdout
    assert failing.count("names it 0 fail") == 1 and "pass" not in failing.split("results", 1)[1]
    listed = ok("evals", "list", *batcher).stdout
    assert created["id"] in listed and "capitals" in listed
    sampled = tmp_path / "sampled.json"
    template = {"type": "template", "template": [{"role": "user", "content": "Capital? {{item.answer}}"}]}
    rows_only = {"type": "file_content", "content": [{"item": r["item"]} for r in rows]}
    sampled.write_text(json.dumps({"type": "completions", "input_messages": template, "source": rows_only}))
    missing = cli("evals", "run", created["id"], str(sampled), "--model", "nope", *batcher)
    assert missing.exit_code == 1 and "nope" in missing.stdout + missing.stderr  # a 404 naming the model
    source.write_text("[1, 2]")
    assert cli("evals", "run", created["id"], str(source), *batcher).exit_code == 2  # not an object
    assert ok_json("evals", "delete", created["id"], *batcher, "--json")["deleted"] is True
