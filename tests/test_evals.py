"""OpenAI's Evals API (issue 74; docs/evals.md) through the unchanged openai SDK: evals, runs against the
tiny chat deployment through the batch tier, per-criterion pass rates and per-item results, a model
grader calling a deployment, a file's items, refusals with their reason, another account sees nothing.
The graders themselves are pure functions, checked on known outputs first."""

from __future__ import annotations

import asyncio
import io
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from modelhost.api.app import create_app
from modelhost.api.batch_lines import line_caller
from modelhost.batches.files import Owner
from modelhost.container import Services
from modelhost.errors import Conflict, InvalidRequest, NotFound
from modelhost.evals import graders
from modelhost.evals.runner import EvalRunJob, EvalRunner
from modelhost.evals.sources import checked_config
from modelhost.evals.store import ItemResult
from modelhost.evals.templates import render
from modelhost.generation.compile_sandbox import CompileLimits, GrammarChecker
from modelhost.generation.grammar_bounds import GrammarBounds
from modelhost.generation.value_schemas import first_mismatch
from modelhost.routing import DeploymentRef, Version
from tests.chat_model import ChatServer, served_chat_model
from tests.helpers import ADMIN_KEY, assert_error, bearer

Json = dict[str, Any]
CONFIG: Json = {
    "type": "custom",
    "item_schema": {"type": "object", "properties": {"question": {"type": "string"}}},
    "include_sample_schema": True,
}
NEVER = "no tiny model writes this"


# ------------------------------------------------------------------------------ the graders, no server


@pytest.mark.parametrize(
    ("operation", "given", "reference", "passed"),
    [
        ("eq", "Paris", "Paris", True),
        ("eq", "Paris", "paris", False),
        ("ne", "Paris", "Lyon", True),
        ("ne", "Paris", "Paris", False),
        ("like", "It is Paris.", "Paris", True),
        ("like", "It is paris.", "Paris", False),
        ("ilike", "It is PARIS.", "paris", True),
        ("ilike", "It is Lyon.", "paris", False),
    ],
)
def test_string_check_compares_as_its_operation_says(
    operation: str, given: str, reference: str, passed: bool
) -> None:
    criterion = graders.checked(
        [{"type": "string_check", "name": "s", "input": "{{sample.output_text}}", "reference": "{{item.ref}}",
          "operation": operation}]
    )[0]  # fmt: skip
    graded = graders.grade(criterion, {"ref": reference}, {"output_text": given})
    assert graded == {"name": "s", "type": "string_check", "score": float(passed), "passed": passed}


def test_text_similarity_scores_known_pairs_by_each_metric() -> None:
    same = "the cat sat on the mat"
    for metric in graders.METRICS:
        assert graders.similarity(same, same, metric) == pytest.approx(1.0), metric
        assert graders.similarity("zzzqqq", same, metric) == 0.0, metric
    near = "the cat sat on a mat"
    assert graders.similarity(near, same, "fuzzy_match") == pytest.approx(1 - 4 / 42)  # Indel: 2 of 21 + 21
    assert graders.similarity(near, same, "rouge_1") == pytest.approx(5 / 6)  # 5 of 6 unigrams each way
    assert graders.similarity(near, same, "rouge_2") == pytest.approx(3 / 5)
    assert 0.4 < graders.similarity(near, same, "bleu") < 0.7
    assert 0.5 < graders.similarity(near, same, "gleu") < 0.7


def test_a_text_similarity_criterion_passes_at_its_threshold() -> None:
    criterion = graders.checked(
        [{"type": "text_similarity", "name": "f", "input": "{{sample.output_text}}",
          "reference": "{{item.ref}}", "evaluation_metric": "fuzzy_match", "pass_threshold": 0.9}]
    )[0]  # fmt: skip
    assert graders.grade(criterion, {"ref": "abcdefghij"}, {"output_text": "abcdefghij"})["passed"]
    assert not graders.grade(criterion, {"ref": "abcdefghij"}, {"output_text": "abcdefxxxx"})["passed"]


def test_templates_substitute_item_and_sample_values_and_evaluate_nothing() -> None:
    values = {"item": {"q": "2+2", "n": 4, "nested": {"a": ["x", "y"]}}, "sample": {"output_text": "four"}}
    assert render("Q: {{item.q}} A: {{ sample.output_text }}", values) == "Q: 2+2 A: four"
    assert render("{{item.n}} {{item.nested.a.1}} {{item.nested}}", values) == '4 y {"a":["x","y"]}'
    assert (
        render("{{item.missing}}|{{item.q.__class__}}|{{ 7*7 }}|{{config.items()}}", values)
        == "||{{ 7*7 }}|{{config.items()}}"
    )


