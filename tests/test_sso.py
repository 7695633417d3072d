"""Single sign-on against a real OpenID provider (panva's oidc-provider, tests/oidc/): the sign-in flow,
the session it opens and its CSRF token, people and memberships from groups, and every ID token or
callback that must be refused (issue 60; docs/access.md, "Single sign-on")."""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urljoin, urlparse

import httpx
import pytest
from joserfc import jwt
from joserfc.jwk import RSAKey
from sqlalchemy import update

from modelhost.api.app import create_app
from modelhost.auth.oidc import SignInFailed
from modelhost.container import Services
from modelhost.imports.sealing import Sealer
from modelhost.store.models import SsoSession
from modelhost.store.types import utcnow
from tests.conftest import make_settings
from tests.helpers import ADMIN_KEY, assert_error, bearer
from tests.live import live_server
from tests.oidc_provider import CLIENT_ID, CLIENT_SECRET, OidcProvider, available, free_port
from tests.postgres import create_database

PUBLIC = "http://modelhost.test"
SECURE = "https://modelhost.test"  # the same server behind https (its cookie is then `Secure`)
LIVE_PORT = free_port()  # a live server of the module's database, for the CLI's browser sign-in
LIVE = f"http://127.0.0.1:{LIVE_PORT}"


@dataclass
class World:
    provider: OidcProvider
    services: Services
    app: Any
    accounts: dict[str, dict[str, Any]]

    def browser(self) -> httpx.AsyncClient:
        """A person's browser on modelhost: its own cookie jar."""
        transport = httpx.ASGITransport(app=self.app, raise_app_exceptions=False)
        return httpx.AsyncClient(transport=transport, base_url=PUBLIC)


@pytest.fixture(scope="module")
def provider_port() -> int:
    return free_port()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def services(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, provider_port: int
) -> Iterator[Services]:
    root = tmp_path_factory.mktemp("sso")
    if request.param == "sqlite":
        url = f"sqlite:///{root / 'db.sqlite'}"
    else:
        url = create_database(request.getfixturevalue("postgres_base_url"), f"sso_{secrets.token_hex(6)}")
    settings = make_settings(
        root,
        url,
        oidc_issuer=f"http://127.0.0.1:{provider_port}",
        oidc_client_id=CLIENT_ID,
        oidc_client_secret=CLIENT_SECRET,
        oidc_scopes="openid email profile groups",
        public_url=PUBLIC,
        session_idle_seconds=60,
        session_renew_seconds=30,
        anonymous_requests_per_minute=0,  # many sign-ins from one address here (the throttle: its own tests)
    )
    built = Services.build(settings)
    yield built
    built.close()


@pytest.fixture(scope="module")
async def world(
    services: Services, provider_port: int, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[World]:
    """Two accounts, and the provider's people: alice a developer in `red`, bob an admin in `red` and a
    viewer in `blue`, olga the operator, nina in no account."""
    assert available() is None, available()
    app = create_app(services=services)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url=PUBLIC) as admin:
        accounts = {}
        for name in ("red", "blue"):
            made = await admin.post("/v1/admin/accounts", json={"name": name}, headers=bearer(ADMIN_KEY))
            accounts[name] = made.json()
    red, blue = accounts["red"]["id"], accounts["blue"]["id"]
    users = {
        "alice": {
            "email": "alice@example.com",
            "name": "Alice",
            "groups": [f"modelhost:{red}:developer", "staff"],
        },
        "bob": {
            "email": "bob@example.com",
            "name": "Bob",
            "groups": [f"modelhost:{red}:admin", f"modelhost:{blue}:viewer"],
        },
        "olga": {"email": "olga@example.com", "name": "Olga", "groups": ["modelhost:operator"]},
        "nina": {"email": "nina@example.com", "name": "Nina", "groups": ["modelhost:acc_nowhere:owner"]},
    }
    provider = OidcProvider(
        tmp_path_factory.mktemp("oidc"),
        [f"{PUBLIC}/v1/auth/callback", f"{SECURE}/v1/auth/callback", f"{LIVE}/v1/auth/callback"],
        users,
        port=provider_port,
    )
    provider.start()
    try:
        yield World(provider, services, app, accounts)
    finally:
        provider.stop()


