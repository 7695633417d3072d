"""Text generation on the vLLM engine (issue 29), through HTTP against a real `modelhost serve` process.

Its `chat` deployment runs on vLLM (chosen by `engine: auto`), `chat-own` the same artifact on the
transformers engine; `vlm` and `vlm-own` do the same for a vision-language model (chat with images).
Starting vLLM's engine takes 30 to 70 s on this machine, so one vLLM replica per model serves every test
of the module: `chat` is cold (its first request loads it, the last test unloads it),
and the chat and client tests of tests/test_chat.py and tests/test_clients.py that hold for any engine
are imported below and run again here, against vLLM: the same tests on both engines.

The models are the chat model of tests/tiny_models/chat.py at the smallest shape vLLM's CPU attention
runs (heads of 64) and an Idefics3 of that shape (tests/tiny_models/multimodal.py), with random weights:
answers are checked for shape and validity, and against the transformers engine's, never for content.
Skipped, with the reason, where vLLM is not installed.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import glob
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import msgspec
import openai
import pytest

from modelhost.generation.contract import GenerationRequest, Moved, Sampling, Text
from modelhost.runtime.gateway.client import ReplicaConnection
from modelhost.runtime.replica_protocol import Handoff
from modelhost.runtime.worker.host import HANDOFF_SECONDS
from tests.chat_model import WEATHER
from tests.helpers import (
    ADMIN_KEY,
    assert_error,
    bearer,
    busiest_replica,
    push_folder_sync,
    read_while_generating,
)
from tests.otlp import Receiver, attributes_of, client_traceparent, exporting_to
from tests.server_process import ServerProcess, descends_from, processes, stopped
from tests.test_chat import (  # noqa: F401 (the tests and fixtures run here again, on vLLM)
    MESSAGES,
    PERSON,
    Chat,
    test_a_chat_keeps_the_special_tokens_of_its_familys_markup_and_hides_the_others,
    test_a_conversation_that_goes_on_reuses_its_cached_prefix_and_says_so_in_usage,
    test_a_minus_100_logit_bias_on_the_greedy_token_changes_the_output,
    test_a_misspelt_field_is_400_naming_it,
    test_a_named_tool_choice_calls_that_tool,
    test_a_null_prompt_starts_a_new_document,
    test_a_plus_100_logit_bias_makes_greedy_output_that_token,
    test_a_prompt_over_the_context_is_a_400_naming_max_tokens,
    test_a_salted_key_finds_only_its_own_cached_prefixes_never_another_keys,
    test_allowed_tools_restrict_a_required_call_to_those_tools,
    test_anthropic_clients_authenticate_with_x_api_key_or_a_bearer_token_on_every_route,
    test_anthropic_errors_are_the_sdks_own_exceptions_in_anthropics_shape,
    test_anthropic_sdk_creates_a_message_with_the_chat_completions_answer_and_usage,
    test_anthropic_sdk_streams_a_messages_text_and_its_final_message,
    test_anthropic_stop_sequences_end_the_text_and_are_named_whole_and_streamed,
    test_anthropic_tool_use_round_trip_from_call_to_result_to_answer,
    test_async_client_streams_too,
    test_best_of_returns_the_n_candidates_with_the_highest_mean_log_probability,
    test_chat_completion_answers_openai_shape_with_exact_usage,
    test_chat_takes_content_parts_developer_messages_and_max_completion_tokens,
    test_completions_echo_and_logprobs,
    test_completions_stream_text_completion_chunks,
    test_completions_take_strings_lists_and_token_ids,
    test_concurrent_requests_share_decoding_steps_and_each_gets_its_own_answer,
    test_deprecated_functions_answer_with_a_function_call,
    test_fields_whose_answer_we_cannot_give_are_400_naming_them,
    test_logprobs_and_top_logprobs,
    test_openai_and_anthropic_clients_share_a_deployment_its_token_count_and_a_keys_rate_limit,
    test_openai_fields_that_change_nothing_are_accepted_and_change_nothing,
    test_penalties_and_top_p_change_the_output,
    test_reasoning_effort_is_a_400_naming_it_where_the_family_has_no_switch,
    test_seed_reproduces_sampled_output_and_n_gives_that_many_choices,
    test_stop_strings_end_generation_and_are_not_in_the_output,
    test_stop_token_ids_ignore_eos_include_stop_str_and_skip_special_tokens,
    test_streamed_tool_call_deltas_reassemble_to_the_same_call,
    test_streaming_sends_role_then_content_then_finish_then_usage_and_done,
    test_structured_outputs_hold_a_chat_completion_and_a_completion_to_a_regex_choice_grammar_or_schema,
    test_suffix_needs_a_model_with_fill_in_the_middle_tokens,
    test_tool_choice_auto_and_none_render_tools_or_not,
    test_tool_choice_required_returns_a_call_whose_arguments_validate,
    test_tool_choice_validation_names_the_parameter,
    test_tool_results_render_back_into_the_template,
    test_top_k_min_p_and_repetition_penalty_are_honoured_on_chat_completions_and_responses,
    test_vendor_model_names_are_not_found_and_other_pipelines_are_not_supported,
    tokenizer,
)
from tests.test_clients import (  # noqa: F401 (the real clients, unchanged, against the vLLM deployment)
    Served,
    litellm,
    outside_lookups,
    stays_local,
    test_agents_sdk_chat_completions_model_calls_its_tool_each_turn,
    test_agents_sdk_default_responses_model_calls_its_tool,
    test_agents_sdk_sends_metadata_and_store_and_still_calls_its_tool,
    test_instructor_creates_a_valid_pydantic_object,
    test_langchain_chat_anthropic_invokes_streams_and_calls_a_bound_tool,
    test_langchain_chat_openai_calls_a_forced_tool_whole_and_streamed,
    test_langchain_chat_openai_invokes_and_streams,
    test_langchain_chat_openai_on_the_responses_api_invokes_streams_and_calls_a_forced_tool,
    test_langchain_structured_output_with_json_schema_gives_the_pydantic_model,
    test_litellm_anthropic_route_answers_streams_and_calls_a_forced_tool,
    test_litellm_completion_answers_and_streams,
    test_litellm_completion_calls_a_forced_tool,
    test_litellm_responses_answers,
)
from tests.test_vision_chat import QUESTION, data_uri, png
from tests.vllm_setup import wait_for_vllm

# A cold deployment unloads after this long without requests: long enough that no pause between the
# module's tests (a slow CI machine, a client library's import) unloads it, which costs a vLLM start.
IDLE_SECONDS = 60


@dataclass
class VllmServer:
    process: ServerProcess
    key: str
    http: httpx.Client
    chat: dict[str, Any]  # the vLLM deployment, as created
    own: dict[str, Any]  # the same artifact on the transformers engine
    vlm: dict[str, Any]  # a vision-language model on vLLM (warm: loaded at creation)
    vlm_own: dict[str, Any]  # the same on the transformers engine
    model_dir: Path
    first: tuple[dict[str, Any], httpx.Response, dict[str, Any]]  # `chat` before, its first answer, after

    def post(self, path: str, **body: Any) -> httpx.Response:
        return self.http.post(path, json=body, headers=bearer(self.key))

    def deployment(self, deployment_id: str) -> dict[str, Any]:
        found: dict[str, Any] = self.http.get(
            f"/v1/deployments/{deployment_id}", headers=bearer(self.key)
        ).json()
        return found


@pytest.fixture(scope="module")
def vllm_python() -> str:
    python, reason = wait_for_vllm()
    if python is None:
        pytest.skip(f"vLLM is not available: {reason}")
    return python


@pytest.fixture(scope="module")
def vllm(
    tmp_path_factory: pytest.TempPathFactory, vllm_python: str, receiver: Receiver
) -> Iterator[VllmServer]:
    from tests.tiny_models.chat import build_chat_for_vllm
    from tests.tiny_models.multimodal import build_vlm_for_vllm

    root = tmp_path_factory.mktemp("vllm")
    model_dir, vlm_dir = root / "chat-vllm", root / "vlm-vllm"
    build_chat_for_vllm(model_dir)
    build_vlm_for_vllm(vlm_dir)
    process = ServerProcess(
        root / "data",
        f"sqlite:///{root / 'db.sqlite'}",
        MODELHOST_VLLM_PYTHON=vllm_python,
        MODELHOST_KV_CACHE_MB="64",
        MODELHOST_CONSTRAINED_MAX_STRING_LENGTH="16",
        MODELHOST_COLD_IDLE_SECONDS=str(IDLE_SECONDS),
        # eager: vLLM's compiled mode adds about a minute to each first start (bench/generation.py runs it)
        MODELHOST_VLLM_COMPILE="false",
        # traced, for the test of vLLM's spans: only requests sent with a `traceparent` are
        **exporting_to(receiver, "parentbased_always_off"),
    )
    process.start()
    http = httpx.Client(base_url=process.url, timeout=300)
    try:
        created = http.post("/v1/admin/accounts", json={"name": "vllm"}, headers=bearer(ADMIN_KEY))
        key = created.json()["api_key"]
        artifact = push_folder_sync(http, key, model_dir, "text-generation")
        vlm_artifact = push_folder_sync(http, key, vlm_dir, "image-text-to-text")
        deployments = []
        for body in (
            # cold, engine auto, its context cut to 1536 of the model's 2048 (no test here needs more)
            {"model": "chat", "artifact_id": artifact, "max_model_len": 1536},
            {"model": "chat-own", "artifact_id": artifact, "engine": "transformers"},
            # warm: both load now, vLLM's start overlapping the cold start of `chat` below
            {"model": "vlm", "artifact_id": vlm_artifact, "readiness": "warm"},
            {"model": "vlm-own", "artifact_id": vlm_artifact, "readiness": "warm", "engine": "transformers"},
        ):
            answer = http.post("/v1/deployments", json=body, headers=bearer(key))
            assert answer.status_code == 201, answer.text
            deployments.append(answer.json())
        chat_url = f"/v1/deployments/{deployments[0]['id']}"
        before = http.get(chat_url, headers=bearer(key)).json()
        body = {"model": "chat", "messages": MESSAGES, "max_tokens": 4}
        first = http.post("/v1/chat/completions", json=body, headers=bearer(key))  # loads it: the cold start
        after = http.get(chat_url, headers=bearer(key)).json()
        yield VllmServer(process, key, http, *deployments, model_dir, (before, first, after))
    finally:
        http.close()
        process.stop()


@pytest.fixture(scope="module")
def chat(vllm: VllmServer) -> Chat:
    """tests/test_chat.py's server, here on vLLM."""
    return Chat(vllm.process.url, vllm.key, vllm.http, vllm.chat["id"])