def test_a_python_grader_is_refused_saying_why() -> None:
    with pytest.raises(InvalidRequest) as refused:
        graders.checked([{"type": "python", "name": "p", "source": "def grade(s, i): return 1"}])
    assert refused.value.param == "testing_criteria[0].type" and "tenant code" in refused.value.message


def test_a_model_graders_score_is_read_from_its_answer_within_its_range() -> None:
    criterion = graders.checked(
        [{"type": "score_model", "name": "m", "model": "chat", "input": [{"role": "user", "content": "x"}],
          "range": [1, 5], "pass_threshold": 3}]
    )[0]  # fmt: skip
    assert graders.model_result(criterion, '{"result": 4}')["passed"] is True
    assert graders.model_result(criterion, '{"result": 2.5}')["score"] == 2.5
    assert graders.model_result(criterion, "I'd say 9")["score"] == 5.0  # clamped to its range
    assert graders.model_result(criterion, "nothing")["error"] == "The grader's answer has no score."
    labels = graders.checked(
        [{"type": "label_model", "name": "l", "model": "chat", "input": [{"role": "user", "content": "x"}],
          "labels": ["good", "bad"], "passing_labels": ["good"]}]
    )[0]  # fmt: skip
    assert graders.model_result(labels, '{"result": "good"}')["passed"] is True
    assert graders.model_result(labels, '{"result": "bad"}')["passed"] is False


def test_a_stored_completions_config_is_refused_with_its_reason() -> None:
    with pytest.raises(InvalidRequest) as refused:
        checked_config({"type": "stored_completions", "metadata": {}})
    assert refused.value.param == "data_source_config.type" and "custom" in refused.value.message


