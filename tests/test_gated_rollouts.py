"""Gated rollouts (issue 74, part 3; docs/deploy.md, "Gated rollouts"): a rollout that names an eval and
a rule is evaluated on start, promoted step by step while the rule holds, rolled back with its reason
when it fails, each decision on the deployment's `rollout` and in the audit log. The rule is a pure
function, checked first on known figures; then a live server with two tiny chat checkpoints that answer
differently, and an eval that one of them passes and the other does not."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from modelhost.cache import TTLCache
from modelhost.cli.main import app
from modelhost.container import Services
from modelhost.routing import Version
from modelhost.services import gated, gates, rollouts
from modelhost.services.gate_runner import since, since_on_servers
from modelhost.services.gated import RolloutGates
from modelhost.services.gates import Gate, StepMetrics
from modelhost.store.models import Deployment, ModelArtifact
from tests.chat_model import ChatServer, long_context_copy, served_chat_model
from tests.console_browser import signed_in
from tests.helpers import ADMIN_KEY, assert_error, bearer, push_folder_sync

Json = dict[str, Any]
GATE = Gate("eval_1", margin=0.1, steps=(10, 50, 100), step_seconds=60, min_requests=5, max_error_rate=0.05,
            max_ttft_p50_ms=500)  # fmt: skip


# ------------------------------------------------------------------------------ the rule, no server


def test_a_candidate_scoring_at_least_the_current_less_the_margin_passes() -> None:
    assert gates.judge_scores(GATE, 0.9, 0.9).outcome == "pass"
    assert gates.judge_scores(GATE, 0.8, 0.9).outcome == "pass"  # exactly the margin below
    assert gates.judge_scores(GATE, 1.0, 0.5).outcome == "pass"


def test_a_candidate_below_the_margin_fails_naming_both_scores() -> None:
    verdict = gates.judge_scores(GATE, 0.5, 0.9)
    assert verdict.outcome == "fail"
    assert "0.500" in verdict.reason and "0.900" in verdict.reason and "margin 0.1" in verdict.reason
    strict = Gate("eval_1", margin=0.0)
    assert gates.judge_scores(strict, 0.89, 0.9).outcome == "fail"


def test_a_version_whose_run_graded_nothing_fails_the_gate() -> None:
    assert gates.score({}) is None
    assert gates.judge_scores(GATE, None, 0.9).outcome == "fail"
    assert "current version" in gates.judge_scores(GATE, 0.9, None).reason


def test_a_score_is_the_mean_of_the_criteria_pass_rates() -> None:
    assert gates.score({"a": 1.0, "b": 0.5}) == 0.75


def test_a_step_waits_for_its_end_then_passes_within_bounds() -> None:
    good = StepMetrics(requests=100, errors=5, ttft_p50_ms=120)
    assert gates.judge_step(GATE, good, elapsed=30).outcome == "wait"
    verdict = gates.judge_step(GATE, good, elapsed=60)
    assert verdict.outcome == "pass" and "100 requests" in verdict.reason


def test_a_step_over_the_error_rate_rolls_back_naming_it() -> None:
    verdict = gates.judge_step(GATE, StepMetrics(100, 6, 120), elapsed=61)
    assert verdict.outcome == "fail" and "0.060" in verdict.reason and "max_error_rate" in verdict.reason
    unbounded = Gate("eval_1", max_error_rate=None, step_seconds=1)
    assert gates.judge_step(unbounded, StepMetrics(10, 10, None), elapsed=1).outcome == "pass"


def test_a_step_over_the_ttft_p50_rolls_back_naming_it() -> None:
    verdict = gates.judge_step(GATE, StepMetrics(100, 0, 501), elapsed=61)
    assert verdict.outcome == "fail" and "501 ms" in verdict.reason and "max_ttft_p50_ms" in verdict.reason
    assert gates.judge_step(GATE, StepMetrics(100, 0, None), elapsed=61).outcome == "pass"  # no generation


def test_a_step_short_of_its_min_requests_waits_for_them_then_fails() -> None:
    few = StepMetrics(requests=4, errors=0, ttft_p50_ms=None)
    assert gates.judge_step(GATE, few, elapsed=61).outcome == "wait"
    verdict = gates.judge_step(GATE, few, elapsed=60 * gates.MAX_WAIT_STEPS)
    assert verdict.outcome == "fail" and "min_requests" in verdict.reason


def test_steps_follow_each_other_to_the_last() -> None:
    assert [gates.next_step(GATE, s) for s in (None, 0, 1, 2)] == [0, 1, 2, None]


def test_a_p50_is_read_from_histogram_buckets_as_prometheus_does() -> None:
    assert gates.quantile([0.1, 0.2, float("inf")], [0, 0, 0], 0.5) is None
    assert gates.quantile([0.1, 0.2, float("inf")], [2, 2, 0], 0.5) == pytest.approx(0.1)
    assert gates.quantile([0.1, 0.2, float("inf")], [0, 4, 0], 0.5) == pytest.approx(0.15)
    assert gates.quantile([0.1, 0.2, float("inf")], [0, 0, 3], 0.5) == pytest.approx(0.2)


def test_a_steps_metrics_are_the_counts_since_it_began() -> None:
    start = {"requests": 10.0, "errors": 1.0, "ttft": {"0.1": 5.0, "0.2": 10.0, "+Inf": 10.0}}
    end = {"requests": 30.0, "errors": 2.0, "ttft": {"0.1": 5.0, "0.2": 30.0, "+Inf": 30.0}}
    measured = since(start, end)
    assert (measured.requests, measured.errors) == (20, 1)
    assert measured.ttft_p50_ms == pytest.approx(150.0)  # all 20 in (0.1, 0.2]: its middle


def test_the_candidate_stays_loaded_at_zero_percent_while_its_gate_decides() -> None:
    table = [Version("art_old", 100, "active", "t0"), Version("art_new", 0, "loading", "t0")]
    kept = rollouts.loaded(table, "art_new", "t1", keep=("art_new",))
    assert [(v.artifact_id, v.state) for v in kept] == [("art_old", "active"), ("art_new", "active")]
    unkept = rollouts.loaded(table, "art_new", "t1")
    assert [(v.artifact_id, v.state) for v in unkept] == [("art_old", "active"), ("art_new", "draining")]


# ------------------------------------------------------------------------------ through a live server

QUESTIONS = ["Name a city", "Name a river", "Name a colour"]
QUESTION = "{{item.question}}"


def worse_copy(recipes: Path, root: Path) -> Path:
    """The same weights behind another generation prompt: its greedy answers are not the original's."""
    folder = long_context_copy(recipes, root / "worse")
    template = (folder / "chat_template.jinja").read_text()
    prompt = "{{- '<|im_start|>assistant\\n' -}}"
    assert prompt in template
    (folder / "chat_template.jinja").write_text(
        template.replace(prompt, "{{- '<|im_start|>user\\nzq' -}}", 1)
    )
    return folder


