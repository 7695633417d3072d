"""Encoders on ONNX Runtime and OpenVINO (issue 30), through HTTP against a real `modelhost serve`.

The suite runs encoders on torch (tests/__init__.py turns `MODELHOST_ENCODER_RUNTIMES` off); this
module's server turns it on. The tiny model of every encoder task is deployed on `auto` (measured at
load), on each runtime (`onnxruntime`, `openvino`: the same behaviour tests for both) and on
`transformers`, and they are compared: outputs equal within 1e-4, the choice and its reason on the
deployment, and the cached export read on a later load of the same artifact.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from tests.helpers import ADMIN_KEY, assert_error, bearer, push_folder_sync
from tests.server_process import ServerProcess
from tests.test_tasks import b64, png

TOLERANCE = 1e-4
# Every runtime an encoder can run on, with the name its reason gives: each behaviour test runs on both
ENGINES = {"onnxruntime": "ONNX Runtime", "openvino": "OpenVINO"}
each_runtime = pytest.mark.parametrize("engine", list(ENGINES))
TEXTS = ["Hi.", "A longer sentence that pads the others in its batch, with several words.", "Two words"]


@dataclass
class Runtimes:
    process: ServerProcess
    http: httpx.Client
    key: str
    data_dir: Path
    artifacts: dict[str, str] = field(default_factory=dict)  # recipe folder -> artifact ID
    deployments: dict[str, dict[str, Any]] = field(default_factory=dict)  # model ID -> as created

    def artifact(self, recipes: Path, folder: str, pipeline: str) -> str:
        """`folder`'s model as an artifact, pushed once."""
        if folder not in self.artifacts:
            self.artifacts[folder] = push_folder_sync(self.http, self.key, recipes / folder, pipeline)
        return self.artifacts[folder]

    def create(self, model: str, artifact: str, **body: Any) -> httpx.Response:
        created = self.http.post(
            "/v1/deployments",
            json={"model": model, "artifact_id": artifact, **body},
            headers=bearer(self.key),
        )
        if created.status_code == 201:
            self.deployments[model] = created.json()
        return created

    def deploy(self, recipes: Path, folder: str, pipeline: str, engine: str) -> str:
        """`folder`'s model (pushed once) deployed on `engine`, as `<folder>-<engine>`."""
        model = f"{folder.replace('/', '-')}-{engine}"
        if model not in self.deployments:
            created = self.create(model, self.artifact(recipes, folder, pipeline), engine=engine)
            assert created.status_code == 201, created.text
        return model

    def deployment(self, model: str) -> dict[str, Any]:
        found: dict[str, Any] = self.http.get(
            f"/v1/deployments/{self.deployments[model]['id']}", headers=bearer(self.key)
        ).json()
        return found

    def post(self, path: str, **body: Any) -> Any:
        answer = self.http.post(path, json=body, headers=bearer(self.key))
        assert answer.status_code == 200, answer.text
        return answer.json()

    def embed(self, model: str, texts: list[str]) -> np.ndarray:
        data = self.post("/v1/embeddings", model=model, input=texts)["data"]
        return np.array([row["embedding"] for row in data])

    def classify(self, model: str, texts: list[str]) -> np.ndarray:
        """Every label's score per text, in label order."""
        results = self.post("/v1/classifications/text", model=model, inputs=texts, top_k=None)
        rows = results if isinstance(results[0], list) else [results]
        return np.array([[s["score"] for s in sorted(row, key=lambda s: s["label"])] for row in rows])


@pytest.fixture(scope="module")
def runtimes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runtimes]:
    root = tmp_path_factory.mktemp("encoder-runtimes")
    process = ServerProcess(
        root / "data", f"sqlite:///{root / 'db.sqlite'}", MODELHOST_ENCODER_RUNTIMES="true"
    )
    process.start()
    http = httpx.Client(base_url=process.url, timeout=300)
    try:
        created = http.post("/v1/admin/accounts", json={"name": "onnx"}, headers=bearer(ADMIN_KEY))
        yield Runtimes(process, http, created.json()["api_key"], root / "data")
    finally:
        http.close()
        process.stop()