@pytest.fixture(scope="module")
def served(vllm: VllmServer) -> Served:
    """tests/test_clients.py's server, here on vLLM (its chat tests only)."""
    return Served(vllm.process.url, vllm.key)


# ---------------------------------------------------------------- the engine's choice, and its first load


def test_auto_runs_an_architecture_in_vllms_registry_on_vllm_and_says_why(vllm: VllmServer) -> None:
    assert vllm.chat["engine"] == "auto"
    assert vllm.chat["engine_in_use"] == "vllm"
    assert "Qwen2ForCausalLM" in vllm.chat["engine_reason"]
    assert (vllm.own["engine"], vllm.own["engine_in_use"], vllm.own["engine_reason"]) == (
        "transformers",
        "transformers",
        None,
    )


def test_a_cold_vllm_deployment_loads_on_its_first_request(vllm: VllmServer) -> None:
    """The module's first request (made by the fixture, whichever test runs first) loaded it."""
    before, answer, deployment = vllm.first
    assert before["state"] == "unloaded"
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] == 4
    assert deployment["state"] == "ready"
    assert deployment["last_cold_start_seconds"] > 0
    assert deployment["memory_gb"] > 0.1  # vLLM's engine core holds the model: its process tree is metered
    assert processes("modelhost.runtime.worker.vllm_worker", vllm.chat["id"])
    metrics = vllm.http.get("/metrics").text
    assert f'modelhost_deployment_engine{{deployment="{vllm.chat["id"]}",engine="vllm"}} 1.0' in metrics


