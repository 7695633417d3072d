"""The web console (/console) in a real browser: headless Debian Chromium driven by Playwright against a
live gateway. One server and one browser page for the module; the tests run in order, each a step a
user takes (sign in, upload, deploy, chat, keys, overview), and each takes its page's screenshot: into
docs/console/ (shown in the README) with `make screenshots`, which sets MODELHOST_CONSOLE_SCREENSHOTS, else
into a temporary folder, so that a test run leaves the checkout as it was."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelhost.api.console import CSP
from modelhost.api.console import STATIC as CONSOLE_STATIC
from tests.conftest import make_settings
from tests.helpers import ADMIN_KEY, bearer, push_folder_sync
from tests.live import live_server
from tests.server_process import ServerProcess
from tests.vllm_setup import wait_for_vllm

CHROMIUM = shutil.which("chromium")
NO_CHROMIUM = (
    "Debian's chromium is not installed: `scripts/setup.sh dev` installs it when run as root "
    "(apt-get install chromium)"
)

SHOTS = Path(
    os.environ.get("MODELHOST_CONSOLE_SCREENSHOTS") or Path(tempfile.gettempdir()) / "modelhost-console-shots"
)
XSS = "<img src=x onerror=alert(1)>"
TIMEOUT_MS = 60_000  # a loaded machine (the whole suite on two cores) loads models slowly
VIEWPORT = {"width": 1280, "height": 860}
BUDGET_MB = 512  # MODELHOST_MEMORY_BUDGET_MB of the capacity test's server


@dataclass
class Console:
    url: str
    http: httpx.Client
    page: Any
    recipes: Path
    dialogs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    key: str = ""

    def go(self, name: str) -> None:
        self.page.click(f"#nav-{name}")
        self.page.wait_for_selector(f"main[data-page='{name}']:not([data-ready='no'])")

    def deploy(self, folder: Path, pipeline: str, model: str) -> str:
        """Push a tiny model and deploy it through the API (the browser steps test doing it by hand)."""
        artifact = push_folder_sync(self.http, self.key, folder, pipeline)
        created = self.http.post(
            "/v1/deployments", json={"model": model, "artifact_id": artifact}, headers=bearer(self.key)
        )
        assert created.status_code == 201, created.text
        deployment_id: str = created.json()["id"]
        return deployment_id

    def playground(self, deployment_id: str) -> Any:
        """The playground, on that deployment; its page."""
        self.go("playground")
        self.page.select_option("#playground-deployment", deployment_id)
        return self.page

    def watch(self, page: Any) -> Any:
        """A page whose dialogs, script errors and CSP violations this module's tests fail on."""
        page.set_default_timeout(TIMEOUT_MS)
        page.on("dialog", lambda dialog: (self.dialogs.append(dialog.message), dialog.dismiss()))
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        page.on(
            "console",
            lambda msg: self.errors.append(msg.text) if "Content Security Policy" in msg.text else None,
        )
        return page

    def new_page(self) -> Any:
        """A page of its own in the same browser (another server's console, its own sessionStorage)."""
        return self.watch(self.page.context.browser.new_page(viewport=VIEWPORT))

    def shot(self, name: str, page: Any = None) -> None:
        SHOTS.mkdir(parents=True, exist_ok=True)
        (page or self.page).screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def png() -> bytes:
    """A 64 x 48 picture of noise."""
    import io

    import numpy as np
    from PIL import Image

    picture = io.BytesIO()
    Image.fromarray(np.random.default_rng(3).integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(
        picture, "PNG"
    )
    return picture.getvalue()


@dataclass
class Server:
    url: str
    http: httpx.Client


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One live gateway for the module; the meter bills every second (the overview's plot)."""
    root = tmp_path_factory.mktemp("console")
    database_url = f"sqlite:///{root / 'db.sqlite'}"
    settings = make_settings(root, database_url, worker_threads=1, billing_tick_seconds=1)
    with live_server(settings) as url, httpx.Client(base_url=url, timeout=60) as http:
        yield Server(url, http)


@pytest.fixture
def capacity_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A gateway whose memory budget is fixed (MODELHOST_MEMORY_BUDGET_MB) and whose replicas' footprints
    are measured every second."""
    root = tmp_path_factory.mktemp("capacity")
    database_url = f"sqlite:///{root / 'db.sqlite'}"
    settings = make_settings(
        root, database_url, worker_threads=1, memory_budget_mb=BUDGET_MB, memory_check_seconds=1
    )
    with live_server(settings) as url, httpx.Client(base_url=url, timeout=60) as http:
        yield Server(url, http)


@pytest.fixture(scope="module")
def console(server: Server, recipes: Path) -> Iterator[Console]:
    if CHROMIUM is None:
        pytest.skip(NO_CHROMIUM)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport=VIEWPORT)
        console = Console(server.url, server.http, page, recipes)
        console.watch(page)
        yield console
        browser.close()
    assert not console.dialogs, console.dialogs


def test_console_files_are_served_with_a_strict_csp_and_nothing_else(server: Server) -> None:
    """No browser needed: the headers, the files, and what is not served."""
    http = server.http
    for path, kind in [
        ("/console", "text/html"),
        ("/console/js/app.js", "text/javascript"),
        ("/console/js/pages/playground.js", "text/javascript"),
        ("/console/console.css", "text/css"),
    ]:
        answer = http.get(path)
        assert answer.status_code == 200, path
        assert answer.headers["content-type"].startswith(kind)
        assert answer.headers["content-security-policy"] == CSP
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["x-frame-options"] == "DENY"
    assert http.get("/console/", follow_redirects=False).headers["location"] == "/console"
    for missing in ("/console/../pyproject.toml", "/console/%2e%2e/api/console.py", "/console/js/missing.js"):
        assert http.get(missing).status_code == 404, missing
    paths = http.get("/openapi.json").json()["paths"]
    assert not any(p.startswith("/console") for p in paths)
    # what the playground builds its forms from: the tasks each endpoint serves
    assert paths["/v1/embeddings"]["post"]["x-modelhost-pipelines"] == ["feature-extraction"]
    assert paths["/v1/chat/completions"]["post"]["x-modelhost-pipelines"] == [
        "text-generation",
        "image-text-to-text",
    ]
    assert "x-modelhost-pipelines" not in paths["/v1/deployments"]["post"]
    # no inline script or style anywhere (the CSP would block it), no HTML strings
    page = http.get("/console").text
    assert "<script>" not in page and "<style" not in page and "style=" not in page
    sources = [p for p in (CONSOLE_STATIC / "js").rglob("*.js") if p.name != "dom.js"]
    assert sources and not any("innerHTML" in p.read_text() for p in sources)


def test_the_page_loads_under_its_csp_and_shows_nothing_without_a_key(console: Console) -> None:
    page = console.page
    response = page.goto(f"{console.url}/console")
    assert response is not None and response.status == 200
    assert response.headers["content-security-policy"] == CSP
    page.wait_for_selector("#sign-in")
    assert page.evaluate("typeof window.uPlot") == "function"  # the plot library, served from here
    assert page.locator("#overview-deployments").count() == 0  # nothing shown without a key
    console.shot("sign-in")


def test_operator_creates_an_account_and_its_key_signs_in(console: Console) -> None:
    page = console.page
    console.go("operator")
    page.fill("#admin-key", ADMIN_KEY)
    page.click("#admin-form button")
    page.fill("#account-name", "acme")
    page.fill("#account-credits", "500")
    page.click("#account-form button")
    console.key = page.locator("#account-key").inner_text().strip()
    assert console.key.startswith("mh-")
    row = page.locator("#account-list tbody tr", has_text="acme")
    row.locator("input.account-top-up").fill("25")
    row.get_by_role("button", name="Add credits").click()
    page.locator("#account-list tbody tr", has_text="525.0000").wait_for()
    row.locator("input.account-weight").fill("2.5")  # its share of shared models (docs/limits.md)
    row.get_by_role("button", name="Set").click()
    accounts = console.http.get("/v1/admin/accounts", headers=bearer(ADMIN_KEY)).json()["data"]
    deadline = time.monotonic() + 10
    while next(a["weight"] for a in accounts if a["name"] == "acme") != 2.5 and time.monotonic() < deadline:
        time.sleep(0.1)
        accounts = console.http.get("/v1/admin/accounts", headers=bearer(ADMIN_KEY)).json()["data"]
    assert next(a["weight"] for a in accounts if a["name"] == "acme") == 2.5
    # the key lives in sessionStorage only: no cookie, nothing in the URL
    console.go("overview")
    page.fill("#sign-in-key", "mh-wrong")
    page.click("#sign-in button")
    page.wait_for_selector("#sign-in-status .error")
    page.fill("#sign-in-key", console.key)
    page.click("#sign-in button")
    page.wait_for_selector("#balance")
    assert page.evaluate("sessionStorage.getItem('modelhost.accountKey')") == console.key
    assert page.context.cookies() == []
    assert console.key not in page.url


# the capacity plot's data, as uPlot holds it: [times, reserved MiB, budget MiB]
PLOTTED = "() => document.querySelector('#capacity-plot').uplot.data"


def test_the_operator_page_plots_reserved_memory_against_the_budget(
    console: Console, capacity_server: Server
) -> None:
    http = capacity_server.http
    account = http.post(
        "/v1/admin/accounts", json={"name": "acme", "credits": 100}, headers=bearer(ADMIN_KEY)
    )
    assert account.status_code == 201, account.text
    key, account_id = account.json()["api_key"], account.json()["id"]
    page = console.new_page()
    capacity_calls: list[str] = []
    page.on(
        "request", lambda r: capacity_calls.append(r.url) if r.url.endswith("/v1/admin/capacity") else None
    )
    try:
        page.goto(f"{capacity_server.url}/console#operator")
        page.fill("#admin-key", ADMIN_KEY)
        page.click("#admin-form button")
        page.wait_for_selector("#capacity-plot canvas")
        plotted = page.evaluate(PLOTTED)
        assert page.evaluate(
            "() => document.querySelector('#capacity-plot').uplot.series.slice(1).map((s) => s.label)"
        ) == ["reserved", "budget"]
        assert plotted[2][-1] == BUDGET_MB and plotted[1][-1] == 0  # the budget set; nothing deployed yet
        assert f"of a {BUDGET_MB}.0 MiB budget" in page.inner_text("#capacity-summary")
        page.locator("#capacity-deployments", has_text="No deployment holds memory").wait_for()
        assert page.locator("#capacity-gpus p").count() == 0  # no GPU here

        artifact = push_folder_sync(
            http, key, console.recipes / "t03_feature_extraction" / "st", "feature-extraction"
        )
        created = http.post(
            "/v1/deployments",
            json={"model": "embedder", "artifact_id": artifact, "readiness": "warm"},
            headers=bearer(key),
        )
        assert created.status_code == 201, created.text
        deployment_id = created.json()["id"]
        page.wait_for_function(f"() => ({PLOTTED})()[1].some((mib) => mib > 0)")  # polled every 2 s
        row = page.locator(
            f"#capacity-deployments tr[data-id='{deployment_id}'][data-state='ready'][data-measured='yes']"
        )
        row.wait_for()
        cells = {c: row.locator(f"td.{c}").inner_text() for c in ("model", "account", "readiness", "state")}
        assert cells == {
            "model": "embedder",
            "account": f"acme {account_id}",
            "readiness": "warm",
            "state": "ready",
        }
        assert row.locator("td.device").inner_text() == "cpu"
        assert row.locator("td.in-flight").inner_text() == "0"
        assert row.locator("td.last-used").inner_text()
        # one deployment holds memory: what the table says it holds is the reserved memory plotted
        footprint, reserved, budget = row.evaluate(  # read together: one poll's answer
            f"tr => [tr.querySelector('td.footprint').textContent, "
            f"...({PLOTTED})().slice(1).map((s) => s.at(-1))]"
        )
        assert footprint.endswith(" MiB (measured)"), footprint
        assert 0 < float(footprint.split(" ")[0]) == pytest.approx(reserved, abs=0.05) and budget == BUDGET_MB

        def with_a_gpu(route: Any) -> None:  # no GPU here: one added to the real answer
            answer = route.fetch()
            body = answer.json()
            mib = 1024 * 1024
            body["gpus"] = [
                {
                    "index": 0,
                    "budget_bytes": 2048 * mib,
                    "reserved_bytes": 512 * mib,
                    "free_bytes": 1536 * mib,
                }
            ]
            route.fulfill(response=answer, json=body)

        page.route("**/v1/admin/capacity", with_a_gpu)
        page.locator("#capacity-gpus p", has_text="GPU 0: 512.0 / 2048.0 MiB").wait_for()
        page.unroute("**/v1/admin/capacity")
        page.locator("#capacity-gpus p").wait_for(state="detached")
        console.shot("operator", page)

        page.click("#nav-keys")  # the page is left: the polling stops
        page.wait_for_selector("main[data-page='keys']:not([data-ready='no'])")
        polled = len(capacity_calls)
        page.wait_for_timeout(2500)
        assert len(capacity_calls) == polled
        assert page.locator("img").count() == 0
    finally:
        page.close()
    assert not console.dialogs and not console.errors, (console.dialogs, console.errors)


def test_a_model_folder_uploads_with_progress_and_checksums(console: Console) -> None:
    page = console.page
    console.go("artifacts")
    folder = console.recipes / "t11_text_generation_chat"
    page.set_input_files("#artifact-folder", str(folder))
    page.fill("#artifact-name", XSS)  # a name is text, never markup
    page.select_option("#artifact-pipeline", "text-generation")
    page.click("#artifact-upload")
    page.wait_for_selector("#inspection-status")
    assert page.locator("#inspection-status").inner_text() == f"{XSS}: ready"
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    rows = page.locator("tr.upload-file")
    assert sorted(rows.nth(i).get_attribute("data-path") for i in range(rows.count())) == files
    assert page.locator("tr.upload-file .ok").count() == len(files)  # every sha256 verified
    assert page.eval_on_selector("#upload-total", "p => p.value === p.max && p.max > 0")
    page.wait_for_selector("#artifact-list td:text-is('ready')")
    assert page.locator("#artifact-list").inner_text().count(XSS) == 1
    assert page.locator("img").count() == 0
    console.shot("artifacts")


def test_a_deployment_is_created_and_becomes_ready(console: Console) -> None:
    page = console.page
    console.go("deployments")
    page.fill("#deploy-model", "chat")
    page.select_option("#deploy-readiness", "warm")
    page.fill("#deploy-max-model-len", "256")  # a generation deployment's own settings
    page.fill("#deploy-chat-template", "{% for m in messages %}{{ m.content }}{% endfor %}")
    page.click("#deploy-form button")
    card = page.locator("section.deployment[data-model='chat']")
    card.wait_for()
    page.wait_for_selector("section.deployment[data-model='chat'][data-state='ready']", timeout=60_000)
    assert "Replicas loaded: 1" in card.inner_text()
    # vLLM is off in the tests: auto chose transformers, and the card says why
    assert card.locator(".engine-in-use").inner_text().startswith("transformers (auto chose transformers")
    settings = card.locator(".generation-settings").inner_text()
    assert "Context: 256 · chat template: set (50 characters)" in settings and "tool parser: auto" in settings
    card.locator("select.readiness").select_option("hot")
    card.locator("input[type=number]").nth(1).fill("2")
    card.locator("input[id$='-max-model-len']").fill("")  # back to the model's own
    card.get_by_role("button", name="Apply").click()
    card.locator(".ok", has_text="saved").wait_for()
    listed = console.http.get("/v1/deployments", headers=bearer(console.key)).json()["data"]
    assert [(d["readiness"], d["min_replicas"], d["max_replicas"]) for d in listed] == [("hot", 1, 2)]
    assert (listed[0]["max_model_len"], listed[0]["chat_template"][:6]) == (None, "{% for")
    page.wait_for_selector("section.deployment[data-model='chat'] .plots [data-points] canvas")
    console.shot("deployments")


def test_the_deployments_page_plots_the_tokens_a_generation_deployment_produces(console: Console) -> None:
    page = console.page
    console.go("deployments")
    tokens = page.locator("section.deployment[data-model='chat'] .plots .tokens")
    page.wait_for_selector("section.deployment[data-model='chat'] .plots .tokens[data-points] canvas")
    assert float(tokens.get_attribute("data-peak") or "nan") == 0  # nothing generated since the page opened
    request = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}
    answer = console.http.post(
        "/v1/chat/completions", json={**request, "min_tokens": 64}, headers=bearer(console.key)
    )
    assert answer.status_code == 200, answer.text
    page.wait_for_function(  # the next scrape, at most 2 s on, shows the rate
        "() => Number(document.querySelector(\"section.deployment[data-model='chat'] .plots .tokens\")"
        ".dataset.peak) > 0"
    )
    console.shot("deployment-tokens")


def test_chat_streams_in_the_playground(console: Console) -> None:
    page = console.page
    console.go("playground")
    page.wait_for_selector("#chat-input")
    page.fill("#chat-max-tokens", "24")
    page.fill("#chat-input", f"hello {XSS}")
    page.click("#chat-send")
    page.wait_for_selector("#chat-log .msg.assistant[data-done='yes']")
    bubble = page.locator("#chat-log .msg.assistant")
    assert int(bubble.get_attribute("data-chunks") or 0) >= 3  # role, streamed text, finish (and usage)
    assert bubble.locator(".content").text_content()  # the model's text (a tiny random model's)
    assert page.locator(".msg.user").inner_text() == f"hello {XSS}"
    assert page.locator("img").count() == 0
    console.shot("playground")


def test_an_agent_run_streams_its_events_live_and_is_deleted(console: Console) -> None:
    page = console.page
    page.fill("#agent-name", XSS)
    page.click("#agent-create")
    page.wait_for_selector("#agent-status .ok")
    page.click("#agent-run")
    page.wait_for_selector("#agent-output[data-done='yes']")
    types = page.locator("tr.agent-event").evaluate_all("rows => rows.map(r => r.dataset.type)")
    assert types[0] == "run.created" and "message.delta" in types and types[-1] == "run.completed", types
    assert page.locator("#agent-output").text_content()
    row = page.locator("#agent-runs tr[data-status='completed']")
    run_id = row.get_attribute("data-id")
    row.get_by_role("button", name="Delete").click()
    row.get_by_role("button", name="Confirm delete").click()
    page.wait_for_selector(f"#agent-runs tr[data-id='{run_id}']", state="detached")
    assert page.locator("#agent-choice").inner_text().startswith(XSS)
    assert page.locator("img").count() == 0
    console.shot("playground-agents")


def test_a_scoped_key_is_created_shown_once_and_revoked(console: Console) -> None:
    page = console.page
    console.go("keys")
    page.fill("#key-name", XSS)
    page.check("#key-scoped")
    page.check("input.key-deployment[data-model='chat']")
    page.fill("#key-requests_per_minute", "5")
    page.fill("#key-weight", "2")
    page.click("#key-form button")
    secret = page.locator("#key-secret").inner_text().strip()
    models = console.http.get("/v1/models", headers=bearer(secret))
    assert [m["id"] for m in models.json()["data"]] == ["chat"]
    row = page.locator("#key-list tr[data-revoked='no']", has_text=XSS)
    assert row.locator("td").nth(1).inner_text() == "deployment"
    assert row.locator("td.limits").inner_text() == "Requests / min: 5"  # the limits set, and what is left
    assert row.locator("td.use").inner_text() == "5 requests, 0 in flight"
    assert row.locator("td.weight").inner_text() == "2"
    console.shot("keys")
    row.locator("button").click()
    row.locator("button").click()  # the second click confirms (no dialog)
    page.wait_for_selector("#key-list tr[data-revoked='yes']")
    assert console.http.get("/v1/models", headers=bearer(secret)).status_code == 401


def test_the_accounts_mcp_servers_are_saved_from_the_people_page(console: Console) -> None:
    page = console.page
    console.go("users")
    page.fill("#mcp-urls", "https://MCP.example.com/mcp/\n\nhttps://b.example")
    page.click("#mcp-form button")
    page.wait_for_selector("#mcp-status .ok")
    listed = console.http.get("/v1/mcp-servers", headers=bearer(console.key)).json()
    assert listed == {"urls": ["https://b.example", "https://mcp.example.com/mcp"]}
    assert page.input_value("#mcp-urls") == "https://b.example\nhttps://mcp.example.com/mcp"
    page.fill("#mcp-urls", "ftp://nope")
    page.click("#mcp-form button")
    page.wait_for_selector("#mcp-status .error")
    assert "http" in page.inner_text("#mcp-status")


def test_quotas_and_role_weights_are_set_on_the_people_page_and_a_person_sees_their_quota(
    console: Console,
) -> None:
    owner = bearer(console.key)
    added = console.http.post(
        "/v1/users", json={"email": "quota@example.com", "role": "owner"}, headers=owner
    )
    user_id = added.json()["id"]
    key = console.http.post("/v1/keys", json={"user_id": user_id}, headers=owner).json()["api_key"]
    page = console.page
    console.go("users")
    page.select_option("#quota-target", "role:developer")
    page.fill("#quota-requests_per_day", "7")
    page.click("#quota-form button")
    page.wait_for_selector("#quota-status .ok")
    page.locator(
        "#role-quota-list tr[data-role='developer'] td.quota", has_text="7 requests per day"
    ).wait_for()
    page.select_option("#quota-target", f"user:{user_id}")
    page.fill("#quota-tokens_per_month", "500")
    page.click("#quota-form button")
    page.locator(f"#user-list tr[data-id='{user_id}'] td.quota", has_text="500 tokens per month").wait_for()
    assert console.http.get(f"/v1/users/{user_id}", headers=owner).json()["quota"]["tokens_per_month"] == 500
    roles = console.http.get("/v1/role-quotas", headers=owner).json()
    assert roles["developer"]["requests_per_day"] == 7
    page.select_option("#role-weight-role", "viewer")
    page.fill("#role-weight-value", "0.5")
    page.click("#role-weight-form button")
    page.locator("#role-weight-list tr[data-role='viewer'] td.weight", has_text="0.5").wait_for()
    assert console.http.get("/v1/role-weights", headers=owner).json()["viewer"] == 0.5
    assert console.http.post("/v1/conversations", json={}, headers=bearer(key)).status_code == 200
    theirs = console.new_page()
    try:
        theirs.goto(f"{console.url}/console#overview")
        theirs.fill("#sign-in-key", key)
        theirs.click("#sign-in button")
        theirs.locator("#my-quota", has_text="Quota: your own.").wait_for()
        text = theirs.inner_text("#my-quota")
        assert "1 requests, 0 tokens." in text  # today: no daily limit
        assert "1 requests, 0 of 500 tokens (500 left)." in text  # this month
    finally:
        theirs.close()
    console.shot("quotas")
    assert not console.dialogs and not console.errors, (console.dialogs, console.errors)


def test_the_audit_page_lists_the_accounts_changes_as_text(console: Console) -> None:
    created = console.http.post("/v1/keys", json={"name": XSS}, headers=bearer(console.key)).json()
    page = console.page
    console.go("audit")
    row = page.locator("#audit-list tr[data-action='key.created']", has_text=created["id"])
    assert XSS in row.locator("td.changes").inner_text()  # the key's name, as text
    assert row.locator("td").nth(3).inner_text().startswith("account key_")  # who: an account key
    assert created["api_key"] not in page.locator("#audit-list").inner_text()
    assert page.locator("img").count() == 0
    page.fill("#audit-action", "key.created")
    page.click("#audit-form button")
    # filtered: only key.created rows stay (the account's creation, by the operator, goes)
    page.wait_for_selector("#audit-list tbody tr:not([data-action='key.created'])", state="detached")
    assert page.locator("#audit-list tbody tr").count() >= 2
    console.shot("audit")


def test_the_overview_draws_credits_per_day_and_lists_deployments(console: Console) -> None:
    page = console.page
    for _ in range(20):  # the meter bills every second here; the first bill may be a tick away
        console.go("overview")
        page.wait_for_selector("#overview-deployments tbody tr td")
        if int(page.get_attribute("#usage-plot", "data-days") or 0) > 0:
            break
        page.wait_for_timeout(500)
    assert int(page.get_attribute("#usage-plot", "data-days") or 0) >= 1  # a day billed
    assert page.get_attribute("#usage-plot", "data-points") == "30"
    canvas = page.locator("#usage-plot canvas")
    assert canvas.count() == 1
    drawn = page.evaluate(
        """() => { const c = document.querySelector('#usage-plot canvas');
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++; return n; }"""
    )
    assert drawn > 100
    assert "chat" in page.locator("#overview-deployments").inner_text()
    console.shot("overview")
    assert page.locator("img").count() == 0
    assert not console.dialogs and not console.errors, (console.dialogs, console.errors)


def test_any_task_gets_a_form_from_the_openapi_document_and_label_scores_as_bars(console: Console) -> None:
    folder = console.recipes / "t15_text_classification"
    page = console.playground(console.deploy(folder, "text-classification", "sentiment"))
    page.select_option("#task-endpoint", "/v1/classifications/text")
    page.fill("#task-form textarea[name='inputs']", f"what a wonderful film {XSS}")
    page.fill("#task-form input[name='top_k']", "2")
    page.click("#task-send")
    page.wait_for_selector("#task-bars tr")
    assert page.locator("#task-bars tr").count() == 2
    assert '"label"' in page.locator("#task-json").inner_text()
    assert page.locator("img").count() == 0
    console.shot("playground-task")


def test_detection_boxes_are_drawn_over_the_image_given_as_a_file(console: Console) -> None:
    folder = console.recipes / "t19_object_detection"
    page = console.playground(console.deploy(folder, "object-detection", "detector"))
    page.set_input_files(
        "input[name='inputs-file']",
        {"name": "street.png", "mimeType": "image/png", "buffer": png()},
    )
    page.fill("#task-form input[name='threshold']", "0")
    page.click("#task-send")
    page.wait_for_selector("#task-boxes .box")
    assert page.locator("#task-boxes .box").count() == page.locator("#task-bars tr").count() > 0
    console.shot("playground-detection")


def test_segments_are_tinted_over_the_image(console: Console) -> None:
    folder = console.recipes / "t06_image_segmentation" / "segformer"
    page = console.playground(console.deploy(folder, "image-segmentation", "segmenter"))
    page.set_input_files(
        "input[name='inputs-file']", {"name": "street.png", "mimeType": "image/png", "buffer": png()}
    )
    page.click("#task-send")
    page.wait_for_selector("#task-masks")
    assert page.locator(".masks .segment").count() >= 1
    console.shot("playground-segmentation")


def test_speech_plays_and_a_transcription_is_uploaded(console: Console) -> None:
    import io
    import math
    import struct
    import wave

    page = console.page
    ids = {}
    for model, (folder, pipeline) in {
        "voice": ("vits", "text-to-speech"),
        "whisper": ("whisper", "automatic-speech-recognition"),
    }.items():
        ids[model] = console.deploy(console.recipes / "t12_speech" / folder, pipeline, model)
    console.go("playground")
    page.select_option("#playground-deployment", ids["voice"])
    page.fill("#task-form textarea[name='input']", "hello there")
    page.click("#task-send")
    page.wait_for_selector("#task-result audio")
    assert page.get_attribute("#task-result audio", "src", timeout=1000).startswith("blob:")
    console.shot("playground-speech")

    clip = io.BytesIO()
    with wave.open(clip, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(b"".join(struct.pack("<h", int(8000 * math.sin(i / 8))) for i in range(16000)))
    page.select_option("#playground-deployment", ids["whisper"])
    page.select_option("#task-endpoint", "/v1/audio/transcriptions")
    page.set_input_files(
        "input[name='file-file']", {"name": "clip.wav", "mimeType": "audio/wav", "buffer": clip.getvalue()}
    )
    page.click("#task-send")
    page.wait_for_selector("#task-json, #task-text")
    assert "text" in page.locator("#task-result").inner_text()


def test_a_generated_image_is_previewed(console: Console) -> None:
    folder = console.recipes / "t13_diffusers_sd"
    page = console.playground(console.deploy(folder, "text-to-image", "painter"))
    page.fill("#task-form textarea[name='prompt']", "a red square")
    page.select_option("#task-form select[name='response_format']", "b64_json")
    page.fill("#task-form input[name='num_inference_steps']", "2")
    page.click("#task-send")
    page.wait_for_selector("#task-result img.answer-image", timeout=60_000)
    page.wait_for_function(
        "() => { const i = document.querySelector('#task-result img.answer-image'); "
        "return i.complete && i.naturalWidth > 0; }"
    )
    console.shot("playground-image")


def test_a_video_job_shows_its_progress_then_plays(console: Console) -> None:
    folder = console.recipes / "t14_diffusers_text_to_video" / "text_to_video_sd"
    page = console.playground(console.deploy(folder, "text-to-video", "t2v"))
    page.fill("#video-size", "32x32")
    page.fill("#video-steps", "2")
    page.click("#video-send")
    page.wait_for_selector("#video-player video", timeout=60_000)
    assert page.get_attribute("#video-player video", "src", timeout=1000).startswith("blob:")
    assert page.locator("#video-status").inner_text() == "completed"
    assert page.eval_on_selector("#video-progress", "p => p.value") == 100
    console.shot("playground-video")


def test_embeddings_show_a_similarity_matrix_and_a_deployment_is_deleted(console: Console) -> None:
    folder = console.recipes / "t03_feature_extraction" / "st"
    deployment_id = console.deploy(folder, "feature-extraction", "embedder")
    page = console.playground(deployment_id)
    page.click("#embed-send")
    matrix = page.locator("table.matrix")
    matrix.wait_for()
    assert matrix.locator("td").count() == 9  # three texts: a 3 x 3 cosine similarity matrix
    assert matrix.locator("td").first.inner_text() == "1.000"
    console.go("deployments")
    card = page.locator("section.deployment[data-model='embedder']")
    card.get_by_role("button", name="Delete").click()
    card.get_by_role("button", name="Confirm delete").click()
    card.wait_for(state="detached")
    gone = console.http.get(f"/v1/deployments/{deployment_id}", headers=bearer(console.key))
    assert gone.status_code == 404


@pytest.fixture(scope="module")
def adapter(recipes: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LoRA adapter (PEFT's folder, rank 8) of the t11 chat model, which the console's server serves as
    `chat` on the transformers engine."""
    from tests.tiny_models.adapters import build_adapter

    folder = tmp_path_factory.mktemp("adapter") / "tuned"
    return build_adapter(recipes / "t11_text_generation_chat", folder, seed=0)


def test_a_model_imports_from_s3_with_its_progress(
    console: Console, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3

    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    s3.create_bucket(Bucket="console")
    folder = console.recipes / "t03_feature_extraction" / "st"
    for full in (p for p in folder.rglob("*") if p.is_file()):
        s3.put_object(  # a public bucket: an import without credentials of its own is unsigned
            Bucket="console",
            Key=f"st/{full.relative_to(folder).as_posix()}",
            Body=full.read_bytes(),
            ACL="public-read",
        )
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)  # the operator's S3 endpoint: the server reads it
    page = console.page
    console.go("artifacts")
    page.fill("#import-source", "s3://console/st")
    page.fill("#import-name", XSS)
    page.select_option("#import-pipeline", "feature-extraction")
    page.click("#import-start")
    page.wait_for_selector("#import-status")
    assert page.locator("#import-status").inner_text() == f"{XSS}: import completed"
    assert page.eval_on_selector("#import-total", "p => p.value === p.max && p.max > 1")
    files = sum(1 for p in folder.rglob("*") if p.is_file())
    assert f"{files}/{files} files" in page.inner_text("#import-text")
    assert page.locator("img").count() == 0


def test_a_gguf_artifact_shows_its_quantization_and_where_it_serves_as_text(
    console: Console, tmp_path: Path
) -> None:
    """A GGUF's architecture is the file's to say: shown as text, never markup."""
    from tests import crafted_gguf

    folder = tmp_path / "q8"
    folder.mkdir()
    (folder / "model.gguf").write_bytes(
        crafted_gguf.gguf(crafted_gguf.model_metadata(XSS), [crafted_gguf.tensor("w", (32, 32), 8, 0)], 2048)
    )
    page = console.page
    console.go("artifacts")
    page.set_input_files("#artifact-folder", str(folder))
    page.select_option("#artifact-pipeline", "text-generation")
    page.click("#artifact-upload")
    assert page.locator("#inspection-status").inner_text() == "q8: ready"
    details = page.locator("#artifact-list .quantization-details").first
    assert details.locator(".quantization").inner_text() == "gguf · Q8_0 · 8-bit · group 32"
    assert details.locator(".gguf").inner_text() == f"GGUF {XSS}, context 2048"
    assert details.locator("li[data-engine='llamacpp'][data-device='cpu']").inner_text() == (
        "llamacpp on cpu: servable"
    )
    assert "served by llama.cpp" in details.locator("li[data-engine='vllm']").inner_text()
    assert page.locator("img").count() == 0


def deployments_posted(page: Any) -> Any:
    return page.expect_request(lambda r: r.method == "POST" and r.url.endswith("/v1/deployments"))


def test_an_adapter_artifact_shows_its_rank_and_its_deploy_form_asks_for_a_base(
    console: Console, adapter: Path
) -> None:
    """No vLLM needed: the adapter is shown as one, its deploy form offers the account's chat deployment as
    its base and sends it as `base_deployment` (nothing else), and the server's refusal of a base on the
    transformers engine is shown."""
    from tests.tiny_models.adapters import TARGETS

    page = console.page
    console.go("artifacts")
    page.set_input_files("#artifact-folder", str(adapter))
    page.select_option("#artifact-pipeline", "text-generation")
    page.click("#artifact-upload")
    assert page.locator("#inspection-status").inner_text() == "tuned: ready"
    row = page.locator("#artifact-list tr[data-kind='adapter']")
    kind = row.locator("td.kind")
    assert kind.inner_text().startswith("adapter")
    assert kind.locator(".rank").inner_text() == "rank 8"
    assert kind.locator(".alpha").inner_text() == "alpha 16"
    assert kind.locator(".targets").inner_text() == ", ".join(sorted(TARGETS))
    assert kind.locator(".bytes").inner_text().endswith(" kB")
    assert page.locator("#artifact-list tr[data-kind='model'] td.kind").first.inner_text() == "model"
    artifact_id = row.get_attribute("data-id")
    listed = console.http.get("/v1/deployments", headers=bearer(console.key)).json()["data"]
    chat = next(d for d in listed if d["model"] == "chat")

    row.get_by_role("button", name="Deploy").click()
    form = page.locator("#artifact-deploy-form[data-kind='adapter']")
    form.wait_for()
    offered = page.locator("#artifact-deploy-base option").evaluate_all("os => os.map((o) => o.value)")
    assert offered == [chat["id"], ""]  # the one text-generation deployment, and a typed name
    assert page.locator("#artifact-deploy-base").input_value() == chat["id"]
    for control in ("readiness", "min", "max", "engine", "base-name"):  # they follow the base
        assert page.locator(f"#artifact-deploy-{control}").is_hidden(), control
    page.fill("#artifact-deploy-model", "tuned")
    with deployments_posted(page) as posted:
        form.get_by_role("button", name="Deploy").click()
    assert posted.value.post_data_json == {
        "model": "tuned",
        "artifact_id": artifact_id,
        "base_deployment": chat["id"],
    }
    refused = page.locator("#artifact-deploy-status .error")
    assert "'chat' runs on the transformers engine" in refused.inner_text()
    assert "engine: vllm" in refused.inner_text()
    console.shot("artifacts-adapter")

    page.select_option("#artifact-deploy-base", "")  # another base, by its ID or name
    page.fill("#artifact-deploy-base-name", "nowhere")
    with deployments_posted(page) as posted:
        form.get_by_role("button", name="Deploy").click()
    assert posted.value.post_data_json["base_deployment"] == "nowhere"
    page.locator("#artifact-deploy-status .error", has_text="No deployment 'nowhere'").wait_for()

    # the Deployments page's form asks the same of an adapter, and the rest of a full model
    console.go("deployments")
    page.select_option("#deploy-artifact", artifact_id)
    assert page.locator("#deploy-base").is_visible() and page.locator("#deploy-readiness").is_hidden()
    page.select_option("#deploy-artifact", chat["artifact_id"])
    assert page.locator("#deploy-base").is_hidden() and page.locator("#deploy-readiness").is_visible()
    listed = console.http.get("/v1/deployments", headers=bearer(console.key)).json()["data"]
    assert not any(d["base_deployment"] for d in listed)
    assert not console.dialogs and not console.errors, (console.dialogs, console.errors)


def test_an_adapter_deployment_is_listed_under_its_base(
    console: Console, adapter: Path, recipes: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Needs vLLM (a base must run on it): a server of its own where vLLM is installed, a base on vLLM
    (cold: nothing loads), the adapter deployed on it from the artifacts page, and the deployments page
    listing it under its base."""
    python, reason = wait_for_vllm()
    if python is None:
        pytest.skip(f"vLLM is not available: {reason}")
    root = tmp_path_factory.mktemp("console-vllm")
    process = ServerProcess(root / "data", f"sqlite:///{root / 'db.sqlite'}", MODELHOST_VLLM_PYTHON=python)
    process.start()
    page = console.new_page()
    try:
        with httpx.Client(base_url=process.url, timeout=120) as http:
            account = http.post("/v1/admin/accounts", json={"name": "tuner"}, headers=bearer(ADMIN_KEY))
            assert account.status_code == 201, account.text
            key = account.json()["api_key"]
            chat = push_folder_sync(http, key, recipes / "t11_text_generation_chat", "text-generation")
            push_folder_sync(http, key, adapter, "text-generation")
            created = {}
            for model, engine in (("base", "vllm"), ("other", "transformers")):
                answer = http.post(
                    "/v1/deployments",
                    json={"model": model, "artifact_id": chat, "engine": engine, "readiness": "cold"},
                    headers=bearer(key),
                )
                assert answer.status_code == 201, answer.text
                created[model] = answer.json()
            assert created["base"]["engine_in_use"] == "vllm"

            page.goto(f"{process.url}/console#artifacts")
            page.fill("#sign-in-key", key)
            page.click("#sign-in button")
            page.wait_for_selector("main[data-page='artifacts'][data-ready='yes']")
            page.locator("#artifact-list tr[data-kind='adapter']").get_by_role(
                "button", name="Deploy"
            ).click()
            page.select_option("#artifact-deploy-base", created["base"]["id"])
            page.fill("#artifact-deploy-model", "tuned")
            page.click("#artifact-deploy-form button")
            page.locator("#artifact-deploy-status .ok", has_text="Deployed tuned").wait_for()
            (tuned,) = [
                d
                for d in http.get("/v1/deployments", headers=bearer(key)).json()["data"]
                if d["base_deployment"]
            ]
            assert tuned["model"] == "tuned" and tuned["base_deployment"] == created["base"]["id"]

        page.click("#nav-deployments")
        page.wait_for_selector("main[data-page='deployments'][data-ready='yes']")
        cards = page.locator("#deployment-list > section.deployment")
        # created base, other, tuned: listed base, its adapter, then the other full model
        assert cards.evaluate_all("cs => cs.map((c) => c.dataset.model)") == ["base", "tuned", "other"]
        card = page.locator("section.deployment.adapter[data-model='tuned']")
        assert card.get_attribute("data-base") == created["base"]["id"]
        assert card.locator(".base-of").inner_text() == "adapter of base"
        assert card.locator(".versions").inner_text() == f"artifact {tuned['artifact_id']}"  # one version
        assert card.locator("select, input").count() == 0  # no readiness, replicas or engine of its own
        console.shot("deployments-adapter", page)
    finally:
        page.close()
        process.stop()
    assert not console.dialogs and not console.errors, (console.dialogs, console.errors)


def batch_of(console: Console, texts: list[Any], metadata: dict[str, str] | None = None) -> str:
    """A batch of embeddings requests made through the API (`c0`, `c1`, ... with the XSS string in their
    IDs); its ID."""
    lines = [
        {"custom_id": f"{XSS} c{i}", "method": "POST", "url": "/v1/embeddings",
         "body": {"model": "batcher", "input": text}}
        for i, text in enumerate(texts)
    ]  # fmt: skip
    headers = bearer(console.key)
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    uploaded = console.http.post(
        "/v1/files", files={"file": ("requests.jsonl", content)}, data={"purpose": "batch"}, headers=headers
    )
    assert uploaded.status_code == 200, uploaded.text
    body = {"input_file_id": uploaded.json()["id"], "endpoint": "/v1/embeddings", "completion_window": "24h"}
    created = console.http.post("/v1/batches", json={**body, "metadata": metadata}, headers=headers)
    assert created.status_code == 200, created.text
    batch_id: str = created.json()["id"]
    return batch_id


def test_a_batch_is_listed_until_it_completes_and_its_files_download_and_show_as_text(
    console: Console,
) -> None:
    console.deploy(console.recipes / "t03_feature_extraction" / "st", "feature-extraction", "batcher")
    batch_id = batch_of(console, ["a sunny day", "a rainy day", []], metadata={"job": XSS})  # [] fails
    page = console.page
    console.go("batches")
    row = page.locator(f"#batch-list tr[data-id='{batch_id}']")
    row.wait_for()
    page.wait_for_selector(
        f"#batch-list tr[data-id='{batch_id}'][data-status='completed']"
    )  # polled every 2 s
    assert row.locator("td.status").inner_text() == "completed"
    assert row.locator("td.batch .metadata").inner_text() == f"job={XSS}"
    assert row.locator("td.progress .done").inner_text() == "3 / 3"
    assert row.locator("td.progress progress").evaluate("p => [p.value, p.max]") == [3, 3]
    assert row.locator("td.progress .counts").inner_text() == "2 completed, 1 failed"
    assert row.locator("td.created").inner_text() and row.locator("td.finished").inner_text()
    assert row.locator("td.actions button").count() == 0  # an ended batch cannot be cancelled

    batch = console.http.get(f"/v1/batches/{batch_id}", headers=bearer(console.key)).json()
    with page.expect_download() as downloading:
        row.locator(".file.output").get_by_role("button", name="Download").click()
    download = downloading.value
    assert download.suggested_filename == f"{batch_id}_output.jsonl"
    saved = Path(download.path()).read_bytes()
    content = console.http.get(f"/v1/files/{batch['output_file_id']}/content", headers=bearer(console.key))
    assert saved == content.content  # the whole file, fetched with the key
    assert [json.loads(line)["custom_id"] for line in saved.splitlines()] == [f"{XSS} c0", f"{XSS} c1"]
    row.locator(".file.errors").get_by_role("button", name="Show").click()
    shown = page.locator("#batch-preview-text")
    shown.wait_for()
    [line] = [json.loads(text) for text in shown.inner_text().splitlines()]  # the text itself, not markup
    assert (line["custom_id"], line["response"]["status_code"]) == (f"{XSS} c2", 400)
    assert page.locator("img").count() == 0

    # a batch long enough to be cancelled while it runs (about 17 s of work on the 2-core machine)
    running = batch_of(console, [f"sentence {i}" for i in range(50_000)])
    console.go("batches")  # shown at once rather than at the next refresh
    row = page.locator(f"#batch-list tr[data-id='{running}'][data-status='in_progress']")
    row.wait_for()
    page.locator(f"#batch-list tr[data-id='{batch_id}'] .file.output").get_by_role(
        "button", name="Show"
    ).click()
    page.locator("#batch-preview h3", has_text="The output of").wait_for()
    console.shot("batches")
    row.get_by_role("button", name="Cancel").click()
    row.get_by_role("button", name="Confirm cancel").click()  # the second click confirms (no dialog)
    ended = page.locator(f"#batch-list tr[data-id='{running}'][data-status='cancelled']")
    ended.wait_for()
    assert int(ended.locator(".counts").get_attribute("data-completed") or 0) < 50_000
    assert ended.locator("td.actions button").count() == 0
    assert not console.dialogs and not console.errors, (console.dialogs, console.errors)


def test_an_evals_runs_show_their_pass_rates_and_items_with_samples_as_text(console: Console) -> None:
    """The Evals page lists an eval with its runs: status, progress and each criterion's pass rate; a
    run's items show their grades and their samples as text (a sample is model output: never markup)."""
    headers = bearer(console.key)
    criteria = [{"type": "string_check", "name": "names it", "input": "{{sample.output_text}}",
                 "reference": "{{item.answer}}", "operation": "ilike"}]  # fmt: skip
    config = {"type": "custom", "item_schema": {"type": "object"}, "include_sample_schema": True}
    body = {"name": f"capitals {XSS}", "data_source_config": config, "testing_criteria": criteria}
    created = console.http.post("/v1/evals", json=body, headers=headers)
    assert created.status_code == 200, created.text
    eval_id = created.json()["id"]
    rows = [
        {"item": {"answer": "Paris"}, "sample": {"output_text": f"Paris {XSS}"}},
        {"item": {"answer": "Rome"}, "sample": {"output_text": "Milan"}},
    ]
    source = {"type": "jsonl", "source": {"type": "file_content", "content": rows}}
    run = console.http.post(f"/v1/evals/{eval_id}/runs", json={"data_source": source}, headers=headers)
    assert run.status_code == 200, run.text
    page = console.page
    console.go("evals")
    row = page.locator(f"#eval-list tr[data-id='{run.json()['id']}'][data-status='completed']")
    row.wait_for()  # polled every 2 s
    assert (
        page.locator(f"#eval-list article[data-id='{eval_id}'] h4").inner_text().startswith(f"capitals {XSS}")
    )
    assert row.locator("td.progress .done").inner_text() == "2 / 2"
    assert row.locator(".rate[data-criterion='names it']").inner_text() == "names it: 1/2 (50 %)"
    row.get_by_role("button", name="Items").click()
    items = page.locator("#eval-item-list tbody tr")
    items.first.wait_for()
    assert [items.nth(i).get_attribute("data-status") for i in range(2)] == ["pass", "fail"]
    assert items.nth(0).locator("td.grades").inner_text() == "names it: 1.000 pass"
    assert items.nth(0).locator("td.sample pre").inner_text() == f"Paris {XSS}"  # the text itself
    assert page.locator("img").count() == 0
    console.shot("evals")
    assert not console.dialogs and not console.errors, (console.dialogs, console.errors)


def test_a_revoked_key_signs_the_tab_out(console: Console) -> None:
    created = console.http.post("/v1/keys", json={"name": "laptop"}, headers=bearer(console.key)).json()
    page = console.page
    page.click("#sign-out")
    page.fill("#sign-in-key", created["api_key"])
    page.click("#sign-in button")
    page.wait_for_selector("main[data-ready='yes']")
    assert page.evaluate("sessionStorage.getItem('modelhost.accountKey')") == created["api_key"]
    revoked = console.http.delete(f"/v1/keys/{created['id']}", headers=bearer(console.key))
    assert revoked.status_code == 200, revoked.text
    console.go("keys")
    page.wait_for_selector("#sign-in-status .error")
    assert page.evaluate("sessionStorage.getItem('modelhost.accountKey')") is None