def cached_exports(runtimes: Runtimes) -> dict[Path, float]:
    """The exported models under the server's cache, with their modification times."""
    return {
        path: path.stat().st_mtime for path in (runtimes.data_dir / "encoder-runtimes").glob("*/model.onnx")
    }


def test_auto_measures_onnxruntime_against_torch_at_the_first_load_and_says_so(
    runtimes: Runtimes, recipes: Path
) -> None:
    model = runtimes.deploy(recipes, "t03_feature_extraction/hf", "feature-extraction", "auto")
    before = runtimes.deployment(model)
    assert before["engine_in_use"] == "transformers"
    assert "measured when a replica first loads" in before["engine_reason"]
    runtimes.embed(model, TEXTS)  # loads it: export, equality check, timing
    after = runtimes.deployment(model)
    assert after["engine_in_use"] in ("onnxruntime", "openvino", "transformers")  # the fastest measured
    reason = after["engine_reason"]
    assert reason.startswith(f"auto chose {after['engine_in_use']}: "), reason
    for runtime in ("ONNX Runtime ", "OpenVINO "):  # both measured, each with its figures
        _, found, figures = reason.partition(runtime)
        assert found, reason
        for case in ("short batch 1", "short batch 32", "long batch 1", "long batch 32"):
            assert f" x at {case}" in figures.split(";")[0], reason
    metrics = runtimes.http.get("/metrics").text
    engine_line = (
        f'modelhost_deployment_engine{{deployment="{after["id"]}",engine="{after["engine_in_use"]}"}} 1.0'
    )
    assert engine_line in metrics


@pytest.mark.parametrize("folder", ["t03_feature_extraction/hf", "t03_feature_extraction/st"])
@each_runtime
def test_embeddings_on_each_runtime_equal_torchs_single_and_batched(
    runtimes: Runtimes, recipes: Path, folder: str, engine: str
) -> None:
    on_runtime = runtimes.deploy(recipes, folder, "feature-extraction", engine)
    on_torch = runtimes.deploy(recipes, folder, "feature-extraction", "transformers")
    batched = runtimes.embed(on_runtime, TEXTS)
    assert np.abs(batched - runtimes.embed(on_torch, TEXTS)).max() <= TOLERANCE
    for index, text in enumerate(TEXTS):  # alone, unpadded: the same vector as in the padded batch
        single = runtimes.embed(on_runtime, [text])[0]
        assert np.abs(single - batched[index]).max() <= TOLERANCE
    deployment = runtimes.deployment(on_runtime)
    assert deployment["engine_in_use"] == engine
    assert deployment["engine_reason"].startswith(ENGINES[engine] + " "), deployment[
        "engine_reason"
    ]  # its own measure, or auto's from the cache


@each_runtime
def test_text_classification_on_each_runtime_equals_torchs(
    runtimes: Runtimes, recipes: Path, engine: str
) -> None:
    on_runtime = runtimes.deploy(recipes, "t15_text_classification", "text-classification", engine)
    on_torch = runtimes.deploy(recipes, "t15_text_classification", "text-classification", "transformers")
    batched = runtimes.classify(on_runtime, TEXTS)
    assert np.abs(batched - runtimes.classify(on_torch, TEXTS)).max() <= TOLERANCE
    for index, text in enumerate(TEXTS):  # alone, unpadded: the scores it got in the padded batch
        assert np.abs(runtimes.classify(on_runtime, [text])[0] - batched[index]).max() <= TOLERANCE
    assert runtimes.deployment(on_runtime)["engine_in_use"] == engine