def test_a_generation_on_vllm_joins_the_requests_trace(vllm: VllmServer, receiver: Receiver) -> None:
    header, trace_id, client_span = client_traceparent()
    body = {"model": "chat", "messages": MESSAGES, "max_tokens": 4, "min_tokens": 4, "temperature": 0}
    answer = vllm.http.post(
        "/v1/chat/completions", json=body, headers={**bearer(vllm.key), "traceparent": header}
    )
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    spans = receiver.wait_for(trace_id, {"chat chat", "dispatch", "generate", "prefill", "decode"})
    server = spans["chat chat"][1]
    assert server.parent_span_id.hex() == client_span
    assert attributes_of(server)["gen_ai.usage.output_tokens"] == usage["completion_tokens"] == 4
    resource, generate = spans["generate"]
    assert resource["modelhost.process"] == "replica"  # vLLM's replica worker, another process
    assert generate.parent_span_id == spans["dispatch"][1].span_id
    attributes = attributes_of(generate)
    assert attributes["modelhost.engine"] == "vllm"
    assert attributes["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert attributes["gen_ai.usage.output_tokens"] == 4
    assert attributes["gen_ai.server.time_to_first_token"] > 0
    assert spans["prefill"][1].end_time_unix_nano == spans["decode"][1].start_time_unix_nano


def test_an_architecture_vllm_lacks_falls_back_under_auto_and_is_a_400_under_vllm(
    vllm: VllmServer, tmp_path: Path
) -> None:
    folder = tmp_path / "diffllama"
    shutil.copytree(vllm.model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["DiffLlamaForCausalLM"]}))
    artifact = push_folder_sync(vllm.http, vllm.key, folder, "text-generation")
    auto = vllm.post("/v1/deployments", model="diffllama", artifact_id=artifact)
    assert auto.status_code == 201, auto.text
    assert auto.json()["engine_in_use"] == "transformers"
    assert "vLLM does not support the architecture DiffLlamaForCausalLM" in auto.json()["engine_reason"]
    forced = vllm.post("/v1/deployments", model="diffllama-vllm", artifact_id=artifact, engine="vllm")
    assert_error(forced, 400, code="engine_not_supported", param="engine")
    assert "DiffLlamaForCausalLM" in forced.json()["error"]["message"]