@dataclass
class Setup:
    server: ChatServer
    good: str  # the artifact whose answers the eval expects
    worse: str
    eval_id: str


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, recipes: Path) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("gated")
    settings = {"batch_poll_seconds": 0.2, "rollout_gate_poll_seconds": 0.2}
    with served_chat_model(root, recipes, **settings) as server:
        headers = bearer(server.key)
        good = server.http.get(f"/v1/deployments/{server.deployment_id}", headers=headers).json()
        worse = push_folder_sync(server.http, server.key, worse_copy(recipes, root), "text-generation")
        items = [{"item": {"question": q, "expected": answer(server, "chat", q)}} for q in QUESTIONS]
        criteria = [{"type": "string_check", "name": "same", "input": "{{sample.output_text}}",
                     "reference": "{{item.expected}}", "operation": "eq"}]  # fmt: skip
        config = {"type": "custom", "item_schema": {"type": "object"}, "include_sample_schema": True}
        created = server.http.post(
            "/v1/evals", json={"name": "same", "data_source_config": config, "testing_criteria": criteria},
            headers=headers,
        )  # fmt: skip
        assert created.status_code == 200, created.text
        eval_id = created.json()["id"]
        source = {
            "type": "completions",
            "model": "chat",
            "input_messages": {"type": "template", "template": [{"role": "user", "content": QUESTION}]},
            "sampling_params": {"temperature": 0, "max_completion_tokens": 6},
            "source": {"type": "file_content", "content": items},
        }  # fmt: skip
        run = server.http.post(f"/v1/evals/{eval_id}/runs", json={"data_source": source}, headers=headers)
        assert run.status_code == 200, run.text
        yield Setup(server, good["artifact_id"], worse, eval_id)