def test_a_later_load_of_the_same_artifact_reads_the_cached_export(runtimes: Runtimes, recipes: Path) -> None:
    """A second deployment of an artifact already exported loads from the cache: no new export (the
    file is the same one), and the reason says the decision was cached."""
    first = runtimes.deploy(recipes, "t03_feature_extraction/hf", "feature-extraction", "onnxruntime")
    runtimes.embed(first, TEXTS)
    exports = cached_exports(runtimes)
    assert exports
    artifact = runtimes.artifacts["t03_feature_extraction/hf"]
    body = {"model": "hf-again", "artifact_id": artifact, "engine": "onnxruntime"}
    created = runtimes.http.post("/v1/deployments", json=body, headers=bearer(runtimes.key))
    assert created.status_code == 201, created.text
    runtimes.deployments["hf-again"] = created.json()
    vectors = runtimes.embed("hf-again", TEXTS)
    assert np.abs(vectors - runtimes.embed(first, TEXTS)).max() <= TOLERANCE
    assert "cached decision" in runtimes.deployment("hf-again")["engine_reason"]
    assert cached_exports(runtimes) == exports  # nothing exported again


@each_runtime
def test_reranking_on_each_runtime_equals_torchs(runtimes: Runtimes, recipes: Path, engine: str) -> None:
    on_runtime = runtimes.deploy(recipes, "t16_text_ranking", "text-ranking", engine)
    on_torch = runtimes.deploy(recipes, "t16_text_ranking", "text-ranking", "transformers")
    body = {"query": "which runtime is faster?", "documents": TEXTS, "return_documents": False}

    def scores(model: str) -> list[float]:
        ranked = runtimes.post("/v1/rerank", model=model, **body)["results"]
        return [r["relevance_score"] for r in sorted(ranked, key=lambda r: r["index"])]

    assert np.abs(np.array(scores(on_runtime)) - np.array(scores(on_torch))).max() <= TOLERANCE
    for index, document in enumerate(TEXTS):  # alone, unpadded: the score it got beside the others
        alone = runtimes.post("/v1/rerank", model=on_runtime, **{**body, "documents": [document]})["results"]
        assert abs(alone[0]["relevance_score"] - scores(on_runtime)[index]) <= TOLERANCE
    assert runtimes.deployment(on_runtime)["engine_in_use"] == engine


@each_runtime
def test_question_answering_on_each_runtime_gives_torchs_spans_and_scores(
    runtimes: Runtimes, recipes: Path, engine: str
) -> None:
    on_runtime = runtimes.deploy(recipes, "t21_question_answering", "question-answering", engine)
    on_torch = runtimes.deploy(recipes, "t21_question_answering", "question-answering", "transformers")
    body = {
        "question": "where does sarah live",
        "context": "my name is sarah and i live in london",
        "top_k": 3,
    }
    ours = runtimes.post("/v1/question-answering/text", model=on_runtime, **body)
    theirs = runtimes.post("/v1/question-answering/text", model=on_torch, **body)
    assert [(a["start"], a["end"], a["answer"]) for a in ours] == [
        (a["start"], a["end"], a["answer"]) for a in theirs
    ]
    assert max(abs(a["score"] - b["score"]) for a, b in zip(ours, theirs, strict=True)) <= TOLERANCE
    assert runtimes.deployment(on_runtime)["engine_in_use"] == engine


def assert_equal_scores(ours: Any, theirs: Any, path: str = "") -> None:
    """The same answer, apart from scores within the tolerance: labels, words, spans and order equal."""
    if isinstance(ours, dict):
        assert ours.keys() == theirs.keys(), path
        for key in ours:
            assert_equal_scores(ours[key], theirs[key], f"{path}.{key}")
    elif isinstance(ours, list):
        assert len(ours) == len(theirs), path
        for index, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert_equal_scores(a, b, f"{path}[{index}]")
    elif isinstance(ours, float):
        assert abs(ours - theirs) <= TOLERANCE, (path, ours, theirs)
    else:
        assert ours == theirs, (path, ours, theirs)