# ---------------------------------------------------------------- the same answers as the transformers engine


def _greedy(vllm: VllmServer, model: str, tokens: int, key: str | None = None) -> Any:
    """A greedy chat's tokens with their log-probabilities, sent with `key` (the module's own if
    None)."""
    body = {"model": model, "messages": MESSAGES, "max_tokens": tokens, "min_tokens": tokens}
    body |= {"temperature": 0, "logprobs": True, "top_logprobs": 2}
    answer = vllm.http.post("/v1/chat/completions", json=body, headers=bearer(key or vllm.key))
    assert answer.status_code == 200, answer.text
    return answer.json()["choices"][0]["logprobs"]["content"]


def test_greedy_output_equals_the_transformers_engines_or_parts_at_a_near_tie(vllm: VllmServer) -> None:
    _assert_same_greedy(_greedy(vllm, "chat", 16), _greedy(vllm, "chat-own", 16))


async def test_a_continuation_on_vllm_goes_on_from_the_tokens_sent_as_the_undisturbed_answer_did(
    vllm: VllmServer,
) -> None:
    """Issue 73 on vLLM, through the replica's own socket, as a gateway sends a generation whose replica
    died (a vLLM start costs a minute, so none is killed here; the move itself: tests/test_chat.py on
    the transformers engine): the tokens after the cut, their text and the count equal the undisturbed
    answer's. A grammar's or stop strings' answer says no tokens, so it never moves on vLLM."""
    [path] = glob.glob(f"/tmp/modelhost-replicas-*/{vllm.chat['id']}-*.sock")
    connection = await ReplicaConnection.open(path)
    try:
        request = GenerationRequest(
            prompt="The weather in Paris is", params=Sampling(max_tokens=24, min_tokens=24, temperature=0)
        )
        whole = [e async for e in connection.stream(request) if isinstance(e, Text)]
        assert all(e.token_ids for e in whole)  # each event says its tokens (several, when vLLM is behind)
        ids = [t for e in whole for t in e.token_ids or ()]
        assert len(ids) == 24
        bounds = list(itertools.accumulate(len(e.token_ids or ()) for e in whole))
        after = next(i for i, bound in enumerate(bounds) if bound >= 8 or i == len(bounds) - 2) + 1
        cut = bounds[after - 1]  # at an event's end, as a gateway cuts, about a third of the way
        rest = [e async for e in connection.stream(msgspec.structs.replace(request, continued=ids[:cut]))]
        texts = [e for e in rest if isinstance(e, Text)]
        assert [t for e in texts for t in e.token_ids or ()] == ids[cut:]
        assert "".join(e.text for e in texts) == "".join(e.text for e in whole[after:])
        assert (texts[-1].completion_tokens, texts[-1].finish) == (24, "length")
        stopped = msgspec.structs.replace(request, params=Sampling(max_tokens=4, stop=["zz"]))
        said = [e.token_ids for e in [e async for e in connection.stream(stopped)] if isinstance(e, Text)]
        assert said and all(ids is None for ids in said)
    finally:
        connection.close()


async def test_a_draining_vllm_replica_hands_off_what_can_move_and_finishes_the_rest(
    vllm: VllmServer,
) -> None:
    """Issue 73: `Handoff` (the supervisor's, on a rollout's drain or a scale-down) ends each generation
    that can go on elsewhere with `Moved`, at once, and each that arrives in the next two seconds; a
    stop-string answer, which cannot move on vLLM, runs to its end here. vLLM's engine core is held
    (SIGSTOP) while the generations are in the worker: the tiny model would end them in a moment."""
    [path] = glob.glob(f"/tmp/modelhost-replicas-*/{vllm.chat['id']}-*.sock")
    [worker] = processes("modelhost.runtime.worker.vllm_worker", vllm.chat["id"])
    core = [int(p.name) for p in Path("/proc").glob("[0-9]*") if _child_of(int(p.name), worker)]
    connection = await ReplicaConnection.open(path)

    async def events(request: GenerationRequest) -> list[Any]:
        return [e async for e in connection.stream(request)]

    try:
        long = GenerationRequest(prompt="Once upon a time", params=Sampling(max_tokens=60, min_tokens=60))
        pinned = msgspec.structs.replace(long, params=Sampling(max_tokens=60, min_tokens=60, stop=["zz"]))
        with stopped(*core):
            moving, staying = asyncio.create_task(events(long)), asyncio.create_task(events(pinned))
            await asyncio.sleep(0.5)  # in the worker, waiting for the engine core
            connection.send(Handoff())
            assert [type(e) for e in await moving] == [Moved]
            assert [type(e) for e in await events(long)] == [Moved]  # arriving within 2 s
        kept = [e for e in await staying if isinstance(e, Text)]
        assert (kept[-1].completion_tokens, kept[-1].finish) == (60, "length")  # it could not move
        await asyncio.sleep(HANDOFF_SECONDS)
        after = await events(msgspec.structs.replace(long, params=Sampling(max_tokens=3)))
        assert isinstance(after[-1], Text) and after[-1].finish == "length"  # it serves again
    finally:
        connection.close()