def answer(server: ChatServer, model: str, question: str) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": question}], "temperature": 0,
            "max_completion_tokens": 6}  # fmt: skip
    answered = server.http.post("/v1/chat/completions", json=body, headers=bearer(server.key))
    assert answered.status_code == 200, answered.text
    text: str = answered.json()["choices"][0]["message"]["content"]
    return text


def patch(server: ChatServer, deployment_id: str, body: Json, key: str | None = None) -> Any:
    return server.http.patch(f"/v1/deployments/{deployment_id}", json=body, headers=bearer(key or server.key))


def settled(server: ChatServer, deployment_id: str, timeout: float = 60) -> Json:
    """The deployment once its gate stopped deciding and its versions stopped moving."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        shown = server.http.get(f"/v1/deployments/{deployment_id}", headers=bearer(server.key)).json()
        rollout = shown["rollout"]
        moving = any(v["state"] in ("loading", "draining") for v in shown["versions"])
        if rollout["state"] not in ("evaluating", "promoting") and not moving:
            return dict(shown)
        time.sleep(0.2)
    raise TimeoutError(f"the gate is still {rollout['state']}: {rollout['decisions']}")


def audited(server: ChatServer, deployment_id: str) -> list[Json]:
    rows = server.http.get(
        "/v1/audit",
        params={"target_id": deployment_id, "limit": 100, "order": "asc"},
        headers=bearer(server.key),
    ).json()["data"]
    return [r for r in rows if r["action"] in gated.ACTIONS.values()]  # a version's load has its own


def test_a_gated_rollout_to_a_worse_candidate_is_rolled_back_with_the_reason(setup: Setup) -> None:
    server = setup.server
    gate = {"eval_id": setup.eval_id, "steps": [50, 100], "step_seconds": 0.5}
    started = patch(server, server.deployment_id, {"artifact_id": setup.worse, "gate": gate})
    assert started.status_code == 200, started.text
    rollout = started.json()["rollout"]
    assert rollout["state"] == "evaluating" and rollout["candidate"] == setup.worse
    assert rollout["current"] == setup.good and rollout["gate"]["steps"] == [50, 100]
    assert {v["artifact_id"]: v["traffic"] for v in started.json()["versions"]} == {
        setup.good: 100,
        setup.worse: 0,
    }

    shown = settled(server, server.deployment_id)
    rollout = shown["rollout"]
    assert rollout["state"] == "rolled_back" and rollout["ended_at"] is not None
    assert [d["decision"] for d in rollout["decisions"]] == ["started", "rolled_back"]
    last = rollout["decisions"][-1]
    assert last["scores"]["candidate"] == 0.0 and last["scores"]["current"] == 1.0
    assert "below the current version's 1.000" in last["reason"]
    assert [(v["artifact_id"], v["traffic"]) for v in shown["versions"]] == [(setup.good, 100)]
    assert shown["artifact_id"] == setup.good

    runs = rollout["eval_runs"]
    for which, artifact in (("candidate", setup.worse), ("current", setup.good)):
        run = server.http.get(
            f"/v1/evals/{setup.eval_id}/runs/{runs[which]}", headers=bearer(server.key)
        ).json()
        assert run["status"] == "completed" and run["data_source"]["artifact_id"] == artifact
    rows = audited(server, server.deployment_id)
    assert [r["action"] for r in rows][-2:] == [
        "deployment.rollout_gate_started",
        "deployment.rollout_rolled_back",
    ]
    assert rows[-1]["changes"]["reason"]["after"] == last["reason"]
    assert rows[-1]["changes"]["scores"]["after"]["candidate"] == 0.0


def test_a_gated_rollout_to_a_better_candidate_is_promoted_step_by_step(setup: Setup) -> None:
    server = setup.server
    created = server.http.post(
        "/v1/deployments", json={"model": "chat-b", "artifact_id": setup.worse, "readiness": "warm"},
        headers=bearer(server.key),
    )  # fmt: skip
    assert created.status_code == 201, created.text
    deployment_id = created.json()["id"]
    answer(server, "chat-b", "warm up")
    served: list[tuple[int, str | None]] = []
    stop = threading.Event()

    def ask() -> None:  # traffic for the steps to judge: the candidate's share of it
        body = {
            "model": "chat-b",
            "messages": [{"role": "user", "content": "hi"}],
            "max_completion_tokens": 2,
        }
        while not stop.is_set():
            got = server.http.post("/v1/chat/completions", json=body, headers=bearer(server.key))
            served.append((got.status_code, got.headers.get("x-modelhost-artifact")))

    client = threading.Thread(target=ask)
    client.start()
    try:
        gate = {"eval_id": setup.eval_id, "steps": [50, 100], "step_seconds": 1, "min_requests": 1,
                "max_error_rate": 0.0, "max_ttft_p50_ms": 60000}  # fmt: skip
        started = patch(server, deployment_id, {"artifact_id": setup.good, "gate": gate})
        assert started.status_code == 200, started.text
        shown = settled(server, deployment_id)
    finally:
        stop.set()
        client.join()
    rollout = shown["rollout"]
    assert rollout["state"] == "promoted", rollout["decisions"]
    decisions = rollout["decisions"]
    assert [(d["decision"], d["step"]) for d in decisions] == [
        ("started", None), ("gate_passed", None), ("promoted_step", 0), ("promoted", 1),
    ]  # fmt: skip
    assert decisions[1]["scores"]["candidate"] == 1.0 and decisions[1]["scores"]["current"] == 0.0
    assert decisions[2]["traffic"] == {setup.worse: 50, setup.good: 50}
    judged = decisions[3]["metrics"]
    assert judged["requests"] >= 1 and judged["errors"] == 0 and judged["ttft_p50_ms"] > 0
    assert decisions[3]["traffic"] == {setup.good: 100}
    assert [(v["artifact_id"], v["traffic"]) for v in shown["versions"]] == [(setup.good, 100)]
    assert {status for status, _ in served} == {200}  # no request failed on the way
    assert {artifact for _, artifact in served} >= {setup.good, setup.worse}  # both served during the step
    assert [r["action"] for r in audited(server, deployment_id)] == [
        "deployment.rollout_gate_started", "deployment.rollout_gate_passed",
        "deployment.rollout_promoted_step", "deployment.rollout_promoted",
    ]  # fmt: skip


def test_a_candidate_over_the_ttft_bound_at_its_step_is_rolled_back_naming_it(setup: Setup) -> None:
    """Its eval passes (a margin of 1 lets any score through), then its live time to first token over
    the step, measured per version, is above a bound no model meets."""
    server = setup.server
    deployment_id = next(
        d["id"]
        for d in server.http.get("/v1/deployments", headers=bearer(server.key)).json()["data"]
        if d["model"] == "chat-b"
    )  # promoted to the good artifact by the test above
    stop = threading.Event()

    def ask() -> None:
        body = {
            "model": "chat-b",
            "messages": [{"role": "user", "content": "hi"}],
            "max_completion_tokens": 2,
        }
        while not stop.is_set():
            server.http.post("/v1/chat/completions", json=body, headers=bearer(server.key))

    client = threading.Thread(target=ask)
    client.start()
    try:
        gate = {"eval_id": setup.eval_id, "margin": 1, "steps": [50, 100], "step_seconds": 1,
                "min_requests": 1, "max_ttft_p50_ms": 0.001}  # fmt: skip
        started = patch(server, deployment_id, {"artifact_id": setup.worse, "gate": gate})
        assert started.status_code == 200, started.text
        shown = settled(server, deployment_id)
    finally:
        stop.set()
        client.join()
    decisions = shown["rollout"]["decisions"]
    assert [(d["decision"], d["step"]) for d in decisions] == [
        ("started", None), ("gate_passed", None), ("promoted_step", 0), ("rolled_back", 0),
    ]  # fmt: skip
    last = decisions[-1]
    assert "max_ttft_p50_ms 0.001" in last["reason"] and last["metrics"]["ttft_p50_ms"] > 0.001
    assert last["traffic"] == {setup.good: 100}
    assert [(v["artifact_id"], v["traffic"]) for v in shown["versions"]] == [(setup.good, 100)]


def test_a_new_rollout_cancels_a_gate_still_deciding(setup: Setup) -> None:
    server = setup.server
    gate = {"eval_id": setup.eval_id, "steps": [100]}
    started = patch(server, server.deployment_id, {"artifact_id": setup.worse, "gate": gate})
    assert started.status_code == 200, started.text
    manual = patch(server, server.deployment_id, {"artifact_id": setup.good})
    assert manual.status_code == 200, manual.text
    rollout = manual.json()["rollout"]
    assert rollout["state"] == "canceled" and rollout["decisions"][-1]["decision"] == "canceled"
    shown = settled(server, server.deployment_id)
    assert shown["rollout"]["decisions"] == rollout["decisions"]  # the runner decided nothing after
    assert [(v["artifact_id"], v["traffic"]) for v in shown["versions"]] == [(setup.good, 100)]
    assert audited(server, server.deployment_id)[-1]["action"] == "deployment.rollout_gate_canceled"


def test_a_gate_is_refused_naming_its_field(setup: Setup) -> None:
    server = setup.server
    for gate, param in (
        ({"eval_id": setup.eval_id, "steps": [50, 90]}, "gate"),
        ({"eval_id": setup.eval_id, "steps": [50, 10, 100]}, "gate"),
        ({"eval_id": setup.eval_id, "margin": 2}, "gate.margin"),
    ):
        refused = patch(server, server.deployment_id, {"artifact_id": setup.worse, "gate": gate})
        assert refused.status_code == 400 and refused.json()["error"]["param"].startswith(param), refused.text
    unknown = patch(server, server.deployment_id, {"artifact_id": setup.worse, "gate": {"eval_id": "eval_x"}})
    assert_error(unknown, 404, code="eval_not_found", param="gate.eval_id")
    alone = patch(
        server, server.deployment_id, {"traffic": {setup.good: 100}, "gate": {"eval_id": setup.eval_id}}
    )
    assert alone.status_code == 400
    same = patch(
        server, server.deployment_id, {"artifact_id": setup.good, "gate": {"eval_id": setup.eval_id}}
    )
    assert_error(same, 400, param="artifact_id")


def test_another_account_sees_no_gate_and_cannot_gate_on_anothers_eval(setup: Setup) -> None:
    server = setup.server
    other = server.http.post("/v1/admin/accounts", json={"name": "other"}, headers=bearer(ADMIN_KEY))
    key = other.json()["api_key"]
    seen = server.http.get(f"/v1/deployments/{server.deployment_id}", headers=bearer(key))
    assert_error(seen, 404, code="deployment_not_found")
    gated = patch(
        server, server.deployment_id, {"artifact_id": setup.worse, "gate": {"eval_id": setup.eval_id}}, key
    )
    assert gated.status_code == 404
    rows = server.http.get(
        "/v1/audit", params={"target_id": server.deployment_id}, headers=bearer(key)
    ).json()
    assert rows["data"] == []


# ------------------------------------------------------------------------- the gate's claim, each database


def _gated_deployment(services: Services) -> str:
    """Deployment `dep_g` of a new account (its ID answered), art_old serving, its gated rollout to
    art_new started."""
    created, _ = services.accounts.create("gates", None)
    account_id = created.account.id
    with services.database.transaction() as session:
        for artifact_id in ("art_old", "art_new"):
            artifact = ModelArtifact(id=artifact_id, account_id=account_id, display_name=artifact_id)
            artifact.pipeline, artifact.status, artifact.deployment_count = "text-generation", "ready", 0
            session.add(artifact)
        session.flush()
        row = Deployment(id="dep_g", account_id=account_id, model="g", artifact_id="art_old")
        row.pipeline, row.readiness, row.engine_in_use = "text-generation", "warm", "transformers"
        session.add(row)
    gate = Gate("eval_1", steps=(50, 100))
    services.deployments.roll(account_id, "dep_g", {"art_new": 100}, loaded=True, gate=gate)
    return str(account_id)


def test_one_runner_drives_a_gate_until_silent_then_another_takes_it_over(services: Services) -> None:
    """The runner's transactions on SQLite and PostgreSQL: one claim at a time, a decision only by the
    runner that holds the gate, a silent runner's gate taken over where it stood, none after its end."""
    account_id = _gated_deployment(services)
    store = RolloutGates(services.database, TTLCache(1, 10))
    first = store.claim("gw-a", stale_seconds=30)
    assert first is not None and first.id == "dep_g"
    assert store.claim("gw-b", stale_seconds=30) is None  # it is gw-a's
    assert store.beat(first, "gw-a") and not store.beat(first, "gw-b")
    read = store.read(first)
    assert read is not None and read[0]["state"] == "evaluating"
    assert read[1] == {"art_old": "active", "art_new": "loading"}
    entry = gated.decision(None, "rolled_back", "a test said so")
    assert not store.decide(first, "gw-b", entry, traffic={"art_old": 100}, state="rolled_back")

    taken = store.claim("gw-b", stale_seconds=0)  # gw-a silent (restarted, or gone)
    assert taken == first and not store.beat(first, "gw-a")
    assert store.decide(taken, "gw-b", entry, traffic={"art_old": 100}, state="rolled_back")
    shown = services.deployments.get(account_id, "dep_g")
    assert shown.rollout is not None and shown.rollout["state"] == "rolled_back"
    assert [d["decision"] for d in shown.rollout["decisions"]] == ["started", "rolled_back"]
    assert [v["artifact_id"] for v in shown.versions or []] == ["art_old"]  # its load dropped
    assert store.claim("gw-c", stale_seconds=0) is None and not store.beat(taken, "gw-b")
    with services.database.transaction() as session:
        used = session.get(ModelArtifact, "art_new")
        assert used is not None and used.deployment_count == 0  # the candidate holds its artifact no more