PIPELINE_TASKS = [  # (recipe folder, pipeline, endpoint, request without model and inputs, inputs)
    (
        "t02_fill_mask",
        "fill-mask",
        "/v1/fill-mask",
        {"top_k": 3},
        ["paris is the [MASK] of france, said the long sentence that pads.", "hi [MASK]"],
    ),
    (
        "t01_token_classification",
        "token-classification",
        "/v1/classifications/token",
        {"aggregation_strategy": "simple"},
        ["my name is sarah and i live in london, far from here", "hi sarah"],
    ),
    (
        "t17_zero_shot_classification",
        "zero-shot-classification",
        "/v1/classifications/zero-shot/text",
        {"candidate_labels": ["technology", "sports", "food"], "multi_label": True},
        ["the battery lasts two days and charges quickly", "goal!"],
    ),
]


@pytest.mark.parametrize(("folder", "pipeline", "endpoint", "options", "inputs"), PIPELINE_TASKS)
@each_runtime
def test_pipeline_tasks_on_each_runtime_answer_as_on_torch_single_and_batched(
    runtimes: Runtimes,
    recipes: Path,
    folder: str,
    pipeline: str,
    endpoint: str,
    options: dict[str, Any],
    inputs: list[str],
    engine: str,
) -> None:
    on_runtime = runtimes.deploy(recipes, folder, pipeline, engine)
    on_torch = runtimes.deploy(recipes, folder, pipeline, "transformers")
    batched = runtimes.post(endpoint, model=on_runtime, inputs=inputs, **options)
    assert_equal_scores(batched, runtimes.post(endpoint, model=on_torch, inputs=inputs, **options))
    for index, text in enumerate(inputs):  # alone, unpadded: what it got in the padded batch
        single = runtimes.post(endpoint, model=on_runtime, inputs=[text], **options)
        assert_equal_scores(single[0], batched[index])
    assert runtimes.deployment(on_runtime)["engine_in_use"] == engine


@pytest.mark.parametrize(
    ("folder", "pipeline", "endpoint", "options"),
    [
        ("t18_image_classification", "image-classification", "/v1/classifications/image", {"top_k": 3}),
        ("t05_image_feature_extraction", "image-feature-extraction", "/v1/images/feature-extraction", {}),
    ],
)
@each_runtime
def test_image_encoders_on_each_runtime_answer_as_on_torch_single_and_batched(
    runtimes: Runtimes,
    recipes: Path,
    folder: str,
    pipeline: str,
    endpoint: str,
    options: dict[str, Any],
    engine: str,
) -> None:
    on_runtime = runtimes.deploy(recipes, folder, pipeline, engine)
    on_torch = runtimes.deploy(recipes, folder, pipeline, "transformers")
    images = [b64(png(seed=1)), b64(png(40, 40, seed=2))]
    batched = runtimes.post(endpoint, model=on_runtime, inputs=images, **options)
    assert_equal_scores(batched, runtimes.post(endpoint, model=on_torch, inputs=images, **options))
    for index, image in enumerate(images):
        single = runtimes.post(endpoint, model=on_runtime, inputs=[image], **options)
        assert_equal_scores(single[0], batched[index])
    deployment = runtimes.deployment(on_runtime)
    assert deployment["engine_in_use"] == engine
    assert deployment["engine_reason"].startswith(ENGINES[engine] + " "), deployment["engine_reason"]


def test_onnxruntime_for_a_task_it_does_not_serve_is_a_400_naming_engine(
    runtimes: Runtimes, recipes: Path
) -> None:
    folder = recipes / "t11_text_generation_chat"
    artifact = push_folder_sync(runtimes.http, runtimes.key, folder, "text-generation")
    body = {"model": "chat", "artifact_id": artifact, "engine": "onnxruntime"}
    refused = runtimes.http.post("/v1/deployments", json=body, headers=bearer(runtimes.key))
    assert_error(refused, 400, code="engine_not_supported", param="engine")