def _child_of(pid: int, parent: int) -> bool:
    try:
        return descends_from(pid, parent)
    except OSError:  # gone meanwhile
        return False


def _assert_same_greedy(on_vllm: list[dict[str, Any]], on_own: list[dict[str, Any]]) -> None:
    """Both engines run the checkpoint in float32, with other kernels: the same tokens, and
    log-probabilities equal to 1e-3, until the first place (if any) where the two best tokens are that
    close."""
    for position, (ours, theirs) in enumerate(zip(on_vllm, on_own, strict=True)):
        assert abs(ours["logprob"] - theirs["logprob"]) < 1e-3 or ours["token"] != theirs["token"], position
        if ours["token"] != theirs["token"]:
            best, second = theirs["top_logprobs"][:2]
            assert best["logprob"] - second["logprob"] < 1e-3, (position, ours, theirs)
            break


def test_a_keys_greedy_answer_beside_another_keys_streams_is_what_each_is_alone_on_vllm(
    vllm: VllmServer,
) -> None:
    """Our scheduler in vLLM's engine core (`engines.vllm_shares`) leaves key A's running requests out
    of steps while key B's first request prefills and while B decodes in a smaller batch: a paused
    request resumes where it was, so every greedy answer is what it is alone (or parts at a near tie,
    as two batch shapes' kernels may)."""
    made = vllm.post("/v1/keys", name="fair-b")
    assert made.status_code == 201, made.text
    key_b = made.json()["api_key"]
    b_alone, a_alone = _greedy(vllm, "chat", 12, key_b), _greedy(vllm, "chat", 160)
    with concurrent.futures.ThreadPoolExecutor(9) as pool:
        heavy = [pool.submit(_greedy, vllm, "chat", 160) for _ in range(8)]
        time.sleep(0.3)  # A's requests running
        b_beside = _greedy(vllm, "chat", 12, key_b)
        a_beside = [future.result() for future in heavy]
    _assert_same_greedy(b_beside, b_alone)
    for answer in a_beside:
        _assert_same_greedy(answer, a_alone)


# ---------------------------------------------------------------- chat with images


def _image_chat(vllm: VllmServer, model: str, seeds: tuple[int, ...], tokens: int = 8) -> dict[str, Any]:
    """A greedy chat about the images `png(seed)` of tests/test_vision_chat.py, with log-probabilities."""
    parts: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": data_uri(png(s))}} for s in seeds
    ]
    _wait_until_ready(vllm, model)
    answer = vllm.post(
        "/v1/chat/completions",
        model=model,
        messages=[{"role": "user", "content": [*parts, {"type": "text", "text": QUESTION}]}],
        max_tokens=tokens,
        min_tokens=tokens,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def _wait_until_ready(vllm: VllmServer, model: str) -> None:
    """`vlm` and `vlm-own` are warm: they load when created, vLLM's in about a minute here."""
    deployment = vllm.vlm if model == "vlm" else vllm.vlm_own
    deadline = time.monotonic() + 300
    while (state := vllm.deployment(deployment["id"])["state"]) == "loading" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert state == "ready", vllm.deployment(deployment["id"])


def test_auto_runs_a_vision_language_model_vllm_can_import_on_vllm(vllm: VllmServer) -> None:
    assert vllm.vlm["engine_in_use"] == "vllm"
    assert "Idefics3ForConditionalGeneration" in vllm.vlm["engine_reason"]
    assert vllm.vlm_own["engine_in_use"] == "transformers"


def test_image_chat_on_vllm_equals_the_transformers_engines(vllm: VllmServer) -> None:
    """One image, another, and both in one message: the same prompt length on both engines (each image
    expanded into its image tokens by each engine's copy of the processor), the same greedy tokens with
    log-probabilities equal to 1e-3, and a different answer for each: the model reads the images."""
    answers = set()
    for seeds in ((1,), (2,), (1, 2)):
        on_vllm, on_own = _image_chat(vllm, "vlm", seeds), _image_chat(vllm, "vlm-own", seeds)
        assert on_vllm["usage"]["prompt_tokens"] == on_own["usage"]["prompt_tokens"] > 4 * len(seeds)
        _assert_same_greedy(
            on_vllm["choices"][0]["logprobs"]["content"], on_own["choices"][0]["logprobs"]["content"]
        )
        answers.add(on_vllm["choices"][0]["message"]["content"])
    assert len(answers) == 3


def test_the_sdk_streams_an_image_chat_and_the_responses_api_reads_input_images_on_vllm(
    vllm: VllmServer,
) -> None:
    expected = _image_chat(vllm, "vlm-own", (3,))["choices"][0]["message"]["content"]
    client = openai.OpenAI(base_url=f"{vllm.process.url}/v1", api_key=vllm.key)
    image = data_uri(png(3))
    stream = client.chat.completions.create(
        model="vlm",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": image}},
                    {"type": "text", "text": QUESTION},
                ],
            }
        ],
        max_tokens=8,
        temperature=0,
        extra_body={"min_tokens": 8},
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
    response = client.responses.create(
        model="vlm",
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_image", "image_url": image},
                    {"type": "input_text", "text": QUESTION},
                ],
            }
        ],
        max_output_tokens=8,
        temperature=0,
        extra_body={"min_tokens": 8},
    )
    assert response.output_text == expected