async def to_callback(
    browser: httpx.AsyncClient, hint: str, return_to: str = "/console", public: str = PUBLIC
) -> str:
    """Start a sign-in on modelhost and follow the provider's redirects (it signs `hint` in): the callback
    URL it sends the browser back to, not yet opened."""
    started = await browser.get("/v1/auth/login", params={"login_hint": hint, "return_to": return_to})
    assert started.status_code == 302, started.text
    location = started.headers["location"]
    async with httpx.AsyncClient() as at_provider:  # the provider's own cookies
        for _ in range(10):
            if location.startswith(public):
                return location.removeprefix(public)
            answer = await at_provider.get(location)
            assert answer.status_code in (302, 303), answer.text
            location = urljoin(str(answer.url), answer.headers["location"])
    raise AssertionError("the provider never sent the browser back")


async def sign_in(browser: httpx.AsyncClient, hint: str) -> dict[str, Any]:
    """Sign `hint` in: the session's view (its cookie now in the browser)."""
    answer = await browser.get(await to_callback(browser, hint))
    assert answer.status_code == 302, answer.text
    session = await browser.get("/v1/auth/session")
    assert session.status_code == 200, session.text
    view: dict[str, Any] = session.json()
    return view


async def test_a_person_signs_in_and_works_with_the_role_their_group_gives(world: World) -> None:
    red = world.accounts["red"]
    async with world.browser() as browser:
        callback = await browser.get(await to_callback(browser, "alice", return_to="/console#deployments"))
        assert (callback.status_code, callback.headers["location"]) == (302, "/console#deployments")
        cookie = callback.headers["set-cookie"]
        assert "modelhost_session=mhs-" in cookie and "HttpOnly" in cookie and "SameSite=lax" in cookie
        assert "Secure" not in cookie  # the public URL is http here
        view = (await browser.get("/v1/auth/session")).json()
        assert (view["email"], view["account_id"], view["role"]) == (
            "alice@example.com",
            red["id"],
            "developer",
        )
        assert view["accounts"] == [{"id": red["id"], "role": "developer"}]
        csrf = {"x-csrf-token": view["csrf_token"]}

        assert (await browser.get("/v1/deployments")).status_code == 200
        assert_error(await browser.get("/v1/users"), 403, "permission_denied")
        assert_error(await browser.post("/v1/keys", json={"name": "mine"}), 403, "csrf_failed")
        wrong = await browser.post("/v1/keys", json={"name": "mine"}, headers={"x-csrf-token": "x" * 43})
        assert_error(wrong, 403, "csrf_failed")
        made = await browser.post("/v1/keys", json={"name": "mine"}, headers=csrf)
        assert (made.status_code, made.json()["user_id"], made.json()["role"]) == (
            201,
            view["user_id"],
            "developer",
        )

    people = (await _as(world, red["api_key"]).get("/v1/users")).json()["data"]
    assert [(p["email"], p["role"]) for p in people] == [("alice@example.com", "developer")]
    rows = (await _as(world, red["api_key"]).get("/v1/audit", params={"target_id": made.json()["id"]})).json()
    assert (rows["data"][0]["actor"]["email"], rows["data"][0]["actor"]["subject"]) == (
        "alice@example.com",
        "alice",
    )
    assert rows["data"][0]["actor"]["key_id"] == view["id"]  # the session that made it


def _as(world: World, key: str) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=world.app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url=PUBLIC, headers=bearer(key))


async def test_a_used_or_unknown_state_and_another_issuer_are_refused(world: World) -> None:
    async with world.browser() as browser:
        callback = await to_callback(browser, "alice")
        query = parse_qs(urlparse(callback).query)
        assert (await browser.get(callback.replace(query["state"][0], "forged-state"))).status_code == 401
        other_iss = callback.replace("iss=", "iss=http%3A%2F%2Fevil.example&was=")
        assert_error(await browser.get(other_iss), 401, "sign_in_failed")
        assert (await browser.get(callback)).status_code == 302
        replayed = await browser.get(callback)  # the same state (and code) again
        assert_error(replayed, 401, "sign_in_failed")


@pytest.mark.parametrize("verifier", ["A" * 64, ""], ids=["wrong", "missing"])
async def test_a_code_redeemed_without_its_pkce_verifier_is_refused_by_the_provider(
    world: World, verifier: str
) -> None:
    async with world.browser() as browser:
        callback = await to_callback(browser, "alice")
        sealer = Sealer.from_settings(world.services.settings)  # the verifier this sign-in keeps, lost
        pending = sealer.open(browser.cookies["modelhost_sign_in"])
        browser.cookies.set(
            "modelhost_sign_in", sealer.seal({**pending, "verifier": verifier}), "modelhost.test", "/v1/auth"
        )
        answer = await browser.get(callback)
        assert_error(answer, 401, "sign_in_failed")
        assert "invalid_grant" in answer.json()["error"]["message"] or "invalid_request" in answer.text


