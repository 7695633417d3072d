"""`modelhost login` and `logout`: a person signs the CLI in through the organization's identity
provider (the device sign-in of RFC 8628, driven by the server: the CLI needs no client of its own), and
the session's token is kept in a file only its owner can read (0600); every command then calls with it
where no key is given (docs/access.md, "The CLI")."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from modelhost.cli.client import ApiClient, err, fail
from modelhost.cli.options import DEFAULT_URL, Url


def credentials_path() -> Path:
    """`$MODELHOST_CONFIG_DIR/credentials.json`, else `~/.config/modelhost/credentials.json`."""
    folder = os.environ.get("MODELHOST_CONFIG_DIR") or str(Path.home() / ".config" / "modelhost")
    return Path(folder) / "credentials.json"


def _read() -> dict[str, dict[str, Any]]:
    try:
        found = json.loads(credentials_path().read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _write(sessions: dict[str, dict[str, Any]]) -> None:
    path = credentials_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(descriptor, 0o600)  # a file that existed keeps no wider mode
    with os.fdopen(descriptor, "w") as file:
        json.dump(sessions, file, indent=2)


def stored_token(url: str) -> str | None:
    """The session token `modelhost login` kept for this server, if any."""
    found = _read().get(url.rstrip("/"), {}).get("session_token")
    return found if isinstance(found, str) else None


def login(
    url: Url = DEFAULT_URL,
    login_hint: Annotated[
        str | None, typer.Option("--login-hint", help="Your username or email at the identity provider.")
    ] = None,
) -> None:
    """Sign in through your organization's identity provider (a code to confirm in a browser)."""
    api = ApiClient(url, None, anonymous=True)
    started = api.call("POST", "/v1/auth/device", json={"login_hint": login_hint})
    where = started.get("verification_uri_complete") or started["verification_uri"]
    err.print(f"Open {where} and confirm the code {started['user_code']}", soft_wrap=True, markup=False)
    interval, deadline = int(started["interval"]), time.monotonic() + int(started["expires_in"])
    while time.monotonic() < deadline:
        time.sleep(interval)
        answer = api.http.post("/v1/auth/device/token", json={"device_code": started["device_code"]})
        if answer.status_code == 200:
            session = answer.json()
            sessions = _read()
            sessions[url.rstrip("/")] = session
            _write(sessions)
            err.print(f"Signed in as {session['email']} until {session['expires_at']}", markup=False)
            return
        code = _code(answer)
        if code == "slow_down":
            interval += 5
        elif code != "authorization_pending":
            api.refuse(answer)
    fail("the sign-in was not confirmed in time")


def logout(url: Url = DEFAULT_URL) -> None:
    """Sign out: the session ends on the server, and its token is removed from this computer."""
    sessions = _read()
    session = sessions.pop(url.rstrip("/"), None)
    if session is None:
        fail(f"not signed in to {url}")
    answer = ApiClient(url, session["session_token"]).http.post("/v1/auth/logout")
    _write(sessions)
    if answer.status_code == 200 and answer.json().get("logout_url"):
        err.print(
            f"Signed out. To sign out at the identity provider too: {answer.json()['logout_url']}",
            markup=False,
        )
    else:
        err.print("Signed out.")


def _code(answer: Any) -> str | None:
    try:
        code = answer.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None
    return code if isinstance(code, str) else None