STRICT: Json = {
    "type": "object",
    "properties": {"question": {"type": "string", "minLength": 1}, "ref": {"type": "string"}},
    "required": ["question", "ref"],
}


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ({"type": "objekt"}, "not a valid JSON schema"),
        ({"properties": {"a": {"pattern": "("}}}, "at $.properties.a.pattern"),
        ({"$schema": "https://example.com/my-dialect"}, "Draft 2020-12"),
        ({"$defs": {"d": {"$ref": "#/$defs/d"}}, "properties": {"a": {"$ref": "other.json"}}}, "outside"),
        ({"properties": {"a": {"pattern": "(a{1000}){1000}"}}}, "repeats 1000000 times"),
    ],
)  # fmt: skip
def test_an_item_schema_that_is_not_a_bounded_json_schema_is_refused_at_creation(
    schema: Json, says: str
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        checked_config({"type": "custom", "item_schema": schema})
    assert refused.value.param == "data_source_config.item_schema" and says in refused.value.message


def test_a_remote_ref_is_refused_and_never_fetched(monkeypatch: pytest.MonkeyPatch) -> None:
    """A `$ref` to a URL is refused when the eval is created, and a validator given one anyway (an eval
    stored before the check) resolves nothing outside the schema: no socket is ever opened."""

    def no_network(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"a connection was attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    remote = {"properties": {"a": {"$ref": "https://json-schema.example/evil.json"}}}
    with pytest.raises(InvalidRequest) as refused:
        checked_config({"type": "custom", "item_schema": remote})
    assert "https://json-schema.example/evil.json" in refused.value.message
    said = first_mismatch(remote, [{"a": 1}], ["item 0"], "the eval's item_schema")
    assert said is not None and "does not resolve within it" in said
    declared = {  # an `$id` the schema declares itself is resolved within it, whatever its URL
        "$defs": {"s": {"$id": "https://json-schema.example/s.json", "type": "string"}},
        "properties": {"a": {"$ref": "https://json-schema.example/s.json"}},
    }
    checked_config({"type": "custom", "item_schema": declared})
    said = first_mismatch(declared, [{"a": "x"}, {"a": 1}], ["item 0", "item 1"], "the eval's item_schema")
    assert said == "item 1 does not match the eval's item_schema: 1 is not of type 'string' (at $.a)."


def test_checking_items_against_a_pathological_pattern_is_bounded_by_the_compile_process() -> None:
    """`(a+)+$` backtracks for ages on a long string of a's ending otherwise: the check runs in a
    compile process, whose CPU limit ends it as a 400 naming the field."""
    schema = {"properties": {"q": {"pattern": "^(a+)+$"}}}
    checked_config({"type": "custom", "item_schema": schema})
    checker = GrammarChecker(
        256, GrammarBounds(), CompileLimits(processes=1, cpu_seconds=1, timeout_seconds=20)
    )
    try:
        started = time.monotonic()
        with pytest.raises(InvalidRequest) as refused:
            asyncio.run(checker.check_values(schema, [{"q": "a" * 64 + "!"}], ["item 0"], "p", "the schema"))
        assert refused.value.param == "p" and "CPU time" in refused.value.message
        assert time.monotonic() - started < 15
        asyncio.run(checker.check_values(schema, [{"q": "aaaa"}], ["item 0"], "p", "the schema"))  # again
    finally:
        checker.close()


# ------------------------------------------------------------------------------ through the server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, recipes: Path) -> Iterator[ChatServer]:
    with served_chat_model(tmp_path_factory.mktemp("evals"), recipes, batch_poll_seconds=0.2) as served:
        yield served


def sdk(server: ChatServer, key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key or server.key, max_retries=0)


def wait(client: openai.OpenAI, eval_id: str, run_id: str, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = client.evals.runs.retrieve(run_id, eval_id=eval_id)
        if run.status in ("completed", "canceled", "failed"):
            return run
        time.sleep(0.2)
    raise TimeoutError(f"run {run_id} still {run.status}")


def new_eval(client: openai.OpenAI, criteria: list[Json]) -> Any:
    return client.evals.create(name="capitals", data_source_config=CONFIG, testing_criteria=criteria)  # type: ignore[arg-type]


QUESTIONS = [{"item": {"question": f"Name city number {i}", "ref": f"city {i}"}} for i in range(4)]
SIMILAR: Json = {
    "type": "text_similarity", "name": "close", "input": "{{sample.output_text}}",
    "reference": "{{item.ref}}", "evaluation_metric": "fuzzy_match", "pass_threshold": 0.05,
}  # fmt: skip


def completions(model: str = "chat", tokens: int = 6) -> Json:
    return {
        "type": "completions",
        "model": model,
        "input_messages": {
            "type": "template",
            "template": [{"role": "user", "content": "{{item.question}}"}],
        },
        "sampling_params": {"temperature": 0, "max_completion_tokens": tokens},
        "source": {"type": "file_content", "content": QUESTIONS},
    }


def test_a_run_samples_the_deployment_as_chat_does_and_grades_each_item(server: ChatServer) -> None:
    client = sdk(server)
    criteria = [
        {"type": "string_check", "name": "differs", "input": "{{sample.output_text}}", "reference": NEVER,
         "operation": "ne"},
        {"type": "string_check", "name": "exact", "input": "{{sample.output_text}}", "reference": NEVER,
         "operation": "eq"},
        SIMILAR,
    ]  # fmt: skip
    created = new_eval(client, criteria)
    assert created.object == "eval" and created.data_source_config.type == "custom"
    run = client.evals.runs.create(created.id, name="r1", data_source=completions())  # type: ignore[arg-type]
    assert run.status in ("queued", "in_progress") and run.report_url is None
    done = wait(client, created.id, run.id)
    assert done.status == "completed", done.error
    assert (done.result_counts.total, done.result_counts.errored) == (4, 0)
    rates = {r.testing_criteria: (r.passed, r.failed) for r in done.per_testing_criteria_results}
    assert rates["differs"] == (4, 0) and rates["exact"] == (0, 4)
    assert done.result_counts.passed == 0 and done.result_counts.failed == 4  # an item passes all or fails
    usage = {u.model_name: u for u in done.per_model_usage}
    assert usage["chat"].invocation_count == 4 and 4 <= usage["chat"].completion_tokens <= 24

    items = list(client.evals.runs.output_items.list(run.id, eval_id=created.id))
    assert sorted(i.datasource_item_id for i in items) == [0, 1, 2, 3]
    close_passed = 0
    for item in items:
        question = QUESTIONS[item.datasource_item_id]["item"]
        assert item.datasource_item == question and item.status == "fail"
        direct = client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": question["question"]}], temperature=0,
            max_completion_tokens=6,
        )  # fmt: skip
        text = item.sample.output[0].content
        assert text == direct.choices[0].message.content  # the same pipeline as chat, greedy
        close = next(r.model_dump() for r in item.results if r.name == "close")
        assert close["score"] == pytest.approx(graders.similarity(text, question["ref"], "fuzzy_match"))
        close_passed += close["passed"]
    assert rates["close"] == (close_passed, 4 - close_passed)
    one = client.evals.runs.output_items.retrieve(items[0].id, eval_id=created.id, run_id=run.id)
    assert one.id == items[0].id
    assert [r.model_dump() for r in one.results] == [r.model_dump() for r in items[0].results]


def test_a_score_model_grader_calls_a_deployment_for_each_item(server: ChatServer) -> None:
    client = sdk(server)
    grader = {
        "type": "score_model", "name": "judge", "model": "chat", "range": [0, 10], "pass_threshold": 0,
        "input": [{"role": "user", "content": "Score this answer: {{sample.output_text}}"}],
    }  # fmt: skip
    created = new_eval(client, [grader])
    run = client.evals.runs.create(created.id, data_source=completions(tokens=3))  # type: ignore[arg-type]
    done = wait(client, created.id, run.id)
    assert done.status == "completed", done.error
    assert done.per_model_usage[0].invocation_count == 8  # a sample and a grade per item
    for item in client.evals.runs.output_items.list(run.id, eval_id=created.id):
        (judged,) = [r.model_dump() for r in item.results]
        answer = judged["output"]
        score = json.loads(answer)["result"]  # constrained to OpenAI's shape, within the range
        assert json.loads(answer) == {"result": score} and 0 <= score <= 10
        assert (judged["score"], judged["passed"]) == (score, True)


def test_a_run_reads_its_items_and_samples_from_a_file(server: ChatServer) -> None:
    client = sdk(server)
    rows = [
        {
            "item": {"question": "capital of France", "ref": "Paris"},
            "sample": {"output_text": "It is Paris."},
        },
        {
            "item": {"question": "capital of Italy", "ref": "Rome"},
            "sample": {"output_text": "Milan, surely."},
        },
    ]
    data = b"".join(json.dumps(row).encode() + b"\n" for row in rows)
    file_id = client.files.create(file=("items.jsonl", io.BytesIO(data)), purpose="evals").id
    criteria = [{"type": "string_check", "name": "right", "input": "{{sample.output_text}}",
                 "reference": "{{item.ref}}", "operation": "ilike"}]  # fmt: skip
    created = new_eval(client, criteria)
    run = client.evals.runs.create(
        created.id, data_source={"type": "jsonl", "source": {"type": "file_id", "id": file_id}}
    )
    done = wait(client, created.id, run.id)
    assert (done.result_counts.passed, done.result_counts.failed) == (1, 1)
    assert done.per_model_usage == []  # nothing generated
    passed = client.evals.runs.output_items.list(run.id, eval_id=created.id, status="pass")
    assert [i.datasource_item["ref"] for i in passed] == ["Paris"]


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        ({"data_source_config": CONFIG, "testing_criteria": [{"type": "python", "source": "x"}]},
         "testing_criteria[0].type", "tenant code"),
        ({"data_source_config": {"type": "stored_completions"}, "testing_criteria": [SIMILAR]},
         "data_source_config.type", "custom"),
        ({"data_source_config": CONFIG, "testing_criteria": [{**SIMILAR, "evaluation_metric": "meteor"}]},
         "testing_criteria[0].evaluation_metric", "WordNet"),
        ({"data_source_config": CONFIG, "testing_criteria": [{**SIMILAR, "pass_threshold": "high"}]},
         "testing_criteria[0].pass_threshold", "number"),
    ],
)  # fmt: skip
def test_an_invalid_eval_is_400_naming_the_field(
    server: ChatServer, body: Json, param: str, says: str
) -> None:
    refused = server.http.post("/v1/evals", json=body, headers=bearer(server.key))
    assert says in assert_error(refused, 400, param=param)["message"]


