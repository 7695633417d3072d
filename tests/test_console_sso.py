"""The console signed in through single sign-on, in a real browser (Debian's Chromium driven by Playwright)
against a live gateway and a real OpenID provider (panva's oidc-provider, tests/oidc/): the sign-in
button, the session shown in the header, the People page an admin manages, an invitation accepted in the
invitee's own console, signing out (issues 60, 70)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.conftest import make_settings
from tests.helpers import ADMIN_KEY, bearer
from tests.live import live_server
from tests.oidc_provider import CLIENT_ID, CLIENT_SECRET, OidcProvider, available, free_port
from tests.test_console import CHROMIUM, NO_CHROMIUM, SHOTS, TIMEOUT_MS, VIEWPORT


@dataclass
class Signed:
    url: str
    provider: OidcProvider
    account: dict[str, Any]
    page: Any
    errors: list[str]
    browser: Any


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Signed]:
    """A live gateway configured for single sign-on, its account `red`, the provider whose alice is an
    admin there, and a browser page."""
    if CHROMIUM is None:
        pytest.skip(NO_CHROMIUM)
    assert available() is None, available()
    from playwright.sync_api import sync_playwright

    root = tmp_path_factory.mktemp("console-sso")
    port, provider_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    settings = make_settings(
        root,
        f"sqlite:///{root / 'db.sqlite'}",
        oidc_issuer=f"http://127.0.0.1:{provider_port}",
        oidc_client_id=CLIENT_ID,
        oidc_client_secret=CLIENT_SECRET,
        oidc_scopes="openid email profile groups",
        public_url=url,
    )
    with live_server(settings, port=port), httpx.Client(base_url=url, timeout=60) as http:
        account = http.post("/v1/admin/accounts", json={"name": "red"}, headers=bearer(ADMIN_KEY)).json()
        users = {
            "alice": {
                "email": "alice@example.com",
                "name": "Alice",
                "groups": [f"modelhost:{account['id']}:admin"],
            }
        }
        provider = OidcProvider(root / "oidc", [f"{url}/v1/auth/callback"], users, port=provider_port)
        (root / "oidc").mkdir()
        provider.start()
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
                page = browser.new_page(viewport=VIEWPORT)
                page.set_default_timeout(TIMEOUT_MS)
                errors: list[str] = []
                page.on("pageerror", lambda error: errors.append(str(error)))
                yield Signed(url, provider, account, page, errors, browser)
                browser.close()
        finally:
            provider.stop()
    assert not errors, errors


def test_the_console_signs_in_through_the_identity_provider(signed: Signed) -> None:
    page = signed.page
    page.goto(f"{signed.url}/console#keys")
    page.wait_for_selector("#sso-sign-in")
    assert page.locator("#sign-in").count() == 1  # the key paste stays beside it
    page.fill("#sso-login-hint", "alice")
    page.click("#sso-sign-in-button")
    # the provider signs alice in and sends the browser back to the page it left
    page.wait_for_selector("main[data-page='keys'][data-ready='yes']")
    assert page.locator("#signed-in-as").inner_text() == "alice@example.com · admin"
    session = next(c for c in page.context.cookies() if c["name"] == "modelhost_session")
    assert session["httpOnly"] and session["sameSite"] == "Lax"
    assert page.evaluate("document.cookie") == ""  # the script cannot read it
    page.fill("#key-name", "from the console")
    page.click("#key-form button[type=submit]")
    page.wait_for_selector("#key-secret")  # made with the session's CSRF token


def test_an_admin_changes_a_persons_role_disables_them_and_signs_them_out_everywhere(signed: Signed) -> None:
    owner = bearer(signed.account["api_key"])
    carol = httpx.post(
        f"{signed.url}/v1/users", json={"email": "carol@example.com", "role": "viewer"}, headers=owner
    ).json()
    key = httpx.post(f"{signed.url}/v1/keys", json={"user_id": carol["id"], "role": "viewer"}, headers=owner)
    page = signed.page
    page.click("#nav-users")
    page.wait_for_selector("main[data-page='users'][data-ready='yes']")
    row = page.locator("#user-list tbody tr[data-email='carol@example.com']")
    row.wait_for()
    row.locator("select.user-role").select_option("billing")
    row.locator("button.user-toggle", has_text="Disable").click()
    page.locator(
        "#user-list tbody tr[data-email='carol@example.com'] td.state", has_text="disabled"
    ).wait_for()
    row.locator("button.user-sign-out").click()
    row.locator("button.user-sign-out").click()  # the second click confirms
    page.locator("#user-status", has_text="0 sessions ended, 1 keys revoked.").wait_for()
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "people.png"), full_page=True)
    people = httpx.get(f"{signed.url}/v1/users", headers=owner).json()["data"]
    found = next(p for p in people if p["email"] == "carol@example.com")
    assert (found["role"], found["disabled"], found["signs_in"]) == ("billing", True, False)
    assert httpx.get(f"{signed.url}/v1/me", headers=bearer(key.json()["api_key"])).status_code == 401


def test_an_admin_invites_a_person_who_accepts_in_their_own_console(signed: Signed) -> None:
    page = signed.page
    page.fill("#user-email", "dave@example.com")
    page.select_option("#user-role", "developer")
    page.click("#user-form button[type=submit]")
    page.locator("#invitation-table tbody tr[data-email='dave@example.com']").wait_for()

    signed.provider.users["dave"] = {"email": "dave@example.com", "name": "Dave", "groups": []}
    signed.provider.update()
    context = signed.browser.new_context(viewport=VIEWPORT)
    try:
        dave = context.new_page()
        dave.set_default_timeout(TIMEOUT_MS)
        dave.on("pageerror", lambda error: signed.errors.append(str(error)))
        dave.goto(f"{signed.url}/console#overview")
        dave.fill("#sso-login-hint", "dave")
        dave.click("#sso-sign-in-button")
        dave.wait_for_selector("#no-account")  # a member of nothing yet: the invitation is offered
        assert (
            dave.locator("#invitation-list li")
            .inner_text()
            .startswith(f"Account {signed.account['id']}, as developer")
        )
        dave.click("#invitation-list button.invitation-accept")
        # the page may already have been ready before the answer came: wait for what the accept shows
        dave.wait_for_selector("#signed-in-as:has-text('· developer')")
        dave.wait_for_selector("main[data-page='overview'][data-ready='yes']")
        assert dave.locator("#signed-in-as").inner_text() == "dave@example.com · developer"
        assert dave.locator("#invitation-list").count() == 0
    finally:
        context.close()
    page.click("#nav-users")
    page.wait_for_selector("main[data-page='users'][data-ready='yes']")
    page.locator("#user-list tbody tr[data-email='dave@example.com']").wait_for()
    assert page.locator("#invitation-table tbody tr").count() == 0


def test_signing_out_ends_the_session_and_opens_the_providers_logout(signed: Signed) -> None:
    page = signed.page
    page.click("#sign-out")
    page.wait_for_url(f"{signed.provider.issuer}/session/end**")
    ended = page.context.request.get(f"{signed.url}/v1/auth/session")
    assert ended.status == 401
