"""The Files and Batch APIs through the unchanged openai SDK (issue 41): upload, create, poll, download;
output equal to direct calls; failures in the error file with their reason; cancel; expiry; a SIGKILL
mid-batch; validation answers as OpenAI gives them; another account sees nothing."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.chat_model import ChatServer, long_context_copy, served_chat_model
from tests.conftest import make_settings
from tests.helpers import ADMIN_KEY, assert_error, bearer, deploy_folder_sync, push_folder_sync
from tests.live import live_server
from tests.server_process import ServerProcess

Json = dict[str, Any]
SENTENCES = [f"Sentence number {i} about the weather." for i in range(12)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, recipes: Path, minilm_dir: Path) -> Iterator[ChatServer]:
    """One live server: a warm `chat` deployment and a warm `minilm` one, one account."""
    with served_chat_model(tmp_path_factory.mktemp("batches"), recipes, batch_poll_seconds=0.2) as served:
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
        count = 3000
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
    from modelhost.batches.store import answered

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
    client.embeddings.create(model="minilm", input="first")
    with pytest.raises(openai.RateLimitError):
        client.embeddings.create(model="minilm", input="second")  # the limit holds for direct calls
    lines = [embedding_line(f"l{i}", f"line {i}") for i in range(6)]
    # the upload is a request of the Files API, which the limit counts: the account's key makes it
    file_id = upload(sdk(server.url, server.key), lines)
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h")
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
        # long answers (all in flight at once) after a cold start: silent a while on any machine
        lines = [chat_line(f"l{i}", f"line {i}", 48, exact=True) for i in range(count)]
        started = time.monotonic()
        batch = client.batches.create(
            input_file_id=upload(client, lines), endpoint="/v1/chat/completions", completion_window="24h"
        )
        while (counts := client.batches.retrieve(batch.id).request_counts) is None or not counts.completed:
            time.sleep(0.05)
        assert time.monotonic() - started > 2 * stale  # silent for longer than the stale time
        done = wait(client, batch.id, ("completed",))
        assert done.request_counts is not None and done.request_counts.completed == count
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