def test_an_invalid_run_is_refused_naming_the_field(server: ChatServer) -> None:
    client = sdk(server)
    eval_id = new_eval(client, [SIMILAR]).id
    path, key = f"/v1/evals/{eval_id}/runs", bearer(server.key)
    unknown = server.http.post(path, json={"data_source": completions(model="gpt-4o")}, headers=key)
    assert_error(unknown, 404, code="model_not_found", param="data_source.model")
    no_samples = {"type": "jsonl", "source": {"type": "file_content", "content": QUESTIONS}}
    assert_error(
        server.http.post(path, json={"data_source": no_samples}, headers=key), 400, param="data_source"
    )
    responses = {"type": "responses", "source": {"type": "file_content", "content": QUESTIONS}}
    assert_error(
        server.http.post(path, json={"data_source": responses}, headers=key), 400, param="data_source.type"
    )
    missing = {"type": "jsonl", "source": {"type": "file_id", "id": "file_nope"}}
    assert_error(
        server.http.post(path, json={"data_source": missing}, headers=key), 404, code="file_not_found"
    )


def test_a_runs_items_are_checked_against_the_evals_item_schema(server: ChatServer) -> None:
    """Conforming items make a run; the first item that does not conform is a 400 naming it (its index
    in the request, or its line in the file) and why, and no run is made."""
    client, key = sdk(server), bearer(server.key)
    body = {"data_source_config": {"type": "custom", "item_schema": STRICT}, "testing_criteria": [SIMILAR]}
    eval_id = server.http.post("/v1/evals", json=body, headers=key).json()["id"]
    rows = [{**row, "sample": {"output_text": "city"}} for row in QUESTIONS]
    inline = {"type": "jsonl", "source": {"type": "file_content", "content": rows}}
    run = client.evals.runs.create(eval_id, data_source=inline)  # type: ignore[arg-type]
    assert wait(client, eval_id, run.id).status == "completed"

    path = f"/v1/evals/{eval_id}/runs"
    bad = [rows[0], {"item": {"question": "", "ref": "x"}, "sample": {}}, {"item": {}, "sample": {}}]
    refused = server.http.post(
        path, json={"data_source": {"type": "jsonl", "source": {"type": "file_content", "content": bad}}},
        headers=key,
    )  # fmt: skip
    message = assert_error(refused, 400, param="data_source.source.content")["message"]
    assert message == (
        "data_source.source.content[1] does not match the eval's item_schema: "
        "'' should be non-empty (at $.question)."
    )
    data = b"\n".join(json.dumps(row).encode() for row in [rows[0], {"item": {"ref": "x"}, "sample": {}}])
    file_id = client.files.create(file=("items.jsonl", io.BytesIO(b"\n" + data)), purpose="evals").id
    from_file = {"type": "jsonl", "source": {"type": "file_id", "id": file_id}}
    refused = server.http.post(path, json={"data_source": from_file}, headers=key)
    message = assert_error(refused, 400, param="data_source.source.id")["message"]
    assert message.startswith(f"Line 3 of file {file_id} (item 1) does not match the eval's item_schema: ")
    assert "'question' is a required property" in message
    assert [r.id for r in client.evals.runs.list(eval_id)] == [run.id]  # the refused ones made none

    remote = {"type": "custom", "item_schema": {"$ref": "https://json-schema.example/item.json"}}
    refused = server.http.post("/v1/evals", json={**body, "data_source_config": remote}, headers=key)
    assert (
        "outside the schema" in assert_error(refused, 400, param="data_source_config.item_schema")["message"]
    )