def test_a_bad_image_is_a_400_naming_its_part_and_a_text_only_vllm_model_refuses_images(
    vllm: VllmServer,
) -> None:
    _wait_until_ready(vllm, "vlm")
    not_an_image = "data:image/png;base64," + base64.b64encode(b"not a picture").decode()
    parts = [{"type": "text", "text": "look:"}, {"type": "image_url", "image_url": {"url": not_an_image}}]
    bad = vllm.post("/v1/chat/completions", model="vlm", messages=[{"role": "user", "content": parts}])
    assert_error(bad, 400, param="messages[0].content[1].image_url.url")
    parts[1]["image_url"] = {"url": data_uri(png(1))}
    text_only = vllm.post("/v1/chat/completions", model="chat", messages=[{"role": "user", "content": parts}])
    assert_error(text_only, 400, param="messages[0].content")
    assert "text only" in text_only.json()["error"]["message"]


# ---------------------------------------------------------------- constrained decoding, errors, streaming


def test_json_schema_output_validates(chat: Chat) -> None:
    """tests/test_chat.py's own check, but for its `json_object` half: an open object lets this random
    model write keys until `max_tokens` on either engine; only the bounded schema must end in time."""
    schema = PERSON
    for seed in (1, 2, 3):
        answer = chat.client().chat.completions.create(
            model="chat",
            messages=MESSAGES,
            max_tokens=80,
            temperature=0.7,
            seed=seed,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "p", "schema": schema, "strict": True},
            },
        )
        jsonschema.validate(json.loads(answer.choices[0].message.content or ""), schema)


@pytest.mark.xfail(
    reason="open (issue 29's gauge): passes alone and with the rest of tests/test_vllm.py, but in the "
    "full suite's run the vLLM worker's gauges read 0 while it generates (its generation-sequences "
    "gauge too, see test_a_disconnect_frees_the_vllm_sequence_within_two_seconds): not understood yet",
    strict=False,
)
def test_vllms_kv_cache_usage_gauge_rises_while_a_sequence_holds_blocks_and_falls_after(chat: Chat) -> None:
    """`modelhost_kv_cache_usage_ratio` on vLLM: the fraction of its KV-cache blocks its requests hold, as
    its scheduler reports at each step, one series per replica process, and none of vLLM's own `vllm:*`
    series on /metrics. Generations follow one another until a scrape sees the blocks held: the tiny
    model answers one in about a second, which a slow scrape under load can miss."""
    chat.client().chat.completions.create(model="chat", messages=MESSAGES, max_tokens=1)  # loaded
    deadline = time.monotonic() + 5  # idle (a stream an earlier test left is aborted within moments)
    while (idle := _cache_usage(chat)) != 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert idle == 0  # and the gauge there since the replica loaded
    busy = read_while_generating(
        lambda: _cache_usage(chat),
        lambda: chat.client().chat.completions.create(  # about half a second each
            model="chat", messages=MESSAGES, max_tokens=600, temperature=0, extra_body={"min_tokens": 600}
        ),
    )
    assert 0 < busy <= 0.5, busy  # one sequence's blocks, of a cache for many (MODELHOST_KV_CACHE_MB)
    deadline = time.monotonic() + 15
    while (usage := _cache_usage(chat)) != 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert usage == 0
    lines = chat.http.get("/metrics").text.splitlines()  # vLLM's Prometheus logger is ours, writing nothing
    assert not [line for line in lines if line.startswith(("vllm:", "# HELP vllm:", "# TYPE vllm:"))]


def _cache_usage(chat: Chat) -> float:
    return busiest_replica(
        chat.http.get("/metrics").text, "modelhost_kv_cache_usage_ratio", chat.deployment_id
    )