async def test_a_code_replayed_under_a_new_sign_in_is_refused_by_the_provider(world: World) -> None:
    """A used authorization code, brought back with a fresh, valid `state` (so that modelhost itself
    finds nothing wrong): the provider refuses to redeem it twice."""
    async with world.browser() as browser:
        used = await to_callback(browser, "alice")
        assert (await browser.get(used)).status_code == 302
        fresh = await to_callback(browser, "alice")
        old_code = parse_qs(urlparse(used).query)["code"][0]
        new_code = parse_qs(urlparse(fresh).query)["code"][0]
        answer = await browser.get(fresh.replace(new_code, old_code))
        assert_error(answer, 401, "sign_in_failed")
        assert "invalid_grant" in answer.json()["error"]["message"]


@pytest.mark.parametrize("services", ["sqlite"], indirect=True)
async def test_behind_https_the_session_cookie_is_secure(world: World) -> None:
    secure = Services.build(world.services.settings.model_copy(update={"public_url": SECURE}))
    try:
        transport = httpx.ASGITransport(app=create_app(services=secure), raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url=SECURE) as browser:
            started = await browser.get("/v1/auth/login")
            assert "modelhost_sign_in=" in started.headers["set-cookie"]  # the sign-in's own cookie too
            assert "; secure" in started.headers["set-cookie"].lower()
            callback = await to_callback(browser, "alice", public=SECURE)
            answer = await browser.get(callback)
            assert answer.status_code == 302, answer.text
            assert "; Secure" in answer.headers["set-cookie"] or "; secure" in answer.headers["set-cookie"]
    finally:
        secure.close()


async def test_memberships_follow_the_groups_at_each_sign_in_and_sessions_switch_accounts(
    world: World,
) -> None:
    red, blue = world.accounts["red"], world.accounts["blue"]
    async with world.browser() as browser:
        view = await sign_in(browser, "bob")
        assert {a["id"]: a["role"] for a in view["accounts"]} == {red["id"]: "admin", blue["id"]: "viewer"}
        csrf = {"x-csrf-token": view["csrf_token"]}
        switched = await browser.post("/v1/auth/session/account", json={"id": blue["id"]}, headers=csrf)
        assert (switched.json()["account_id"], switched.json()["role"]) == (blue["id"], "viewer")
        assert_error(await browser.get("/v1/models"), 403, "permission_denied")  # a viewer there

    # bob leaves blue's group: his next sign-in removes that membership (and audits it)
    world.provider.users["bob"]["groups"] = [f"modelhost:{red['id']}:developer"]
    world.provider.stop()
    world.provider.start()
    async with world.browser() as browser:
        view = await sign_in(browser, "bob")
        assert view["accounts"] == [{"id": red["id"], "role": "developer"}]
    removed = (await _as(world, blue["api_key"]).get("/v1/audit", params={"action": "user.removed"})).json()
    assert removed["data"][0]["actor"]["email"] == "bob@example.com"


async def test_the_provider_rotating_its_keys_is_followed(world: World) -> None:
    async with world.browser() as browser:
        await sign_in(browser, "alice")  # the old key read
    world.provider.rotate()
    async with world.browser() as browser:
        assert (await sign_in(browser, "alice"))["email"] == "alice@example.com"


async def test_no_account_is_refused_and_the_operator_group_is_the_operator(world: World) -> None:
    async with world.browser() as browser:
        refused = await browser.get(await to_callback(browser, "nina"))
        assert_error(refused, 403, "no_account")
        assert "modelhost_session" not in refused.headers.get("set-cookie", "")
    async with world.browser() as browser:
        view = await sign_in(browser, "olga")
        assert (view["operator"], view["account_id"], view["accounts"]) == (True, None, [])
        assert (await browser.get("/v1/admin/accounts")).status_code == 200
        assert_error(await browser.get("/v1/deployments"), 401, "invalid_api_key")  # no account


