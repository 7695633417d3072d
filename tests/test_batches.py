"""The Files and Batch APIs through the unchanged openai SDK (issue 41): upload, create, poll, download;
output equal to direct calls; failures in the error file with their reason; cancel; expiry; a SIGKILL
mid-batch; validation answers as OpenAI gives them; another account sees nothing."""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest
import sqlalchemy

from tests.chat_model import ChatServer, long_context_copy, served_chat_model
from tests.conftest import make_settings
from tests.helpers import ADMIN_KEY, assert_error, bearer, deploy_folder_sync, push_folder_sync
from tests.live import live_server
from tests.server_process import ServerProcess

Json = dict[str, Any]
SENTENCES = [f"Sentence number {i} about the weather." for i in range(12)]
MiB = 1024 * 1024
# The module server's bounds: an answer of 32 MiniLM vectors (about 150 KB of JSON) fits, one of 256
# (1.2 MB) does not; the budget holds some 50 of the former, far less than the amplifying batch makes.
ANSWER_CAP = 1 * MiB
OUTPUT_BUDGET = 8 * MiB


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, recipes: Path, minilm_dir: Path) -> Iterator[ChatServer]:
    """One live server: a warm `chat` deployment and a warm `minilm` one, one account."""
    with served_chat_model(
        tmp_path_factory.mktemp("batches"), recipes, batch_poll_seconds=0.2, batch_recheck_seconds=0.5,
        batch_max_answer_bytes=ANSWER_CAP, batch_max_output_bytes=OUTPUT_BUDGET,
    ) as served:  # fmt: skip
        artifact = push_folder_sync(served.http, served.key, minilm_dir, "feature-extraction")
        created = served.http.post(
            "/v1/deployments",
            json={"model": "minilm", "artifact_id": artifact, "readiness": "warm"},
            headers=bearer(served.key),
        )
        assert created.status_code == 201, created.text
        yield served


def account_with_tiny_embedder(http: httpx.Client, recipes: Path) -> str:
    """A new account's key, with a warm `emb` deployment of the tiny sentence-transformers model."""
    key: str = http.post("/v1/admin/accounts", json={"name": "emb"}, headers=bearer(ADMIN_KEY)).json()[
        "api_key"
    ]
    folder = recipes / "t03_feature_extraction" / "st"
    deploy_folder_sync(http, key, folder, "feature-extraction", "emb", readiness="warm")
    return key