@pytest.mark.xfail(
    strict=False,
    reason="open (issue 29): passes alone and with tests/test_chat.py, but in the full suite's run the "
    "engine still computed 1 to 2 s after the client left (and the worker's gauge read 0 while it "
    "generated): the cancel path under load is not understood yet",
)
def test_a_disconnect_frees_the_vllm_sequence_within_two_seconds(vllm: VllmServer, chat: Chat) -> None:
    """Seen by the engine's own work: vLLM's processes compute at about a core while the stream runs and
    go quiet once the client leaves (a sequence still held would go on for the whole context). Read
    from /proc, not from the `modelhost_generation_sequences` gauge, which other test modules' servers
    in the same pytest process have been seen to disturb."""
    session = _engine_session(vllm)
    stream = chat.client().chat.completions.create(
        model="chat", messages=MESSAGES, max_tokens=1400, stream=True, extra_body={"min_tokens": 1400}
    )  # nearly the whole context (1536): it would run for as long as the test reads
    for _, _chunk in zip(range(3), stream, strict=False):
        pass
    generating = _cores(session, 1.0)
    assert generating > 0.4, f"vLLM's processes used {generating:.2f} cores while generating"
    stream.close()
    time.sleep(1.0)
    after = _cores(session, 1.0)
    assert after < 0.15, f"vLLM's processes still use {after:.2f} cores 1 to 2 s after the client left"


def _engine_session(vllm: VllmServer) -> int:
    """`chat`'s loaded vLLM replica worker: it leads a session of its own, which vLLM's engine core and
    worker processes share (and no other deployment's)."""
    (worker,) = processes("modelhost.runtime.worker.vllm_worker", vllm.chat["id"])
    return worker


def _cores(session: int, seconds: float) -> float:
    """CPU seconds per wall second of the session's processes, over `seconds`."""
    pids = _in_session(session)
    before = sum(_cpu_seconds(pid) for pid in pids)
    time.sleep(seconds)
    return (sum(_cpu_seconds(pid) for pid in pids) - before) / seconds


def _cpu_seconds(pid: str) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def test_a_deployments_max_model_len_is_the_context_vllm_runs_with(vllm: VllmServer) -> None:
    assert vllm.chat["max_model_len"] == 1536
    # /tokenize says the context of the loaded engine: vLLM's own `max_model_len`, as it was started
    assert vllm.post("/tokenize", model="chat", prompt="hello").json()["max_model_len"] == 1536
    long = "hello world " * 420
    assert 1536 < vllm.post("/tokenize", model="chat", prompt=long).json()["count"] < 2048  # the model's
    refused = vllm.post("/v1/completions", model="chat", prompt=long, max_tokens=1)
    assert (
        "the deployment's context (max_model_len) of 1536"
        in assert_error(refused, 400, param="prompt")["message"]
    )


def test_bad_input_is_a_400_in_our_shape_never_vllms(vllm: VllmServer) -> None:
    too_long = vllm.post("/v1/completions", model="chat", prompt="hello", max_tokens=5000)
    assert_error(too_long, 400, code="context_length_exceeded", param="max_tokens")
    bias = vllm.post("/v1/completions", model="chat", prompt="hello", logit_bias={"99999": 5}, max_tokens=2)
    assert_error(bias, 400, param="logit_bias")
    assert "vocabulary" in bias.json()["error"]["message"]
    ids = vllm.post("/v1/completions", model="chat", prompt=[1, 99999], max_tokens=2)
    assert_error(ids, 400, param="prompt")


def test_tokenize_and_detokenize_on_vllm_equal_the_transformers_engines(vllm: VllmServer) -> None:
    """The same token IDs for a prompt, a chat (the deployment's template) and a chat with tools (each
    engine's context is its deployment's own: the vLLM one runs with `max_model_len` 1536)."""
    bodies: list[dict[str, Any]] = [
        {"prompt": "hello world", "return_token_strs": True},
        {"messages": MESSAGES},
        {"messages": MESSAGES, "tools": [WEATHER], "add_generation_prompt": False},
    ]
    for body in bodies:
        on_vllm, on_own = (vllm.post("/tokenize", model=model, **body) for model in ("chat", "chat-own"))
        assert on_vllm.status_code == 200, on_vllm.text
        assert on_vllm.json()["max_model_len"] == 1536 and on_own.json()["max_model_len"] == 2048
        assert {**on_vllm.json(), "max_model_len": 0} == {**on_own.json(), "max_model_len": 0}
        assert on_vllm.json()["count"] > 0
    tokens = on_vllm.json()["tokens"]
    back = [vllm.post("/detokenize", model=model, tokens=tokens).json() for model in ("chat", "chat-own")]
    assert back[0] == back[1] and "berlin" in back[0]["prompt"]
    assert_error(vllm.post("/detokenize", model="chat", tokens=[10**6]), 400, param="tokens")
    info = [
        vllm.http.get(f"/tokenizer_info?model={m}", headers=bearer(vllm.key)) for m in ("chat", "chat-own")
    ]
    assert info[0].status_code == 200 and info[0].json() == info[1].json() and info[0].json()["eos_token"]