def test_evals_runs_and_items_of_another_account_are_404(server: ChatServer) -> None:
    client = sdk(server)
    eval_id = new_eval(client, [SIMILAR]).id
    run = client.evals.runs.create(eval_id, data_source=completions(tokens=2))  # type: ignore[arg-type]
    wait(client, eval_id, run.id)
    item_id = next(iter(client.evals.runs.output_items.list(run.id, eval_id=eval_id))).id
    other = server.http.post("/v1/admin/accounts", json={"name": "other"}, headers=bearer(ADMIN_KEY)).json()
    theirs = bearer(other["api_key"])
    for method, path in [
        ("GET", f"/v1/evals/{eval_id}"),
        ("DELETE", f"/v1/evals/{eval_id}"),
        ("GET", f"/v1/evals/{eval_id}/runs"),
        ("GET", f"/v1/evals/{eval_id}/runs/{run.id}"),
        ("POST", f"/v1/evals/{eval_id}/runs/{run.id}"),
        ("GET", f"/v1/evals/{eval_id}/runs/{run.id}/output_items"),
        ("GET", f"/v1/evals/{eval_id}/runs/{run.id}/output_items/{item_id}"),
    ]:
        assert_error(server.http.request(method, path, headers=theirs), 404)
    assert sdk(server, other["api_key"]).evals.list().data == []
    assert client.evals.retrieve(eval_id).id == eval_id  # untouched