def test_a_step_is_judged_on_every_servers_requests_each_server_publishes(services: Services) -> None:
    """With several servers behind a balancer, each one's gate runner publishes its counts of a candidate
    being judged; the server driving the gate adds up every server's since the step began: one that
    began counting meanwhile, or restarted, counts all it has. An ended gate's figures are gone."""
    _gated_deployment(services)
    store = RolloutGates(services.database, TTLCache(1, 10))
    claimed = store.claim("gw-a", stale_seconds=30)
    assert claimed is not None and store.promoting() == []  # evaluating: no live traffic judged yet
    assert store.decide(claimed, "gw-a", gated.decision(None, "gate_passed", "ok"), state="promoting", step=0)
    assert store.promoting() == [("dep_g", "art_new")]

    def counts(requests: float, errors: float, fast: float) -> dict[str, Any]:
        buckets = {"0.1": fast, "1.0": requests, "+Inf": requests}
        return {"requests": requests, "errors": errors, "ttft": buckets}

    store.publish("gw-a", "dep_g", "art_new", counts(10, 0, 10))
    store.publish("gw-b", "dep_g", "art_new", counts(4, 1, 0))
    baseline = store.figures("dep_g", "art_new")
    assert baseline == {"gw-a": counts(10, 0, 10), "gw-b": counts(4, 1, 0)}
    store.publish("gw-a", "dep_g", "art_new", counts(30, 0, 30))  # replaces its last: 20 more, fast
    store.publish("gw-b", "dep_g", "art_new", counts(2, 1, 0))  # restarted: 2 since, slow, 1 error
    store.publish("gw-c", "dep_g", "art_new", counts(8, 0, 0))  # new: 8, slow
    measured = since_on_servers(baseline, store.figures("dep_g", "art_new"))
    assert (measured.requests, measured.errors) == (30, 1)
    assert measured.ttft_p50_ms is not None and measured.ttft_p50_ms < 100  # 20 of the 30 under 0.1 s
    assert since_on_servers(baseline, baseline).requests == 0

    ended = gated.decision(0, "rolled_back", "a test said so")
    assert store.decide(claimed, "gw-a", ended, traffic={"art_old": 100}, state="rolled_back")
    assert store.figures("dep_g", "art_new") == {} and store.promoting() == []