async def test_a_session_ends_at_logout_idle_or_when_the_person_is_disabled(world: World) -> None:
    red = world.accounts["red"]
    async with world.browser() as browser:
        view = await sign_in(browser, "alice")
        csrf = {"x-csrf-token": view["csrf_token"]}
        assert_error(await browser.post("/v1/auth/logout"), 403, "csrf_failed")
        ended = await browser.post("/v1/auth/logout", headers=csrf)
        logout_url = ended.json()["logout_url"]
        assert logout_url.startswith(world.provider.issuer + "/session/end?id_token_hint=")
        assert_error(await browser.get("/v1/deployments"), 401, "session_ended")

    async with world.browser() as browser:
        view = await sign_in(browser, "alice")
        with world.services.database.transaction() as session:  # unused for two minutes (idle: 60 s)
            idle = utcnow() - timedelta(seconds=120)
            session.execute(update(SsoSession).where(SsoSession.id == view["id"]).values(last_seen_at=idle))
        world.services.authenticator.forget_all()
        assert_error(await browser.get("/v1/deployments"), 401, "session_ended")

    async with world.browser() as browser:
        view = await sign_in(browser, "alice")
        with world.services.database.transaction() as session:  # signed in 13 hours ago, used just now
            long_ago = utcnow() - timedelta(hours=13)
            session.execute(update(SsoSession).where(SsoSession.id == view["id"]).values(created_at=long_ago))
        world.services.authenticator.forget_all()
        assert_error(await browser.get("/v1/deployments"), 401, "session_ended")  # the absolute lifetime

    async with world.browser() as browser:
        view = await sign_in(browser, "alice")
        owner = _as(world, red["api_key"])
        await owner.patch(f"/v1/users/{view['user_id']}", json={"disabled": True})
        assert_error(await browser.get("/v1/deployments"), 401, "session_ended")
        await owner.patch(f"/v1/users/{view['user_id']}", json={"disabled": False})
        assert (await browser.get("/v1/deployments")).status_code == 200


# ------------------------------------------------------------------- ID tokens that fail a check


def _token(key: dict[str, Any] | RSAKey, claims: dict[str, Any], header: dict[str, Any] | None = None) -> str:
    signing = key if isinstance(key, RSAKey) else RSAKey.import_key(key)
    return jwt.encode({"alg": "RS256", "kid": signing.kid, **(header or {})}, claims, signing)


async def test_id_tokens_that_fail_a_check_are_refused(world: World) -> None:
    oidc = world.services.sessions.oidc
    assert oidc is not None
    issuer, now = world.provider.issuer, int(time.time())
    good = {"iss": issuer, "aud": CLIENT_ID, "sub": "alice", "iat": now, "exp": now + 300, "nonce": "n1"}
    key = world.provider.key
    assert (await oidc.verify(_token(key, good), "n1")).subject == "alice"  # the control

    foreign = RSAKey.generate_key(2048, parameters={"kid": key["kid"]}, private=True)
    refused = {
        "another key's signature": _token(foreign, good),
        "wrong aud": _token(key, {**good, "aud": "someone-else"}),
        "several audiences, azp another": _token(key, {**good, "aud": [CLIENT_ID, "x"], "azp": "x"}),
        "wrong iss": _token(key, {**good, "iss": "http://127.0.0.1:1"}),
        "expired": _token(key, {**good, "iat": now - 7200, "exp": now - 3600}),
        "issued in the future": _token(key, {**good, "iat": now + 3600}),
        "another sign-in's nonce": _token(key, {**good, "nonce": "n2"}),
        "no subject": _token(key, {k: v for k, v in good.items() if k != "sub"}),
        "alg none": _unsigned(good),
        "HS256 with the client secret": _hmac(good),
        "not a JWT": "not-a-token",
    }
    for case, token in refused.items():
        with pytest.raises(SignInFailed):
            await oidc.verify(token, "n1")
            pytest.fail(case)


def _unsigned(claims: dict[str, Any]) -> str:
    import base64
    import json

    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'none'})}.{part(claims)}."


def _hmac(claims: dict[str, Any]) -> str:
    from joserfc.jwk import OctKey

    return jwt.encode({"alg": "HS256"}, claims, OctKey.import_key(CLIENT_SECRET))


def test_sign_in_needs_its_settings_and_never_accepts_none_or_hmac(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="MODELHOST_OIDC_CLIENT_ID"):
        make_settings(tmp_path, "sqlite://", oidc_issuer="https://id.example.com")
    with pytest.raises(ValueError, match="never accepted"):
        make_settings(
            tmp_path,
            "sqlite://",
            oidc_issuer="https://id.example.com",
            oidc_client_id="c",
            oidc_client_secret="s",
            public_url="https://m.example.com",
            oidc_algorithms="RS256,none",
        )


