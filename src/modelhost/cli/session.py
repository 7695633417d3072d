"""`modelhost login` and `logout`: a person signs the CLI in through the organization's identity
provider (the device sign-in of RFC 8628, driven by the server: the CLI needs no client of its own; or,
with `--browser` or a provider without that grant, the server's browser sign-in handed back to a
loopback listener, RFC 8252), and
the session's token is kept in a file only its owner can read (0600); every command then calls with it
where no key is given (docs/access.md, "The CLI")."""

from __future__ import annotations

import json
import os
import secrets
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs, urlencode, urlparse

import typer

from modelhost.cli.client import ApiClient, err, fail
from modelhost.cli.options import DEFAULT_URL, Url

LOOPBACK_SECONDS = 300  # how long `login --browser` waits for the browser to come back


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
    browser: Annotated[
        bool,
        typer.Option(
            "--browser", help="Sign in in a browser on this computer (a loopback redirect) instead of a code."
        ),
    ] = False,
) -> None:
    """Sign in through your organization's identity provider (a code to confirm in a browser)."""
    api = ApiClient(url, None, anonymous=True)
    session = None
    if not browser:
        answer = api.http.post("/v1/auth/device", json={"login_hint": login_hint})
        if _code(answer) != "device_flow_unsupported":  # else: the provider has no device grant
            api.refuse(answer)
            session = _device_sign_in(api, answer.json())
    if session is None:
        session = _browser_sign_in(api, url, login_hint)
    sessions = _read()
    sessions[url.rstrip("/")] = session
    _write(sessions)
    err.print(f"Signed in as {session['email']} until {session['expires_at']}", markup=False)


def _device_sign_in(api: ApiClient, started: dict[str, Any]) -> dict[str, Any]:
    """RFC 8628: the person opens the link and confirms the code; the CLI polls until they have."""
    where = started.get("verification_uri_complete") or started["verification_uri"]
    err.print(f"Open {where} and confirm the code {started['user_code']}", soft_wrap=True, markup=False)
    interval, deadline = int(started["interval"]), time.monotonic() + int(started["expires_in"])
    while time.monotonic() < deadline:
        time.sleep(interval)
        answer = api.http.post("/v1/auth/device/token", json={"device_code": started["device_code"]})
        if answer.status_code == 200:
            session: dict[str, Any] = answer.json()
            return session
        code = _code(answer)
        if code == "slow_down":
            interval += 5
        elif code != "authorization_pending":
            api.refuse(answer)
    fail("the sign-in was not confirmed in time")


def _browser_sign_in(api: ApiClient, url: str, login_hint: str | None) -> dict[str, Any]:
    """RFC 8252's loopback: the server's sign-in, with its session handed to a one-shot listener on
    127.0.0.1 (a code used once, with this run's `state` back), then exchanged for the session."""
    state = secrets.token_urlsafe(24)
    received: dict[str, str] = {}

    class Callback(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            where = urlparse(self.path)
            found = {k: v[0] for k, v in parse_qs(where.query).items()}
            ok = where.path == "/callback" and secrets.compare_digest(found.get("state", ""), state)
            if ok:
                received.update(found)
            self.send_response(200 if ok else 400)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.end_headers()
            self.wfile.write(b"Signed in: go back to the terminal." if ok else b"Not this sign-in.")

        def log_message(self, *args: Any) -> None:
            pass

    query = {"cli_port": 0, "cli_state": state, **({"login_hint": login_hint} if login_hint else {})}
    with HTTPServer(("127.0.0.1", 0), Callback) as listener:
        query["cli_port"] = listener.server_address[1]
        err.print(
            f"Open {url.rstrip('/')}/v1/auth/login?{urlencode(query)} to sign in",
            soft_wrap=True,
            markup=False,
        )
        listener.timeout = 1
        deadline = time.monotonic() + LOOPBACK_SECONDS
        while "code" not in received and time.monotonic() < deadline:
            listener.handle_request()
    if "code" not in received:
        fail("the sign-in was not finished in time")
    session: dict[str, Any] = api.call("POST", "/v1/auth/cli/token", json={"code": received["code"]})
    return session


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