def test_the_cli_starts_a_gated_rollout_and_shows_its_steps_and_decisions(setup: Setup) -> None:
    server = setup.server
    key = ("--url", server.url, "--key", server.key)
    update = ["deployments", "update", server.deployment_id, "--artifact", setup.worse]
    gate = ["--gate-eval", setup.eval_id, "--gate-steps", "40,100", "--gate-step-seconds", "0.5"]
    started = CliRunner().invoke(app, [*update, *gate, *key, "--json"])
    assert started.exit_code == 0, (started.stdout, started.stderr)
    assert json.loads(started.stdout)["rollout"]["gate"]["steps"] == [40, 100]
    settled(server, server.deployment_id)
    shown = CliRunner().invoke(app, ["deployments", "get", server.deployment_id, *key])
    assert shown.exit_code == 0, (shown.stdout, shown.stderr)
    text = " ".join(shown.stdout.split())  # the table wraps to the terminal's width
    assert f"gated rollout of {setup.worse} (from {setup.good}): rolled_back" in text
    assert f"eval {setup.eval_id}, margin 0.0, steps 40 % → 100 %" in text
    assert "rolled_back: The candidate scored 0.000" in text and "scores: candidate 0.0, current 1.0" in text
    alone = CliRunner().invoke(
        app, ["deployments", "update", server.deployment_id, "--gate-steps", "100", *key]
    )
    assert alone.exit_code == 2 and "--gate-eval" in alone.stderr


def test_the_console_shows_the_rollouts_steps_and_decisions(setup: Setup) -> None:
    """The deployment's card, after the CLI's gated rollout above was rolled back."""
    server = setup.server
    with signed_in(server.url, server.key) as (page, errors):
        page.click("#nav-deployments")
        card = page.locator("section.deployment[data-model='chat'][data-rollout='rolled_back']")
        card.wait_for()
        steps = card.locator(".rollout-steps li").all_inner_texts()
        decisions = card.locator(".rollout-decisions tbody tr")
        reason = decisions.last.locator(".reason").inner_text()
        shown = [decisions.nth(i).get_attribute("data-decision") for i in range(decisions.count())]
        heading = card.locator(".rollout h4").inner_text()
    assert steps == ["40 %", "100 %"] and shown == ["started", "rolled_back"]
    assert reason.startswith("The candidate scored 0.000, below the current version's 1.000")
    assert f"Gated rollout of {setup.worse} (from {setup.good})" in heading and not errors