def test_a_run_is_cancelled_and_an_eval_updated_and_deleted_with_audit_rows(server: ChatServer) -> None:
    client = sdk(server)
    eval_id = new_eval(client, [SIMILAR]).id
    run = client.evals.runs.create(eval_id, data_source=completions(tokens=40))  # type: ignore[arg-type]
    cancelled = client.evals.runs.cancel(run.id, eval_id=eval_id)
    assert cancelled.status == "canceled"
    assert wait(client, eval_id, run.id).result_counts.total == 4
    assert client.evals.update(eval_id, name="renamed", metadata={"team": "a"}).name == "renamed"
    assert [r.id for r in client.evals.runs.list(eval_id)] == [run.id]
    assert client.evals.runs.delete(run.id, eval_id=eval_id).deleted
    assert client.evals.delete(eval_id).deleted
    assert_error(
        server.http.get(f"/v1/evals/{eval_id}", headers=bearer(server.key)), 404, code="eval_not_found"
    )
    rows = server.http.get("/v1/audit", params={"limit": 100}, headers=bearer(server.key)).json()["data"]
    actions = {r["action"] for r in rows if r["target"]["id"] in (eval_id, run.id)}
    assert actions == {
        "eval.created", "eval.updated", "eval.deleted",
        "eval_run.created", "eval_run.canceled", "eval_run.deleted",
    }  # fmt: skip


def test_evaluate_runs_an_eval_against_a_deployment_and_returns_its_pass_rates(server: ChatServer) -> None:
    """The service a gated rollout calls, inside the server: a new run of the eval's latest data source."""
    client = sdk(server)
    criteria = [{**SIMILAR, "name": "never", "reference": NEVER, "pass_threshold": 0.99}, SIMILAR]
    eval_id = new_eval(client, criteria).id
    client.evals.runs.create(eval_id, data_source=completions(tokens=2))  # type: ignore[arg-type]
    services: Services = server.app.state.services
    principal = services.authenticator.load(server.key)
    assert principal is not None
    serving = server.http.get(f"/v1/deployments/{server.deployment_id}", headers=bearer(server.key))
    version = serving.json()["artifact_id"]  # its one version: an eval of a rollout names the new one
    evaluate = services.evals.evaluate(principal, eval_id, "chat", version, timeout=60, poll=0.1)
    scores = asyncio.run(evaluate)
    assert scores.status == "completed" and scores.result_counts["total"] == 4
    assert scores.pass_rates["never"] == 0.0
    run = client.evals.runs.retrieve(scores.run_id, eval_id=eval_id)
    assert run.model == "chat" and run.data_source.artifact_id == version  # type: ignore[union-attr]
    assert len(client.evals.runs.list(eval_id).data) == 2
    items = list(client.evals.runs.output_items.list(scores.run_id, eval_id=eval_id))
    close = [next(r.score for r in i.results if r.name == "close") for i in items]
    assert scores.mean_scores["close"] == pytest.approx(sum(close) / 4)
    assert scores.pass_rates["close"] == sum(score >= 0.05 for score in close) / 4


def test_a_run_pinned_to_a_version_that_does_not_serve_is_409(server: ChatServer) -> None:
    eval_id = new_eval(sdk(server), [SIMILAR]).id
    pinned = {**completions(), "artifact_id": "art_not_a_version"}
    refused = server.http.post(
        f"/v1/evals/{eval_id}/runs", json={"data_source": pinned}, headers=bearer(server.key)
    )
    assert_error(refused, 409, code="version_not_serving", param="data_source.artifact_id")


def test_a_pinned_request_runs_on_its_version_whatever_the_split() -> None:
    canary = DeploymentRef(
        "dep_1", "chat", "text-generation", versions=(Version("art_old", 100), Version("art_new", 0))
    )
    assert {canary.with_version(None).serving_artifact for _ in range(20)} == {"art_old"}
    assert canary.on_version("art_new").runtime_key == "dep_1@art_new"
    failed = DeploymentRef("dep_1", "chat", "text-generation", versions=(Version("art_new", 0, "failed"),))
    with pytest.raises(Conflict):
        failed.on_version("art_new")