class DataDependent(torch.nn.Module):
    """An encoder the exporter cannot trace: its control flow depends on the values of its input."""

    def __init__(self) -> None:
        super().__init__()
        self.config = SimpleNamespace(hidden_size=4)
        self.embed = torch.nn.Embedding(512, 4)

    def forward(self, input_ids: torch.Tensor, **_: Any) -> Any:
        hidden = self.embed(input_ids)
        if int(input_ids.sum()) % 2:  # a Python branch on data: no graph holds it
            hidden = hidden * 2
        return SimpleNamespace(last_hidden_state=hidden)


def test_a_model_that_does_not_export_stays_on_torch_with_the_reason_and_the_decision_is_cached(
    recipes: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    from modelhost.engines.encoders import EncoderSlot, RuntimeUnusable, TextInputs, prepare

    tokenizer = AutoTokenizer.from_pretrained(recipes / "t03_feature_extraction" / "hf")
    replaced: list[torch.nn.Module] = []
    slot = EncoderSlot(DataDependent(), ("last_hidden_state",), TextInputs(tokenizer, 64), replaced.append)
    first = prepare(slot, tmp_path / "model", "auto", tmp_path / "cache")
    assert first.engine == "transformers" and "the model did not export" in first.reason
    assert replaced == []  # torch's model stays
    again = prepare(slot, tmp_path / "model", "auto", tmp_path / "cache")
    assert again.engine == "transformers" and again.reason.endswith(")") and "cached decision" in again.reason
    with pytest.raises(RuntimeUnusable, match="did not export"):
        prepare(slot, tmp_path / "model", "onnxruntime", tmp_path / "cache")


# ---------------------------------------------------------------- precision int8


def test_int8_embeddings_are_accepted_with_their_measured_quality(runtimes: Runtimes, recipes: Path) -> None:
    artifact = runtimes.artifact(recipes, "t03_feature_extraction/hf", "feature-extraction")
    created = runtimes.create("hf-int8", artifact, precision="int8")
    assert created.status_code == 201, created.text
    deployment = created.json()
    assert deployment["precision"] == "int8" and deployment["engine_in_use"] == "onnxruntime"
    quality = deployment["precision_quality"]
    assert quality.startswith("lowest cosine to float32 ") and "(needs >= 0.99)" in quality, quality
    assert float(quality.split()[4]) >= 0.99
    assert "precision int8 on ONNX Runtime" in deployment["engine_reason"]
    on_float = runtimes.deploy(recipes, "t03_feature_extraction/hf", "feature-extraction", "transformers")
    quantized, exact = runtimes.embed("hf-int8", TEXTS), runtimes.embed(on_float, TEXTS)
    cosines = (quantized * exact).sum(1) / np.linalg.norm(quantized, axis=1) / np.linalg.norm(exact, axis=1)
    assert cosines.min() >= 0.99
    listed = runtimes.http.get("/v1/deployments", headers=bearer(runtimes.key)).json()["data"]
    assert {"hf-int8"} <= {d["model"] for d in listed if d["precision"] == "int8"}


def test_int8_classification_keeps_the_top_labels_and_says_so(runtimes: Runtimes, recipes: Path) -> None:
    artifact = runtimes.artifact(recipes, "t15_text_classification", "text-classification")
    created = runtimes.create("cls-int8", artifact, precision="int8", engine="onnxruntime")
    assert created.status_code == 201, created.text
    assert created.json()["precision_quality"].startswith("the same top label as float32 on ")
    on_float = runtimes.deploy(recipes, "t15_text_classification", "text-classification", "transformers")
    quantized, exact = runtimes.classify("cls-int8", TEXTS), runtimes.classify(on_float, TEXTS)
    assert (quantized.argmax(1) == exact.argmax(1)).all()


def test_int8_is_refused_with_the_figures_when_the_probe_fails_and_nothing_is_left_deployed(
    runtimes: Runtimes, recipes: Path, tmp_path: Path
) -> None:
    """A classifier whose labels are near-ties (its rows differ by far less than int8's step): the
    quantized model's top label is chance, the probe fails, the creation is a 400 with the figures."""
    from transformers import AutoModelForSequenceClassification

    folder = tmp_path / "near-ties"
    shutil.copytree(recipes / "t15_text_classification", folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder)
    with torch.no_grad():
        head = model.classifier.weight
        generator = torch.Generator().manual_seed(0)
        head.copy_(head[0] + 1e-5 * torch.randn(head.shape, generator=generator))
        model.classifier.bias.zero_()
    model.save_pretrained(folder)
    artifact = push_folder_sync(runtimes.http, runtimes.key, folder, "text-classification")
    refused = runtimes.create("near-ties-int8", artifact, precision="int8")
    assert_error(refused, 400, code="precision_refused", param="precision")
    message = refused.json()["error"]["message"]
    assert "the same top label as float32 on " in message and "(needs >= 98%)" in message, message
    listed = runtimes.http.get("/v1/deployments", headers=bearer(runtimes.key)).json()["data"]
    assert "near-ties-int8" not in {d["model"] for d in listed}
    again = runtimes.create("near-ties-float", artifact)  # the artifact is free again, and float32 fine
    assert again.status_code == 201, again.text


@pytest.mark.parametrize(
    ("folder", "pipeline", "engine"),
    [
        ("t11_text_generation_chat", "text-generation", "auto"),
        ("t15_text_classification", "text-classification", "transformers"),
        ("t15_text_classification", "text-classification", "openvino"),
    ],
)
def test_int8_where_onnxruntime_does_not_run_is_a_400_naming_precision(
    runtimes: Runtimes, recipes: Path, folder: str, pipeline: str, engine: str
) -> None:
    artifact = runtimes.artifact(recipes, folder, pipeline)
    refused = runtimes.create(f"{pipeline}-int8", artifact, precision="int8", engine=engine)
    assert_error(refused, 400, code="precision_not_supported", param="precision")


# ---------------------------------------------------------------- where torch measured faster


def test_torch_takes_the_calls_larger_than_every_case_onnxruntime_won() -> None:
    from modelhost.engines.encoders import _torch_above

    # (speed-up, tokens per call): ONNX Runtime lost only the largest case, long text at batch 32
    measured = [(4.4, 10), (1.15, 320), (1.17, 170), (0.89, 5440)]
    assert _torch_above(measured) == int((320 * 5440) ** 0.5)
    assert _torch_above([(2.0, 10), (1.1, 5440)]) is None  # won everything
    assert _torch_above([(0.9, 10), (1.3, 5440)]) is None  # lost a small case: no size rule holds


def test_an_onnxruntime_model_hands_calls_over_its_bound_to_torch(recipes: Path, tmp_path: Path) -> None:
    from modelhost.engines.encoders import cache_folder, prepare, runtime_model
    from modelhost.tasks.feature_extraction import FeatureExtraction

    folder = recipes / "t03_feature_extraction" / "hf"
    handler = FeatureExtraction()
    slot = handler.encoder_slot(handler.load(folder, "cpu"))
    prepare(slot, folder, "onnxruntime", tmp_path)
    exported = cache_folder(tmp_path, folder, slot.outputs) / "model.onnx"
    bounded = runtime_model(slot, "onnxruntime", exported, torch_above=16)
    short, long = slot.inputs.encode(["hi"]), slot.inputs.encode(["a longer text " * 8] * 2)
    assert slot.inputs.size(short) <= 16 < slot.inputs.size(long)
    on_ort, on_torch = bounded(**short), bounded(**long)
    assert not hasattr(on_ort, "pooler_output")  # the export's output type: the hidden state only
    assert on_torch.pooler_output is not None  # the transformers model's own
    reference = slot.model(**long).last_hidden_state
    assert torch.equal(on_torch.last_hidden_state, reference)