def test_openai_sdk_streams_completions_with_usage_on_vllm(chat: Chat) -> None:
    stream = chat.client().completions.create(
        model="chat",
        prompt="Once upon a time",
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 8
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text and chunks[-2].choices[0].finish_reason == "length"


def test_unloading_a_vllm_deployment_leaves_no_engine_process(vllm: VllmServer) -> None:
    """Last: `chat` moves to the transformers engine, which unloads its vLLM replica at once (the same
    unload as an idle cold deployment's, without waiting for the idle time); vLLM's engine core and
    worker processes (its own session) end with the replica worker."""
    session = _engine_session(vllm)  # the test before this one used `chat`: it is loaded
    assert len(_in_session(session)) > 1  # the worker and vLLM's engine processes
    patched = vllm.http.patch(
        f"/v1/deployments/{vllm.chat['id']}", json={"engine": "transformers"}, headers=bearer(vllm.key)
    )
    assert patched.status_code == 200, patched.text
    deadline = time.monotonic() + 60
    while vllm.deployment(vllm.chat["id"])["state"] != "unloaded" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert vllm.deployment(vllm.chat["id"])["state"] == "unloaded"
    deadline = time.monotonic() + 15  # the worker shuts vLLM down (about 5 s), else is killed at 5 s
    while (leftovers := _in_session(session)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert leftovers == [], "vLLM's processes outlived their replica"


def _in_session(session: int) -> list[str]:
    """The live processes of a session (a vLLM replica worker's: itself and vLLM's processes)."""
    return [p.name for p in Path("/proc").glob("[0-9]*") if _session_of(p) == session]


def _session_of(proc: Path) -> int | None:
    try:
        state, _ppid, _group, session = (proc / "stat").read_text().rsplit(")", 1)[1].split()[:4]
    except (OSError, ValueError):
        return None
    return None if state == "Z" else int(session)  # a zombie has ended: only its entry waits


# ---------------------------------------------------------------- beside other deployments


def test_a_vllm_deployment_loads_beside_others_holding_most_of_the_memory_node(
    vllm_python: str, tmp_path: Path
) -> None:
    """vLLM's CPU backend refuses to start when less than its memory fraction (0.92 of the node) is
    available, unless it is told its KV cache's size. The replica is always told: the KV cache its
    footprint reserved (no `MODELHOST_KV_CACHE_MB` here). A process holding memory stands in for the
    other deployments: available memory drops below 90 % of the node, where vLLM's default refused."""
    from tests.tiny_models.chat import build_chat_for_vllm

    total, available = _meminfo("MemTotal"), _meminfo("MemAvailable")
    hold = max(0, available - int(total * 0.85))  # what leaves 85 % of the node available at most
    holder = subprocess.Popen([sys.executable, "-c", f"import time; x = b'1' * {hold}; time.sleep(600)"])
    model_dir = tmp_path / "chat-vllm"
    build_chat_for_vllm(model_dir)
    process = ServerProcess(
        tmp_path / "data",
        f"sqlite:///{tmp_path / 'db.sqlite'}",
        MODELHOST_VLLM_PYTHON=vllm_python,
        MODELHOST_VLLM_COMPILE="false",
        MODELHOST_MEMORY_BUDGET_MB="4096",
    )
    try:
        deadline = time.monotonic() + 60
        while _meminfo("MemAvailable") > total * 0.9 and time.monotonic() < deadline:
            time.sleep(0.2)  # until the holder has written its pages
        assert _meminfo("MemAvailable") <= total * 0.9
        process.start()
        with httpx.Client(base_url=process.url, timeout=300) as http:
            key = http.post("/v1/admin/accounts", json={"name": "v"}, headers=bearer(ADMIN_KEY)).json()[
                "api_key"
            ]
            artifact = push_folder_sync(http, key, model_dir, "text-generation")
            created = http.post(
                "/v1/deployments", json={"model": "chat", "artifact_id": artifact}, headers=bearer(key)
            )
            assert created.json()["engine_in_use"] == "vllm", created.text
            body = {"model": "chat", "messages": MESSAGES, "max_tokens": 4}
            answer = http.post("/v1/chat/completions", json=body, headers=bearer(key))
            assert answer.status_code == 200, answer.text
            [worker] = processes("modelhost.runtime.worker.vllm_worker", created.json()["id"])
            command = Path(f"/proc/{worker}/cmdline").read_bytes().split(b"\0")
            kv_mb = int(command[command.index(b"--kv-cache-mb") + 1])
            assert 1 <= kv_mb <= 4096 // 8  # the model's 64 contexts, at most an eighth of the budget
            capacity = http.get("/v1/admin/capacity", headers=bearer(ADMIN_KEY)).json()
            [held] = capacity["deployments"]
            assert held["model"] == "chat" and held["footprint_bytes"] >= kv_mb << 20
    finally:
        process.stop()
        holder.kill()
        holder.wait()


def _meminfo(field: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise LookupError(field)