def test_a_run_of_an_account_without_credits_is_402(server: ChatServer) -> None:
    broke = server.http.post(
        "/v1/admin/accounts", json={"name": "broke", "credits": 0}, headers=bearer(ADMIN_KEY)
    ).json()
    refused = server.http.post(
        "/v1/evals/eval_x/runs", json={"data_source": completions()}, headers=bearer(broke["api_key"])
    )
    assert_error(refused, 402, code="insufficient_credits")


def test_eval_lists_page_as_the_rest_of_the_api(server: ChatServer) -> None:
    other = server.http.post("/v1/admin/accounts", json={"name": "pages"}, headers=bearer(ADMIN_KEY)).json()
    client = sdk(server, other["api_key"])
    made = [new_eval(client, [SIMILAR]).id for _ in range(3)]
    first = client.evals.list(limit=2)  # oldest first, as OpenAI's
    assert [e.id for e in first.data] == made[:2] and first.has_more
    rest = client.evals.list(limit=2, after=first.data[-1].id)
    assert [e.id for e in rest.data] == made[2:] and not rest.has_more
    newest = client.evals.list(limit=1, order="desc")
    assert [e.id for e in newest.data] == made[2:]
    listed = httpx.get(f"{server.url}/v1/evals", params={"limit": 1}, headers=bearer(other["api_key"])).json()
    assert set(listed) == {"object", "data", "first_id", "last_id", "has_more"}


# ------------------------------------------------------------------------------ the store, on both databases


def test_an_items_result_is_counted_once_and_a_cancel_stops_its_runner(services: Services) -> None:
    store = services.evals.store
    account, _ = services.accounts.create("store", None)
    owner = Owner(account.account.id, "key_of_the_account")
    made = store.create(owner, "e", checked_config(CONFIG), graders.checked([SIMILAR]), None)
    source = {"type": "jsonl", "source": {"type": "file_content"}}
    items = [{"item": {"ref": "a"}, "sample": {"output_text": "a"}}] * 3
    run = store.create_run(owner, made["id"], None, source, items, None, None)
    claimed = store.claim("runner-1", 30, 1)
    assert claimed is not None and claimed.id == run["id"] and store.claim("runner-2", 30, 1) is None
    graded = graders.grade(claimed.testing_criteria[0], items[0]["item"], items[0]["sample"])
    first = ItemResult(0, "pass", items[0]["item"], [graded], items[0]["sample"], {"chat": [1, 5, 2]})
    assert store.record(run["id"], "runner-1", [first]) and store.record(run["id"], "runner-1", [first])
    assert not store.record(run["id"], "runner-2", [first])  # not its claim
    view = store.get_run(owner, made["id"], run["id"])
    assert view["status"] == "in_progress" and view["result_counts"]["passed"] == 1
    assert view["per_testing_criteria_results"] == [{"testing_criteria": "close", "passed": 1, "failed": 0}]
    assert view["per_model_usage"][0]["total_tokens"] == 7 and store.done(run["id"]) == {0}
    assert store.cancel_run(owner, made["id"], run["id"])["status"] == "canceled"
    assert not store.beat(run["id"], "runner-1")  # its runner stops at its next beat
    assert store.mean_scores(run["id"]) == {"close": 1.0}
    stranger = Owner("acct_other", "key_other")
    with pytest.raises(NotFound):
        store.get_run(stranger, made["id"], run["id"])


def test_a_run_whose_key_was_revoked_fails_naming_it(services: Services) -> None:
    store = services.evals.store
    account, _ = services.accounts.create("revoked", None)
    _, secret = services.keys.create(account.account.id, "doomed", None)  # the account keeps its first
    principal = services.authenticator.load(secret)
    assert principal is not None and principal.key_id is not None
    owner = Owner(account.account.id, principal.key_id)
    made = store.create(owner, "e", checked_config(CONFIG), graders.checked([SIMILAR]), None)
    source = {"type": "jsonl", "source": {"type": "file_content"}}
    run = store.create_run(owner, made["id"], None, source, [{"item": {}, "sample": {}}], None, None)
    services.keys.revoke(account.account.id, principal.key_id)
    runner = EvalRunner(store, services.settings, services.authenticator.of_key)
    claimed = store.claim(runner.name, 30, 1)
    assert claimed is not None
    asyncio.run(EvalRunJob(runner, claimed, line_caller(create_app(services=services))).run())
    ended = store.get_run(owner, made["id"], run["id"])
    assert ended["status"] == "failed" and ended["error"]["code"] == "invalid_api_key"
    assert ended["result_counts"]["total"] == 1 and store.done(run["id"]) == set()  # nothing ran