# ------------------------------------------------------------------------------------------ the CLI


@pytest.mark.parametrize("services", ["sqlite"], indirect=True)  # its path does not depend on the database
async def test_the_cli_signs_in_with_a_device_code_keeps_its_session_0600_and_signs_out(
    world: World, tmp_path: Path
) -> None:
    """`modelhost login` as a person runs it: the server starts the provider's device sign-in, the person
    opens the link it prints and is signed in there, the CLI polls, keeps the session's token in a
    0600 file and every command then calls with it; `modelhost logout` ends it."""
    cli = str(Path(sys.executable).parent / "modelhost")
    env = {**os.environ, "MODELHOST_CONFIG_DIR": str(tmp_path / "config")}
    env.pop("MODELHOST_API_KEY", None)
    with live_server(world.services.settings) as url:
        login = subprocess.Popen(
            [cli, "login", "--url", url, "--login-hint", "alice"], env=env, stderr=subprocess.PIPE, text=True
        )
        assert login.stderr is not None
        line = login.stderr.readline()
        link = re.search(r"Open (\S+) and confirm the code (\S+)", line)
        assert link is not None, line
        async with httpx.AsyncClient() as at_provider:  # the person's browser: confirm, sign in there
            page = await at_provider.get(link.group(1))
            form = dict(re.findall(r'name="([^"]+)" value="([^"]*)"', page.text))
            assert form["user_code"] == link.group(2)
            action = re.search(r'action="([^"]+)"', page.text)
            assert action is not None
            confirmed = {**form, "confirm": "yes"}  # the person confirms the code the CLI printed
            answer = await at_provider.post(action.group(1), data=confirmed, follow_redirects=True)
            assert "Sign-in Success" in answer.text, answer.text[:300]
        assert login.wait(60) == 0, login.stderr.read()
        assert "Signed in as alice@example.com" in login.stderr.read()
        stored = tmp_path / "config" / "credentials.json"
        assert stat.S_IMODE(stored.stat().st_mode) == 0o600
        assert json.loads(stored.read_text())[url]["session_token"].startswith("mhs-")

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [cli, *args, "--url", url], env=env, capture_output=True, text=True, timeout=60
            )

        me = json.loads(run("whoami", "--json").stdout)
        assert (me["role"], me["user"]["email"]) == ("developer", "alice@example.com")
        assert run("deployments", "list", "--json").returncode == 0
        out = run("logout")
        assert out.returncode == 0 and "Signed out" in out.stderr
        assert url not in json.loads(stored.read_text())
        again = run("whoami")
        assert again.returncode == 1 and "401" in again.stderr


@pytest.mark.parametrize("services", ["sqlite"], indirect=True)
async def test_the_cli_signs_in_through_a_browser_on_its_loopback(world: World, tmp_path: Path) -> None:
    """`modelhost login --browser`: the link it prints runs the server's sign-in, whose callback hands the
    session to the CLI's listener on 127.0.0.1 (a one-time code, its state back); the CLI keeps it."""
    cli = str(Path(sys.executable).parent / "modelhost")
    env = {**os.environ, "MODELHOST_CONFIG_DIR": str(tmp_path / "config")}
    env.pop("MODELHOST_API_KEY", None)
    settings = world.services.settings.model_copy(update={"public_url": LIVE})
    with live_server(settings, port=LIVE_PORT) as url:
        command = [cli, "login", "--browser", "--url", url, "--login-hint", "alice"]
        login = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
        assert login.stderr is not None
        line = login.stderr.readline()
        link = re.search(r"Open (\S+) to sign in", line)
        assert link is not None, line
        async with httpx.AsyncClient(follow_redirects=True) as person:  # modelhost → provider → loopback
            answer = await person.get(link.group(1))
        assert (answer.status_code, answer.text) == (200, "Signed in: go back to the terminal.")
        assert answer.url.host == "127.0.0.1" and answer.url.path == "/callback"
        assert login.wait(60) == 0, login.stderr.read()
        token = json.loads((tmp_path / "config" / "credentials.json").read_text())[url]["session_token"]
        async with httpx.AsyncClient(base_url=url) as client:
            me = await client.get("/v1/me", headers=bearer(token))
            assert me.json()["user"]["email"] == "alice@example.com"
            used = await client.post("/v1/auth/cli/token", json={"code": answer.url.params["code"]})
            assert_error(used, 401, "sign_in_failed")  # the code worked once