def sdk(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


def jsonl(lines: list[Json]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def upload(client: openai.OpenAI, lines: list[Json]) -> str:
    return client.files.create(file=("requests.jsonl", io.BytesIO(jsonl(lines))), purpose="batch").id


def wait(client: openai.OpenAI, batch_id: str, until: tuple[str, ...], timeout: float = 180) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in until:
            return batch
        time.sleep(0.2)
    raise TimeoutError(f"batch {batch_id} still {batch.status}")


def lines_of(client: openai.OpenAI, file_id: str | None) -> list[Json]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def chat_line(custom_id: str, prompt: str, tokens: int, exact: bool = False) -> Json:
    body: Json = {"model": "chat", "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens}
    body.update({"temperature": 0, **({"min_tokens": tokens} if exact else {})})
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def embedding_line(custom_id: str, text: Any, model: str = "minilm") -> Json:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/embeddings",
        "body": {"model": model, "input": text},
    }


def test_an_embeddings_batch_answers_each_line_as_a_direct_call_would(server: ChatServer) -> None:
    client = sdk(server.url, server.key)
    lines = [embedding_line(f"s{i}", text) for i, text in enumerate(SENTENCES)]
    lines.append(embedding_line("bad", []))  # a 400 from the route: the error file, with its reason
    file_id = upload(client, lines)
    batch = client.batches.create(
        input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h", metadata={"job": "test"}
    )
    assert batch.status == "validating" and batch.metadata == {"job": "test"}
    done = wait(client, batch.id, ("completed", "failed"))
    assert done.status == "completed", done.errors
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (
        13,
        12,
        1,
    )
    assert done.model == "minilm" and done.completed_at and done.in_progress_at and done.finalizing_at
    output = lines_of(client, done.output_file_id)
    assert [line["custom_id"] for line in output] == [f"s{i}" for i in range(12)]
    direct = client.embeddings.create(model="minilm", input=SENTENCES)
    for line, expected in zip(output, direct.data, strict=True):
        assert line["response"]["status_code"] == 200 and line["error"] is None
        assert line["response"]["request_id"]
        assert line["response"]["body"]["data"][0]["embedding"] == pytest.approx(expected.embedding, abs=1e-6)
    errors = lines_of(client, done.error_file_id)
    assert [line["custom_id"] for line in errors] == ["bad"]
    assert errors[0]["response"]["status_code"] == 400
    assert errors[0]["response"]["body"]["error"]["message"]
    assert done.usage is not None and done.usage.input_tokens > 0
    files = {f.id: f for f in client.files.list(purpose="batch_output")}
    assert done.output_file_id in files and done.error_file_id in files


def test_chat_and_responses_lines_equal_the_direct_calls(server: ChatServer) -> None:
    client = sdk(server.url, server.key)
    prompts = ["hello there", "what is the weather", "tell me a story"]
    chat_lines = [chat_line(f"c{i}", p, 8) for i, p in enumerate(prompts)]
    batch = client.batches.create(
        input_file_id=upload(client, chat_lines), endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = wait(client, batch.id, ("completed", "failed"))
    output = {line["custom_id"]: line for line in lines_of(client, done.output_file_id)}
    for i, prompt in enumerate(prompts):
        direct = client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": prompt}], max_tokens=8, temperature=0
        )
        body = output[f"c{i}"]["response"]["body"]
        assert body["choices"][0]["message"]["content"] == direct.choices[0].message.content
        assert body["usage"]["completion_tokens"] == direct.usage.completion_tokens  # type: ignore[union-attr]
    assert done.usage is not None and done.usage.output_tokens == sum(
        line["response"]["body"]["usage"]["completion_tokens"] for line in output.values()
    )
    response_lines = [
        {"custom_id": f"r{i}", "method": "POST", "url": "/v1/responses",
         "body": {"model": "chat", "input": p, "max_output_tokens": 8, "temperature": 0}}
        for i, p in enumerate(prompts)
    ]  # fmt: skip
    batch = client.batches.create(
        input_file_id=upload(client, response_lines), endpoint="/v1/responses", completion_window="24h"
    )
    done = wait(client, batch.id, ("completed", "failed"))
    output = {line["custom_id"]: line for line in lines_of(client, done.output_file_id)}
    for i, prompt in enumerate(prompts):
        direct = client.responses.create(model="chat", input=prompt, max_output_tokens=8, temperature=0)
        body = output[f"r{i}"]["response"]["body"]
        assert body["object"] == "response"
        assert body["output"][0]["content"][0]["text"] == direct.output_text


def test_input_that_is_not_jsonl_is_refused_at_upload(server: ChatServer) -> None:
    response = server.http.post(
        "/v1/files",
        files={"file": ("requests.jsonl", b"this is not json\n")},
        data={"purpose": "batch"},
        headers=bearer(server.key),
    )
    assert_error(response, 400, "invalid_file_format", param="file")
    with pytest.raises(openai.BadRequestError):
        sdk(server.url, server.key).files.create(file=("x.jsonl", io.BytesIO(b"[1, 2]\n")), purpose="batch")


@pytest.mark.parametrize(
    ("line", "code", "param"),
    [
        (embedding_line("a", "again"), "duplicate_custom_id", "custom_id"),
        ({**embedding_line("b", "x"), "url": "/v1/chat/completions"}, "invalid_url", "url"),
        (embedding_line("c", "x", model="no-such-model"), "model_not_found", "body.model"),
        (embedding_line("d", "x", model="chat"), "model_not_found", "body.model"),  # chat cannot embed
    ],
)
def test_a_line_wrong_for_its_batch_fails_the_batch_naming_the_line(
    server: ChatServer, line: Json, code: str, param: str
) -> None:
    client = sdk(server.url, server.key)
    lines = [embedding_line("a", "first"), line]
    batch = client.batches.create(
        input_file_id=upload(client, lines), endpoint="/v1/embeddings", completion_window="24h"
    )
    failed = wait(client, batch.id, ("failed", "completed"))
    assert failed.status == "failed" and failed.failed_at
    assert failed.errors is not None and failed.errors.data
    error = failed.errors.data[0]
    assert (error.code, error.line, error.param) == (code, 2, param)
    assert failed.output_file_id is None


def test_batch_creation_checks_its_file_and_endpoint(server: ChatServer) -> None:
    client = sdk(server.url, server.key)
    with pytest.raises(openai.NotFoundError):
        client.batches.create(
            input_file_id="file_missing", endpoint="/v1/embeddings", completion_window="24h"
        )
    other = client.files.create(file=("notes.txt", io.BytesIO(b"hello")), purpose="user_data")
    response = server.http.post(
        "/v1/batches",
        json={"input_file_id": other.id, "endpoint": "/v1/embeddings", "completion_window": "24h"},
        headers=bearer(server.key),
    )
    assert_error(response, 400, param="input_file_id")
    file_id = upload(client, [embedding_line("a", "x")])
    response = server.http.post(
        "/v1/batches",
        json={"input_file_id": file_id, "endpoint": "/v1/images/generations", "completion_window": "24h"},
        headers=bearer(server.key),
    )
    assert_error(response, 400, param="endpoint")


def test_another_accounts_key_gets_404_for_the_batch_and_its_files(server: ChatServer) -> None:
    client = sdk(server.url, server.key)
    file_id = upload(client, [embedding_line("a", "x")])
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h")
    done = wait(client, batch.id, ("completed", "failed"))
    stranger = server.http.post("/v1/admin/accounts", json={"name": "stranger"}, headers=bearer(ADMIN_KEY))
    other = sdk(server.url, stranger.json()["api_key"])
    for call in (
        lambda: other.batches.retrieve(batch.id),
        lambda: other.batches.cancel(batch.id),
        lambda: other.files.retrieve(file_id),
        lambda: other.files.content(done.output_file_id),
        lambda: other.files.delete(file_id),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert [b.id for b in other.batches.list()] == []
    assert list(other.files.list()) == []
    assert client.files.delete(file_id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(file_id)
    assert client.batches.retrieve(batch.id).status == "completed"  # its input was copied


def test_cancel_keeps_the_answers_so_far_with_consistent_counts(server: ChatServer) -> None:
    client = sdk(server.url, server.key)
    lines = [chat_line(f"c{i}", f"count to {i}", 48, exact=True) for i in range(3000)]
    batch = client.batches.create(
        input_file_id=upload(client, lines), endpoint="/v1/chat/completions", completion_window="24h"
    )
    deadline = time.monotonic() + 120
    while (counts := client.batches.retrieve(batch.id).request_counts) is None or counts.completed == 0:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    done = wait(client, batch.id, ("cancelled",))
    assert done.cancelled_at and done.request_counts is not None
    output, errors = lines_of(client, done.output_file_id), lines_of(client, done.error_file_id)
    assert done.request_counts.total == 3000
    assert 0 < done.request_counts.completed == len(output) < 3000
    assert done.request_counts.failed == len(errors)
    ids = [line["custom_id"] for line in output + errors]
    assert len(ids) == len(set(ids))
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)


def test_lines_left_when_the_window_passes_fail_with_batch_expired(tmp_path: Path, recipes: Path) -> None:
    with served_chat_model(
        tmp_path, recipes, batch_completion_window_seconds=3, batch_poll_seconds=0.2
    ) as served:
        client = sdk(served.url, served.key)
        lines = [chat_line(f"c{i}", "go", 32, exact=True) for i in range(3000)]
        batch = client.batches.create(
            input_file_id=upload(client, lines), endpoint="/v1/chat/completions", completion_window="24h"
        )
        done = wait(client, batch.id, ("expired", "completed"))
        assert done.status == "expired" and done.expired_at
        output, errors = lines_of(client, done.output_file_id), lines_of(client, done.error_file_id)
        assert len(output) + len(errors) == 3000 == done.request_counts.total  # type: ignore[union-attr]
        expired = [line for line in errors if line["error"] and line["error"]["code"] == "batch_expired"]
        assert expired and all(line["response"] is None for line in expired)
        assert sorted(line["custom_id"] for line in output + errors) == sorted(f"c{i}" for i in range(3000))


@pytest.mark.parametrize("stop", ["kill", "terminate"])
def test_a_batch_stopped_mid_run_completes_after_restart_with_each_line_once(
    tmp_path: Path, recipes: Path, stop: str
) -> None:
    """SIGKILL (its claim goes stale, then is taken over) and SIGTERM (handed back at once)."""
    data = tmp_path / "data"
    database_url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    process = ServerProcess(
        data, database_url, MODELHOST_BATCH_STALE_SECONDS="2", MODELHOST_BATCH_POLL_SECONDS="0.2",
        MODELHOST_BATCH_LINES_IN_FLIGHT="4",
    )  # fmt: skip
    process.start()
    try:
        http = httpx.Client(base_url=process.url, timeout=120)
        key = account_with_tiny_embedder(http, recipes)
        client = sdk(process.url, key)
        count = 1000  # 200 answered before the stop, the rest after it
        lines = [embedding_line(f"l{i}", f"line {i}", model="emb") for i in range(count)]
        batch = client.batches.create(
            input_file_id=upload(client, lines), endpoint="/v1/embeddings", completion_window="24h"
        )
        deadline = time.monotonic() + 120
        while (counts := client.batches.retrieve(batch.id).request_counts) is None or counts.completed < 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        process.kill() if stop == "kill" else process.terminate()
        process.start()
        done = wait(sdk(process.url, key), batch.id, ("completed",), timeout=300)
        output = lines_of(sdk(process.url, key), done.output_file_id)
        assert sorted(line["custom_id"] for line in output) == sorted(f"l{i}" for i in range(count))
        assert done.request_counts is not None and done.request_counts.completed == count
        assert (data / "blobs" / "batches").is_dir()  # where the batch kept its copy of the input...
        assert not (data / "blobs" / "batches" / batch.id).exists()  # ...until it ended
        http.close()
    finally:
        process.stop()


def test_a_deployment_key_sees_only_its_own_batches_and_files(server: ChatServer) -> None:
    deployments = {
        d["model"]: d["id"]
        for d in server.http.get("/v1/deployments", headers=bearer(server.key)).json()["data"]
    }
    keys = [
        server.http.post(
            "/v1/keys", json={"deployments": [deployments["minilm"]]}, headers=bearer(server.key)
        ).json()
        for _ in range(2)
    ]
    mine, theirs = (sdk(server.url, k["api_key"]) for k in keys)
    file_id = upload(mine, [embedding_line("a", "x")])
    batch = mine.batches.create(input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h")
    done = wait(mine, batch.id, ("completed", "failed"))
    assert done.status == "completed"
    assert mine.files.content(done.output_file_id).text  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError):
        theirs.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        theirs.files.content(done.output_file_id)  # type: ignore[arg-type]
    assert batch.id not in [b.id for b in theirs.batches.list()]
    account = sdk(server.url, server.key)  # the account key sees every batch of its account
    assert account.batches.retrieve(batch.id).status == "completed"
    chat_file = upload(mine, [chat_line("c", "hi", 4)])
    scoped = mine.batches.create(
        input_file_id=chat_file, endpoint="/v1/chat/completions", completion_window="24h"
    )
    failed = wait(mine, scoped.id, ("failed", "completed"))  # the key is not scoped to `chat`
    assert failed.status == "failed" and failed.errors is not None
    assert failed.errors.data[0].code == "model_not_found"


def test_lines_refused_for_a_full_queue_are_tried_again_not_failed(tmp_path: Path, recipes: Path) -> None:
    settings = make_settings(
        tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}", max_queue_size=2, batch_lines_in_flight=6,
        batch_poll_seconds=0.2,
    )  # fmt: skip
    with live_server(settings) as url:
        http = httpx.Client(base_url=url, timeout=60)
        key = account_with_tiny_embedder(http, recipes)
        client = sdk(url, key)
        lines = [embedding_line(f"l{i}", f"line {i}", model="emb") for i in range(24)]
        batch = client.batches.create(
            input_file_id=upload(client, lines), endpoint="/v1/embeddings", completion_window="24h"
        )
        done = wait(client, batch.id, ("completed",), timeout=120)
        assert done.request_counts is not None and done.request_counts.completed == 24
        assert done.error_file_id is None
        http.close()


def test_an_answers_tokens_are_read_from_its_usage_and_never_from_the_text_it_carries() -> None:
    from modelhost.batches.answers import answered

    content = 'I said "usage": {"prompt_tokens": 99, "completion_tokens": 99}'
    body = json.dumps(
        {
            "choices": [{"message": {"content": content}}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3},
        }
    ).encode()
    answer = answered("batch_x", 4, "c4", 200, "req_1", body)
    assert answer.ok and answer.tokens == (7, 3)
    line = json.loads(answer.record)
    assert line == {
        "id": "batch_req_x_4",
        "custom_id": "c4",
        "response": {"status_code": 200, "request_id": "req_1", "body": json.loads(body)},
        "error": None,
    }
    responses = json.dumps({"object": "response", "usage": {"input_tokens": 5, "output_tokens": 2}}).encode()
    assert answered("batch_x", 5, "r5", 200, "req_2", responses).tokens == (5, 2)
    refused = answered("batch_x", 6, "e6", 400, "req_3", b'{"error": {"message": "no"}}')
    assert not refused.ok and refused.tokens == (0, 0)


def test_a_rate_limited_key_runs_a_batch_beyond_its_per_minute_limit(server: ChatServer) -> None:
    limited = server.http.post(
        "/v1/keys",
        json={"name": "one-a-minute", "limits": {"requests_per_minute": 1}},
        headers=bearer(server.key),
    ).json()["api_key"]
    client = sdk(server.url, limited)
    lines = [embedding_line(f"l{i}", f"line {i}") for i in range(6)]
    # the upload is a request of the Files API, which the limit counts: the account's key makes it
    file_id = upload(sdk(server.url, server.key), lines)
    # the key's one request of the minute (a creation counts; polling the batch below does not)
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h")
    with pytest.raises(openai.RateLimitError):
        client.embeddings.create(model="minilm", input="direct")  # the limit holds for direct calls
    done = wait(client, batch.id, ("completed", "failed"))
    assert done.request_counts is not None and done.request_counts.completed == 6


def test_a_batch_file_over_the_size_limit_is_413(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}", batch_max_file_bytes=200)
    with live_server(settings) as url:
        key = httpx.post(f"{url}/v1/admin/accounts", json={"name": "big"}, headers=bearer(ADMIN_KEY)).json()[
            "api_key"
        ]
        small = jsonl([embedding_line("a", "x")])
        big = jsonl([embedding_line(f"l{i}", "x") for i in range(5)])
        for data, status in ((small, 200), (big, 413)):
            response = httpx.post(
                f"{url}/v1/files",
                files={"file": ("r.jsonl", data)},
                data={"purpose": "batch"},
                headers=bearer(key),
            )
            assert response.status_code == status, response.text
        assert_error(response, 413, "payload_too_large", param="file")


def test_a_cold_deployment_named_by_a_batch_is_loaded_for_it(server: ChatServer) -> None:
    minilm = next(
        d
        for d in server.http.get("/v1/deployments", headers=bearer(server.key)).json()["data"]
        if d["model"] == "minilm"
    )
    cold = server.http.post(
        "/v1/deployments",
        json={"model": "minilm-cold", "artifact_id": minilm["artifact_id"], "readiness": "cold"},
        headers=bearer(server.key),
    )
    assert cold.status_code == 201, cold.text
    assert cold.json()["state"] == "unloaded"  # nothing loaded until a request needs it
    client = sdk(server.url, server.key)
    lines = [embedding_line(f"l{i}", f"line {i}", model="minilm-cold") for i in range(3)]
    batch = client.batches.create(
        input_file_id=upload(client, lines), endpoint="/v1/embeddings", completion_window="24h"
    )
    done = wait(client, batch.id, ("completed", "failed"))
    assert done.request_counts is not None and done.request_counts.completed == 3


def test_a_batch_silent_past_the_stale_time_keeps_its_claim_and_runs_each_line_once(
    tmp_path: Path, recipes: Path
) -> None:
    """Its first lines wait for a cold start longer than the stale time: no answer is recorded
    meanwhile, and a runner with a free slot (this one: two batches at once) would take a silent claim
    over and run its lines again. Each line is one request to the route (the server's own count)."""
    stale = 0.5
    process = ServerProcess(
        tmp_path / "data", f"sqlite:///{tmp_path / 'db.sqlite'}", MODELHOST_BATCH_STALE_SECONDS=str(stale),
        MODELHOST_BATCH_POLL_SECONDS="0.1", MODELHOST_BATCH_CONCURRENCY="2",
    )  # fmt: skip
    process.start()
    try:
        http = httpx.Client(base_url=process.url, timeout=120)
        key = http.post("/v1/admin/accounts", json={"name": "s"}, headers=bearer(ADMIN_KEY)).json()["api_key"]
        cold = deploy_folder_sync(http, key, long_context_copy(recipes, tmp_path), "text-generation", "chat")
        assert cold["state"] == "unloaded"
        client = sdk(process.url, key)
        count = 6
        # long answers after a cold start: silent a while on any machine (the first ends after >1 s)
        lines = [chat_line(f"l{i}", f"line {i}", 600, exact=True) for i in range(count)]
        started = time.monotonic()
        batch = client.batches.create(
            input_file_id=upload(client, lines), endpoint="/v1/chat/completions", completion_window="24h"
        )
        while (counts := client.batches.retrieve(batch.id).request_counts) is None or not counts.completed:
            time.sleep(0.05)
        assert time.monotonic() - started > 2 * stale  # silent for longer than the stale time
        done = wait(client, batch.id, ("completed",))
        assert done.request_counts is not None and done.request_counts.completed == count
        # each line's request is counted by the process that ran it, written within `FLUSH_SECONDS`
        deadline = time.monotonic() + 10
        while chat_requests(http) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        assert chat_requests(http) == count
        http.close()
    finally:
        process.stop()


def chat_requests(http: httpx.Client) -> float:
    """Chat completions answered 200 so far, from the server's /metrics."""
    series = 'modelhost_http_requests_total{method="POST",route="/v1/chat/completions",status="200"}'
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in http.get("/metrics").text.splitlines()
        if line.startswith(series)
    )


def test_an_amplifying_batch_fails_at_its_output_budget_with_the_supervisors_memory_bounded(
    server: ChatServer,
) -> None:
    """Each line asks for 32 embeddings of one character: about 200 bytes in, 150 KB out. 2,000 such
    lines would answer 300 MB; the batch ends `failed` at its 8 MiB budget instead, its answers so far
    in its files, and the server (this process: the live server runs in it) grows by less than
    MEMORY_BOUND_MIB while it runs: what the runner holds (answers in flight within 64 MiB, a flush of
    8 MiB, a page of the files being written) and the routes' own work on the lines in flight."""
    client = sdk(server.url, server.key)
    lines = [embedding_line(f"a{i}", ["a"] * 32) for i in range(2000)]
    file_id = upload(client, lines)
    peak, baseline, sampling = [0], psutil.Process().memory_info().rss, threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            peak[0] = max(peak[0], psutil.Process().memory_info().rss)
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        batch = client.batches.create(
            input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h"
        )
        done = wait(client, batch.id, ("failed", "completed"))
    finally:
        sampling.set()
        sampler.join()
    growth = (peak[0] - baseline) / MiB
    assert done.status == "failed" and done.failed_at, done.status
    assert done.errors is not None and done.errors.data[0].code == "batch_output_too_large"
    assert str(OUTPUT_BUDGET) in (done.errors.data[0].message or "")
    output = client.files.content(done.output_file_id).content  # type: ignore[arg-type]
    assert 0 < len(output) <= OUTPUT_BUDGET
    answers = [json.loads(line) for line in output.splitlines()]
    assert done.request_counts is not None and done.request_counts.completed == len(answers) < 2000
    assert all(len(a["response"]["body"]["data"]) == 32 for a in answers)
    assert growth < MEMORY_BOUND_MIB, f"the server grew by {growth:.0f} MiB"
    assert answers_kept(server, batch.id) == 0  # its answers left the database with its files written


MEMORY_BOUND_MIB = 128


def answers_kept(server: ChatServer, batch_id: str) -> int:
    """The batch's answers still in the database (`batch_lines`)."""
    engine = sqlalchemy.create_engine(server.database_url)
    with engine.connect() as connection:
        count = connection.execute(
            sqlalchemy.text("SELECT count(*) FROM batch_lines WHERE batch_id = :id"), {"id": batch_id}
        ).scalar_one()
    engine.dispose()
    return int(count)


def test_a_line_whose_answer_passes_the_cap_is_an_error_line_naming_the_cap(server: ChatServer) -> None:
    client = sdk(server.url, server.key)
    lines = [embedding_line("small", "one sentence"), embedding_line("huge", ["a"] * 256)]
    batch = client.batches.create(
        input_file_id=upload(client, lines), endpoint="/v1/embeddings", completion_window="24h"
    )
    done = wait(client, batch.id, ("completed", "failed"))
    assert done.status == "completed"
    assert [line["custom_id"] for line in lines_of(client, done.output_file_id)] == ["small"]
    (error,) = lines_of(client, done.error_file_id)
    assert error["custom_id"] == "huge" and error["error"]["code"] == "answer_too_large"
    assert str(ANSWER_CAP) in error["error"]["message"]
    assert "MODELHOST_BATCH_MAX_ANSWER_BYTES" in error["error"]["message"]


def test_a_revoked_keys_batch_stops_within_the_recheck_time(server: ChatServer) -> None:
    """The module server reads a running batch's key every 0.5 s (MODELHOST_BATCH_RECHECK_SECONDS):
    within that, plus the lines then in flight, its remaining lines fail `invalid_api_key`."""
    created = server.http.post("/v1/keys", json={"name": "soon revoked"}, headers=bearer(server.key)).json()
    client = sdk(server.url, created["api_key"])
    count = 20_000  # minutes of work: it cannot end by itself before the revocation
    lines = [chat_line(f"l{i}", f"line {i}", 8, exact=True) for i in range(count)]
    batch = client.batches.create(
        input_file_id=upload(client, lines), endpoint="/v1/chat/completions", completion_window="24h"
    )
    deadline = time.monotonic() + 120
    while (counts := client.batches.retrieve(batch.id).request_counts) is None or counts.completed < 50:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    revoked = server.http.delete(f"/v1/keys/{created['id']}", headers=bearer(server.key))
    assert revoked.status_code == 200, revoked.text
    revoked_at = time.monotonic()
    account = sdk(server.url, server.key)  # the revoked key can no longer read its batch
    done = wait(account, batch.id, ("completed", "failed"), timeout=60)
    stopped = time.monotonic() - revoked_at
    assert done.status == "completed" and stopped < 10, stopped
    errors = lines_of(account, done.error_file_id)
    refused = [line for line in errors if line["error"] and line["error"]["code"] == "invalid_api_key"]
    assert done.request_counts is not None and done.request_counts.completed + len(refused) == count
    assert len(refused) > count // 2


def test_two_accounts_batches_progress_side_by_side(server: ChatServer, recipes: Path) -> None:
    """The issue's measure ("two accounts' batches submitted a minute apart both progress within the
    first minute"), scaled down: account A's long batch runs and its second batch waits its turn (one
    running batch per account); account B's batch, submitted after both, runs and ends while A's first
    is still `in_progress` and A's second still `validating`. With one queue in order of arrival, B's
    batch would wait for both of A's."""
    first_client = sdk(server.url, server.key)
    long_lines = [chat_line(f"l{i}", f"line {i}", 8, exact=True) for i in range(20_000)]
    first = first_client.batches.create(
        input_file_id=upload(first_client, long_lines),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    second = first_client.batches.create(
        input_file_id=upload(first_client, [embedding_line("x", "x")]),
        endpoint="/v1/embeddings",
        completion_window="24h",
    )
    wait(first_client, first.id, ("in_progress",), timeout=60)
    other = sdk(server.url, account_with_tiny_embedder(server.http, recipes))
    lines = [embedding_line(f"b{i}", f"line {i}", model="emb") for i in range(20)]
    theirs = other.batches.create(
        input_file_id=upload(other, lines), endpoint="/v1/embeddings", completion_window="24h"
    )
    done = wait(other, theirs.id, ("completed", "failed"), timeout=60)
    assert done.status == "completed" and done.request_counts is not None
    assert done.request_counts.completed == 20
    assert first_client.batches.retrieve(first.id).status == "in_progress"
    assert first_client.batches.retrieve(second.id).status == "validating"
    first_client.batches.cancel(first.id)
    wait(first_client, first.id, ("cancelled",))
    assert wait(first_client, second.id, ("completed",)).request_counts.completed == 1  # type: ignore[union-attr]


class Store:
    """The batch store of a server that is not started: the runner's moves, made by hand."""

    def __init__(self, tmp_path: Path, database_url: str, **settings: Any) -> None:
        from modelhost.container import Services

        self.services = Services.build(make_settings(tmp_path, database_url, **settings))
        self.batches = self.services.batches

    def owner(self, name: str) -> Any:
        from modelhost.batches.files import Owner

        _, secret = self.services.accounts.create(name, 10.0)
        principal = self.services.authenticator.load(secret)
        assert principal is not None and principal.account_id and principal.key_id
        return Owner(principal.account_id, principal.key_id)

    def batch(self, owner: Any, lines: int = 3) -> str:
        """A batch (of `lines` embedding lines) of `owner`, `validating`."""
        data = jsonl([embedding_line(f"c{i}", f"line {i}") for i in range(lines)])
        file_id = f"file_{owner.account_id[-8:]}{time.monotonic_ns()}"
        written = (file_id, f"files/{file_id}", *self.services.uploads.write(f"files/{file_id}", [data]))
        with self.services.database.transaction() as session:
            self.services.uploads.add_in(session, owner, written, "r.jsonl", "batch", None)
        created = self.batches.create(owner, file_id, "/v1/embeddings", 3600, "24h", None, None)
        return str(created["id"])

    def query(self, sql: str, **values: Any) -> list[Any]:
        with self.services.database.transaction() as session:
            return list(session.execute(sqlalchemy.text(sql), values).all())

    def close(self) -> None:
        self.services.close()


def test_a_runner_that_dies_while_finalizing_leaves_the_batch_to_the_next_which_ends_it_once(
    tmp_path: Path, database_url: str
) -> None:
    """The files are written, then added with the batch's end and its answers' deletion in one
    transaction: a runner that dies between leaves the batch `finalizing` with every answer, and the
    runner taking it over ends it with one output file holding each line once."""
    from modelhost.batches.answers import answered

    store = Store(tmp_path, database_url)
    try:
        batch_id = store.batch(store.owner("a"))
        meter = "SELECT bytes, ended_ms FROM meters WHERE kind = 'storage' AND artifact_id = :id"
        ((size, ended),) = store.query(meter, id=batch_id)  # its input copy is billed as storage
        assert size > 0 and ended is None
        claimed = store.batches.claim("dies", 30, 1)
        assert claimed is not None and claimed.id == batch_id
        store.batches.validated(batch_id, "dies", 3, "minilm")
        body = b'{"object": "list", "data": []}'
        answers = [answered(batch_id, n, f"c{n - 1}", 200, f"req_{n}", body) for n in (3, 1, 2)]
        assert store.batches.record(batch_id, "dies", answers)

        def dies(*_: Any) -> None:
            raise RuntimeError("killed between the files and the transaction")

        real, store.services.uploads.add_in = store.services.uploads.add_in, dies  # type: ignore[method-assign]
        with pytest.raises(RuntimeError):
            store.batches.finalize(batch_id, "dies", "completed")
        store.services.uploads.add_in = real  # type: ignore[method-assign]
        assert store.query("SELECT status FROM batches WHERE id = :id", id=batch_id) == [("finalizing",)]
        assert store.query("SELECT count(*) FROM batch_lines WHERE batch_id = :id", id=batch_id) == [(3,)]
        taken = store.batches.claim("next", 0, 1)  # its claim is stale at once
        assert taken is not None and taken.status == "finalizing"
        store.batches.finalize(batch_id, "next", "completed")
        store.batches.finalize(batch_id, "dies", "completed")  # the first one, back: a no-op
        view = store.batches.get(taken_owner(store, batch_id), batch_id)
        assert view["status"] == "completed" and view["request_counts"]["completed"] == 3
        outputs = store.query("SELECT id, blob_key FROM files WHERE purpose = 'batch_output'")
        assert [row[0] for row in outputs] == [view["output_file_id"]]
        with store.services.blobs.open(outputs[0][1]) as handle:
            assert [json.loads(line)["custom_id"] for line in handle] == ["c0", "c1", "c2"]
        assert store.query("SELECT count(*) FROM batch_lines WHERE batch_id = :id", id=batch_id) == [(0,)]
        ((size, ended),) = store.query(meter, id=batch_id)
        assert ended is not None  # it holds nothing now: its storage meter is closed
    finally:
        store.close()


def test_a_runner_that_loses_the_batch_while_writing_its_files_leaves_the_winners_files_whole(
    tmp_path: Path, database_url: str
) -> None:
    """A runner whose claim went stale while it wrote the files (the next one took the batch over and
    ended it meanwhile) writes blobs of its own and deletes them: the output file the batch names
    still holds every line, and no blob is left behind."""
    from modelhost.batches.answers import answered

    store = Store(tmp_path, database_url)
    try:
        batch_id = store.batch(store.owner("a"))
        store.batches.claim("slow", 30, 1)
        store.batches.validated(batch_id, "slow", 3, "minilm")
        body = b'{"object": "list", "data": []}'
        answers = [answered(batch_id, n, f"c{n - 1}", 200, f"req_{n}", body) for n in (1, 2, 3)]
        assert store.batches.record(batch_id, "slow", answers)
        write, overtaken = store.batches._write_answers, []

        def write_after_the_takeover(batch: str, ok: bool) -> tuple[str, str, int, str, int]:
            if not overtaken:  # while "slow" writes, "next" takes the batch over and ends it
                overtaken.append(store.batches.claim("next", 0, 1))
                store.batches.finalize(batch_id, "next", "completed")
            return write(batch, ok)

        store.batches._write_answers = write_after_the_takeover  # type: ignore[method-assign]
        store.batches.finalize(batch_id, "slow", "completed")
        view = store.batches.get(taken_owner(store, batch_id), batch_id)
        assert overtaken[0] is not None and view["request_counts"]["completed"] == 3
        [(blob_key,)] = store.query("SELECT blob_key FROM files WHERE purpose = 'batch_output'")
        with store.services.blobs.open(blob_key) as handle:
            assert [json.loads(line)["custom_id"] for line in handle] == ["c0", "c1", "c2"]
        output = view["output_file_id"]  # its blobs: the loser's were deleted
        stored = [
            p.name for p in (tmp_path / "data" / "blobs" / "files").iterdir() if p.name.startswith(output)
        ]
        assert stored == [blob_key.removeprefix("files/")]
    finally:
        store.close()


def taken_owner(store: Store, batch_id: str) -> Any:
    from modelhost.batches.files import Owner

    ((account_id, key_id),) = store.query(
        "SELECT account_id, key_id FROM batches WHERE id = :id", id=batch_id
    )
    return Owner(account_id, key_id)


def test_the_queue_takes_accounts_in_turn_with_one_running_batch_each(
    tmp_path: Path, database_url: str
) -> None:
    store = Store(tmp_path, database_url)
    try:
        busy, other = store.owner("busy"), store.owner("other")
        first, second = store.batch(busy), store.batch(busy)
        theirs = store.batch(other)  # the newest
        taken = [store.batches.claim(f"r{i}", 30, 1) for i in range(3)]
        assert [c.id if c else None for c in taken] == [first, theirs, None]
        store.batches.release(first, "r0")  # its server stopped: it is its account's turn again
        again = store.batches.claim("r3", 30, 1)
        assert again is not None and again.id == first and second
    finally:
        store.close()


def test_a_batchs_input_copy_is_refused_below_the_free_disk_floor(tmp_path: Path) -> None:
    from modelhost.errors import InsufficientStorage

    store = Store(
        tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}", min_free_disk_mb=10**9
    )  # more than any disk has
    try:
        with pytest.raises(InsufficientStorage, match="MODELHOST_MIN_FREE_DISK_MB"):
            store.batch(store.owner("a"))
        assert store.query("SELECT count(*) FROM batches") == [(0,)]
    finally:
        store.close()


def test_a_batch_is_refused_402_when_its_account_has_no_credits(server: ChatServer) -> None:
    created = server.http.post(
        "/v1/admin/accounts", json={"name": "broke", "credits": 1}, headers=bearer(ADMIN_KEY)
    )
    account = created.json()
    client = sdk(server.url, account["api_key"])
    file_id = upload(client, [embedding_line("a", "x")])
    spent = server.http.post(
        f"/v1/admin/accounts/{account['id']}/credits", json={"credits": -2}, headers=bearer(ADMIN_KEY)
    )
    assert spent.status_code == 200, spent.text
    response = server.http.post(
        "/v1/batches",
        json={"input_file_id": file_id, "endpoint": "/v1/embeddings", "completion_window": "24h"},
        headers=bearer(account["api_key"]),
    )
    assert_error(response, 402, "insufficient_credits")


async def test_a_background_line_that_reaches_the_runner_is_an_error_line_never_sent(tmp_path: Path) -> None:
    """`background: true` is refused at upload; a line that carries it anyway (a file uploaded before
    that check) is refused by the runner too: it would leave work running past the lines in flight."""
    from datetime import timedelta

    from modelhost.auth.principal import Principal, PrincipalKind
    from modelhost.batches.input import Line
    from modelhost.batches.runner import BatchRun, BatchRunner
    from modelhost.batches.store import Claimed
    from modelhost.store.types import utcnow

    sent: list[Json] = []

    async def call(_principal: Principal, _endpoint: str, body: Json) -> tuple[int, str, bytes]:
        sent.append(body)
        return 200, "req_1", b'{"object": "response"}'

    runner = BatchRunner(None, make_settings(tmp_path, "sqlite://"), lambda _: None, None)  # type: ignore[arg-type]
    runner._call = call  # not started: nothing is claimed, the line is answered by hand
    claimed = Claimed(
        "batch_x",
        "acct",
        "key",
        "/v1/responses",
        "in_progress",
        "k",
        utcnow() + timedelta(hours=1),
        False,
        "",
    )
    run = BatchRun(runner, claimed)
    run.principal = Principal(PrincipalKind.ACCOUNT, "acct", "key")
    body = {"model": "chat", "input": "hi", "background": True}
    answer = await run._answer_of(Line(1, "r1", "POST", "/v1/responses", body))
    assert not answer.ok and sent == []
    assert json.loads(answer.record)["error"]["param"] == "body.background"
    assert (await run._answer_of(Line(2, "r2", "POST", "/v1/responses", {**body, "background": False}))).ok


def test_a_spend_caps_refusal_is_not_tried_again_as_a_full_queues_is() -> None:
    from modelhost.batches.runner import _not_now

    assert _not_now(429, b'{"error": {"code": "overloaded", "message": "queue full"}}')
    assert _not_now(503, b'{"error": {"code": "insufficient_capacity", "message": "later"}}')
    assert not _not_now(429, b'{"error": {"code": "insufficient_quota", "message": "cap"}}')
    assert not _not_now(400, b'{"error": {"code": "invalid_request", "message": "no"}}')


def test_the_runner_keeps_where_each_line_lies_and_parses_it_when_it_sends_it() -> None:
    from modelhost.batches.input import Line, LineError
    from modelhost.batches.reader import Offsets

    first, second = jsonl([embedding_line("a", "x")]).rstrip(), jsonl([embedding_line("bb", "yy")]).rstrip()
    data = first + b"\r\n\n   \n" + second + b"\r" + b"not json\n"
    offsets = Offsets.scan(io.BytesIO(data))
    numbers = [n for n, raw in enumerate(data.splitlines(), start=1) if raw.strip()]
    assert list(offsets.numbers) == numbers == [1, 4, 5]  # as the upload's check numbers them
    handle = io.BytesIO(data)
    read = [offsets.read(handle, i) for i in range(len(offsets))]
    assert [r.custom_id for r in read if isinstance(r, Line)] == ["a", "bb"]
    assert isinstance(read[2], LineError) and read[2].line == 5
    assert list(offsets.shortest_first({5})) == [0, 1]  # line 5 answered already; "a" is shorter


def test_a_batchs_lines_in_flight_are_fewer_when_its_answers_are_large(tmp_path: Path) -> None:
    """As many lines as the server's share allows while answers are small; few while a line's answer
    size is unknown (longer than twice any answered); one at a time once they are known to be huge."""
    from datetime import timedelta

    from modelhost.batches.runner import ANSWER_BYTES_IN_FLIGHT, FIRST_LINES, BatchRun, BatchRunner
    from modelhost.batches.store import Claimed
    from modelhost.store.types import utcnow

    settings = make_settings(tmp_path, "sqlite://", batch_lines_in_flight=256)
    runner = BatchRunner(None, settings, lambda _: None, None)  # type: ignore[arg-type]
    expires = utcnow() + timedelta(hours=1)
    run = BatchRun(
        runner, Claimed("batch_x", "a", "k", "/v1/embeddings", "in_progress", "k", expires, False, "")
    )
    assert run._admits(FIRST_LINES - 1, 100) and not run._admits(FIRST_LINES, 100)  # nothing answered yet
    run.ratio, run.longest = 100.0, 100  # one-sentence lines: 100 bytes in, 10 KB out
    assert run._admits(255, 150) and not run._admits(256, 150)  # the server's share bounds them
    assert not run._admits(FIRST_LINES, 8000)  # 80 times longer: its answer's size is unknown
    run.ratio, run.longest = 1200.0, 8000  # 2,048 one-character inputs: 8 KB in, 9.6 MB out
    run.expected = 6 * 9_600_000
    assert run._admits(0, 8000) and not run._admits(6, 8000)  # a seventh would pass 64 MiB
    assert 6 * 9_600_000 < ANSWER_BYTES_IN_FLIGHT < 7 * 9_600_000
