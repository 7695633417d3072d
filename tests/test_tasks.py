"""Task endpoints (api.md §4.1, §4.4–§4.11) through HTTP on the tiny recipe models, each pushed through
the real artifact path and served by real worker processes. Media inputs come as base64, data URIs,
URLs of a local HTTP server (allowed by `media_allow_networks`) and paths below the media root."""

from __future__ import annotations

import base64
import http.server
import io
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.conftest import make_settings
from tests.helpers import ADMIN_KEY, Gateway, assert_error, bearer, push_folder_sync
from tests.live import live_server


def same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """Equal labels in equal order with scores equal up to float noise (batch size changes the sums)."""
    return [r["label"] for r in a] == [r["label"] for r in b] and np.allclose(
        [r["score"] for r in a], [r["score"] for r in b], atol=1e-4
    )


def png(width: int = 64, height: int = 48, seed: int = 0) -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def wav(seconds: float = 1.0, rate: int = 16000) -> bytes:
    import soundfile

    t = np.arange(int(seconds * rate)) / rate
    buffer = io.BytesIO()
    soundfile.write(buffer, (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), rate, format="WAV")
    return buffer.getvalue()


def mp4(path: Path, frames: int = 16) -> Path:
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=8)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(frames):
            image = np.full((48, 64, 3), (i * 15) % 255, dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, recipes: Path) -> Iterator[Gateway]:
    root = tmp_path_factory.mktemp("tasks")
    media_root, files = root / "media", root / "files"
    media_root.mkdir()
    files.mkdir()
    (files / "image.png").write_bytes(png())
    mp4(media_root / "clip.mp4")
    mp4(files / "clip.mp4")

    handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(files))  # noqa: E731
    fileserver = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=fileserver.serve_forever, daemon=True).start()
    settings = make_settings(
        root,
        f"sqlite:///{root / 'db.sqlite'}",
        media_root=media_root,
        media_allow_networks=["127.0.0.0/8"],
        worker_threads=1,
    )
    with live_server(settings) as url:
        client = httpx.Client(base_url=url, timeout=120)
        created = client.post("/v1/admin/accounts", json={"name": "tasks"}, headers=bearer(ADMIN_KEY))
        files_url = f"http://127.0.0.1:{fileserver.server_address[1]}"
        yield Gateway(client, created.json()["api_key"], recipes, media_root, files_url)
        client.close()
    fileserver.shutdown()


# ---------------------------------------------------------------- token classification (§4.1)


def test_token_classification_answers_entities_per_token_and_a_list_per_input(gw: Gateway) -> None:
    model = gw.deploy("t01_token_classification", "", "token-classification")
    text = "my name is sarah and i live in london"
    single = gw.ok("/v1/classifications/token", model=model, inputs=text)
    assert single and set(single[0]) >= {"word", "score", "entity", "index", "start", "end"}
    assert all(text[e["start"] : e["end"]] == e["word"] for e in single if not e["word"].startswith("##"))
    several = gw.ok("/v1/classifications/token", model=model, inputs=[text, "hello world"])
    assert len(several) == 2 and several[0] == single


def test_token_classification_aggregation_groups_tokens_into_entities(gw: Gateway) -> None:
    model = gw.deploy("t01_token_classification", "", "token-classification")
    text = "my name is sarah and i live in london"
    raw = gw.ok("/v1/classifications/token", model=model, inputs=text)
    grouped = gw.ok("/v1/classifications/token", model=model, inputs=text, aggregation_strategy="simple")
    assert grouped and all(g["entity"] == g["entity_group"] and "index" not in g for g in grouped)
    assert len(grouped) <= len(raw)
    bad = gw.call("/v1/classifications/token", model=model, inputs=text, aggregation_strategy="best")
    assert_error(bad, 400, param="aggregation_strategy")


# ---------------------------------------------------------------- fill-mask (§4.8)


def test_fill_mask_top_k_and_targets(gw: Gateway) -> None:
    model = gw.deploy("t02_fill_mask", "", "fill-mask")
    text = "paris is the [MASK] of france"
    three = gw.ok("/v1/fill-mask", model=model, inputs=text, top_k=3)
    assert len(three) == 3 and set(three[0]) == {"sequence", "score", "token", "token_str"}
    assert three[0]["sequence"] == text.replace("[MASK]", three[0]["token_str"])
    assert [len(r) for r in gw.ok("/v1/fill-mask", model=model, inputs=[text, text], top_k=2)] == [2, 2]
    targeted = gw.ok("/v1/fill-mask", model=model, inputs=text, targets=["cat", "dog"])
    assert sorted(r["token_str"] for r in targeted) == ["cat", "dog"]


def test_fill_mask_without_the_mask_token_is_refused(gw: Gateway) -> None:
    model = gw.deploy("t02_fill_mask", "", "fill-mask")
    assert_error(gw.call("/v1/fill-mask", model=model, inputs="no mask here"), 400, param="inputs")
    both = gw.call("/v1/fill-mask", model=model, inputs=["a [MASK]", "none"])
    assert_error(both, 400, param="inputs[1]")


# ---------------------------------------------------------------- zero-shot image (§4.5)


def test_zero_shot_image_scores_every_candidate_label(gw: Gateway) -> None:
    model = gw.deploy("t04_zero_shot_image_classification", "", "zero-shot-image-classification")
    labels = ["cat", "dog", "car"]
    result = gw.ok(
        "/v1/classifications/zero-shot/image", model=model, image=b64(png()), candidate_labels=labels
    )
    assert sorted(r["label"] for r in result) == sorted(labels)
    assert abs(sum(r["score"] for r in result) - 1) < 1e-4
    assert result == sorted(result, key=lambda r: -r["score"])
    url = f"{gw.files_url}/image.png"
    several = gw.ok(
        "/v1/classifications/zero-shot/image", model=model, image=[url, b64(png())], candidate_labels=labels
    )
    assert len(several) == 2 and same(several[1], result)  # the URL image and the inline one
    templated = gw.ok(
        "/v1/classifications/zero-shot/image",
        model=model,
        image=f"data:image/png;base64,{b64(png())}",
        candidate_labels=labels,
        hypothesis_template="a blurry photo of {}",
    )
    assert [r["score"] for r in templated] != [r["score"] for r in result]


def test_zero_shot_image_refuses_bad_templates_labels_and_images(gw: Gateway) -> None:
    model = gw.deploy("t04_zero_shot_image_classification", "", "zero-shot-image-classification")
    path = "/v1/classifications/zero-shot/image"
    image = b64(png())
    assert_error(gw.call(path, model=model, image=image, candidate_labels=[]), 400, param="candidate_labels")
    no_slot = gw.call(path, model=model, image=image, candidate_labels=["a"], hypothesis_template="no slot")
    assert_error(no_slot, 400, param="hypothesis_template")
    assert_error(gw.call(path, model=model, image="not base64!", candidate_labels=["a"]), 400, param="image")
    assert_error(gw.call(path, model=model, image=b64(b"text"), candidate_labels=["a"]), 400, param="image")
    private = gw.call(path, model=model, image="http://10.0.0.1/cat.png", candidate_labels=["a"])
    assert_error(private, 400, param="image")
    assert_error(gw.call(path, model=model, image=["x", "file:///etc/passwd"], candidate_labels=["a"]), 400)


def raw(gw: Gateway, path: str, data: bytes, content_type: str, **params: Any) -> httpx.Response:
    """The file itself as the body; the other parameters in the query string."""
    headers = {**bearer(gw.key), "Content-Type": content_type}
    return gw.http.post(path, content=data, params=params, headers=headers, timeout=120)


def test_zero_shot_image_takes_the_raw_image_body_with_parameters_in_the_query(gw: Gateway) -> None:
    model = gw.deploy("t04_zero_shot_image_classification", "", "zero-shot-image-classification")
    path = "/v1/classifications/zero-shot/image"
    labels = ["cat", "dog", "car"]
    as_json = gw.ok(path, model=model, image=b64(png()), candidate_labels=labels)
    response = raw(gw, path, png(), "image/png", model=model, candidate_labels=labels)
    assert response.status_code == 200, response.text
    assert same(response.json(), as_json)
    one_label = raw(gw, path, png(), "image/png", model=model, candidate_labels="cat")
    assert [r["label"] for r in one_label.json()] == ["cat"]  # a list field given once: a list of one


def test_raw_image_body_errors_name_the_query_parameter_or_the_image(gw: Gateway) -> None:
    model = gw.deploy("t04_zero_shot_image_classification", "", "zero-shot-image-classification")
    path = "/v1/classifications/zero-shot/image"
    assert_error(raw(gw, path, png(), "image/png", model=model), 400, param="candidate_labels")
    unknown = raw(gw, path, png(), "image/png", model=model, candidate_labels="a", colour="red")
    assert_error(unknown, 400, param="colour")
    twice = raw(gw, path, png(), "image/png", model=model, candidate_labels="a", image="x")
    assert_error(twice, 400, param="image")
    not_an_image = raw(gw, path, b"plain text", "image/png", model=model, candidate_labels="a")
    assert_error(not_an_image, 400, code="invalid_media", param="image")
    feature = raw(gw, "/v1/images/segmentation", png(), "image/png", model=model, threshold="high")
    assert_error(feature, 400, param="threshold")


def test_raw_image_body_converts_numbers_and_json_objects_from_the_query(gw: Gateway) -> None:
    model = gw.deploy("t08_image_to_text", "vit_gpt2", "image-to-text")
    path = "/v1/images/to-text"
    as_json = gw.ok(path, model=model, inputs=b64(png()), generate_kwargs={"max_new_tokens": 3})
    response = raw(gw, path, png(), "image/png", model=model, generate_kwargs='{"max_new_tokens": 3}')
    assert response.status_code == 200, response.text
    assert response.json() == as_json
    bad = raw(gw, path, png(), "image/png", model=model, generate_kwargs='{"eval": 1}')
    assert_error(bad, 400, param="generate_kwargs.eval")


def test_the_docs_offer_the_raw_file_as_an_alternative_body(gw: Gateway) -> None:
    paths = gw.http.get("/openapi.json").json()["paths"]
    content = paths["/v1/classifications/zero-shot/image"]["post"]["requestBody"]["content"]
    assert set(content) == {"application/json", "image/*"}
    assert "audio/*" in paths["/v1/classifications/audio"]["post"]["requestBody"]["content"]


# ---------------------------------------------------------------- image feature extraction (§4.11)


def test_image_feature_extraction_gives_one_vector_per_image(gw: Gateway) -> None:
    model = gw.deploy("t05_image_feature_extraction", "", "image-feature-extraction")
    vector = gw.ok("/v1/images/feature-extraction", model=model, inputs=b64(png()))
    assert len(vector) == 32 and all(isinstance(x, float) for x in vector)
    pair = gw.ok("/v1/images/feature-extraction", model=model, inputs=[b64(png()), b64(png(seed=1))])
    assert np.allclose(pair[0], vector, atol=1e-5) and not np.allclose(pair[1], vector)


# ---------------------------------------------------------------- segmentation (§4.4)


@pytest.mark.parametrize(
    ("sub", "subtask"),
    [
        ("segformer", "semantic"),
        ("mask2former", "panoptic"),
        ("mask2former", "instance"),
        ("detr", "panoptic"),
    ],
)
def test_segmentation_answers_png_masks_with_scores(gw: Gateway, sub: str, subtask: str) -> None:
    model = gw.deploy("t06_image_segmentation", sub, "image-segmentation")
    body = {
        "model": model,
        "inputs": b64(png()),
        "subtask": subtask,
        "threshold": 0.0,
        "mask_threshold": 0.0,
        "overlap_mask_area_threshold": 0.0,
    }
    result = gw.ok("/v1/images/segmentation", **body)
    assert result["masks"] and len(result["masks"]) == len(result["scores"]) == len(result["labels"])
    from PIL import Image

    mask = Image.open(io.BytesIO(base64.b64decode(result["masks"][0])))
    assert mask.size == (64, 48) and mask.mode == "L"
    several = gw.ok("/v1/images/segmentation", **{**body, "inputs": [b64(png()), b64(png())]})
    assert isinstance(several, list) and len(several) == 2


def test_segmentation_threshold_filters_segments_and_unknown_subtasks_are_refused(gw: Gateway) -> None:
    model = gw.deploy("t06_image_segmentation", "mask2former", "image-segmentation")
    base = {
        "model": model,
        "inputs": b64(png()),
        "subtask": "instance",
        "mask_threshold": 0.0,
        "overlap_mask_area_threshold": 0.0,
    }
    everything = gw.ok("/v1/images/segmentation", **base, threshold=0.0)
    nothing = gw.ok("/v1/images/segmentation", **base, threshold=1.0)
    assert len(everything["masks"]) > len(nothing["masks"]) == 0
    assert_error(gw.call("/v1/images/segmentation", **{**base, "subtask": "amodal"}), 400, param="subtask")


# ---------------------------------------------------------------- visual question answering (§4.7)


def test_visual_question_answering_classifier_gives_top_k_answers(gw: Gateway) -> None:
    model = gw.deploy("t07_visual_question_answering", "vilt", "visual-question-answering")
    image = b64(png())
    two = gw.ok(
        "/v1/question-answering/visual", model=model, image=image, question="what is in the picture?", top_k=2
    )
    assert len(two) == 2 and set(two[0]) == {"label", "score"} and two[0]["score"] >= two[1]["score"]
    per_question = gw.ok(
        "/v1/question-answering/visual", model=model, image=image, question=["what?", "how many?"], top_k=1
    )
    assert len(per_question) == 2 and all(len(r) == 1 for r in per_question)
    mismatch = gw.call("/v1/question-answering/visual", model=model, image=[image] * 3, question=["a", "b"])
    assert_error(mismatch, 400, param="question")


def test_visual_question_answering_generative_model_answers_with_its_probability(gw: Gateway) -> None:
    model = gw.deploy("t07_visual_question_answering", "llava", "visual-question-answering")
    [answer] = gw.ok(
        "/v1/question-answering/visual",
        model=model,
        image=b64(png(32, 32)),
        question="what is in the picture?",
    )
    # random weights: the answer is noise and its probability may underflow to 0
    assert (
        set(answer) == {"label", "score"} and isinstance(answer["label"], str) and 0 <= answer["score"] <= 1
    )


# ---------------------------------------------------------------- image to text (§4.9)


@pytest.mark.parametrize("sub", ["blip", "vit_gpt2"])
def test_image_to_text_captions_with_max_new_tokens_and_generate_kwargs(gw: Gateway, sub: str) -> None:
    model = gw.deploy("t08_image_to_text", sub, "image-to-text")
    [caption] = gw.ok(
        "/v1/images/to-text",
        model=model,
        inputs=b64(png(32, 32)),
        max_new_tokens=4,
        generate_kwargs={"min_new_tokens": 4},
    )
    assert set(caption) == {"generated_text"} and caption["generated_text"]
    longer = gw.ok(
        "/v1/images/to-text",
        model=model,
        inputs=[b64(png(32, 32))],
        max_new_tokens=8,
        generate_kwargs={"min_new_tokens": 8},
    )
    assert len(longer) == 1 and len(longer[0][0]["generated_text"]) > len(caption["generated_text"])
    refused = gw.call("/v1/images/to-text", model=model, inputs=b64(png()), generate_kwargs={"streamer": "x"})
    assert_error(refused, 400, param="generate_kwargs.streamer")


# ---------------------------------------------------------------- audio classification (§4.10)


def test_audio_classification_accepts_arrays_files_and_descriptors(gw: Gateway) -> None:
    model = gw.deploy("t09_audio_classification", "", "audio-classification")
    path = "/v1/classifications/audio"
    file = gw.ok(path, model=model, inputs=b64(wav()), top_k=2)
    assert len(file) == 2 and set(file[0]) == {"label", "score"}
    samples = (0.3 * np.sin(2 * np.pi * 440 * np.arange(16000) / 16000)).astype(np.float32)
    array = gw.ok(path, model=model, inputs=samples.tolist(), top_k=2)
    described = gw.ok(path, model=model, inputs={"array": samples.tolist(), "sampling_rate": 16000}, top_k=2)
    assert same(array, described) and [r["label"] for r in array] == [r["label"] for r in file]
    resampled = gw.ok(path, model=model, inputs=b64(wav(rate=8000)), top_k=2)
    assert [r["label"] for r in resampled] == [r["label"] for r in file]
    several = gw.ok(path, model=model, inputs=[b64(wav()), {"raw": samples.tolist(), "sampling_rate": 16000}])
    assert len(several) == 2


def test_audio_classification_takes_the_raw_audio_body(gw: Gateway) -> None:
    model = gw.deploy("t09_audio_classification", "", "audio-classification")
    as_json = gw.ok("/v1/classifications/audio", model=model, inputs=b64(wav()), top_k=2)
    response = raw(gw, "/v1/classifications/audio", wav(), "audio/wav", model=model, top_k=2)
    assert response.status_code == 200, response.text
    assert len(response.json()) == 2 and same(response.json(), as_json)


def test_audio_classification_function_to_apply_and_top_k(gw: Gateway) -> None:
    model = gw.deploy("t09_audio_classification", "", "audio-classification")
    path = "/v1/classifications/audio"
    softmax = gw.ok(path, model=model, inputs=b64(wav()), top_k=4)
    assert abs(sum(r["score"] for r in softmax) - 1) < 1e-4
    raw = gw.ok(path, model=model, inputs=b64(wav()), top_k=4, function_to_apply="none")
    assert [r["label"] for r in raw] == [r["label"] for r in softmax] and raw != softmax
    assert len(gw.ok(path, model=model, inputs=b64(wav()), top_k=1)) == 1
    assert_error(gw.call(path, model=model, inputs=b64(b"RIFF garbage")), 400, param="inputs")
    assert_error(
        gw.call(path, model=model, inputs={"array": [0.1], "raw": [0.1], "sampling_rate": 8000}), 400
    )


# ---------------------------------------------------------------- video classification (§4.6)


def test_video_classification_from_a_url_and_a_local_path(gw: Gateway) -> None:
    model = gw.deploy("t10_video_classification", "", "video-classification")
    path = "/v1/classifications/video"
    by_url = gw.ok(path, model=model, inputs=f"{gw.files_url}/clip.mp4", top_k=2)
    assert len(by_url) == 2 and set(by_url[0]) == {"label", "score"}
    by_path = gw.ok(path, model=model, inputs="clip.mp4", top_k=2)
    assert same(by_path, by_url)  # the same file
    several = gw.ok(path, model=model, inputs=["clip.mp4", f"{gw.files_url}/clip.mp4"], top_k=1)
    assert len(several) == 2
    sigmoid = gw.ok(path, model=model, inputs="clip.mp4", top_k=3, function_to_apply="sigmoid")
    assert sum(r["score"] for r in sigmoid) > 1 - 1e-6 or all(0 < r["score"] < 1 for r in sigmoid)
    strided = gw.ok(path, model=model, inputs="clip.mp4", top_k=3, frame_sampling_rate=4)
    assert strided != gw.ok(path, model=model, inputs="clip.mp4", top_k=3)


def test_video_frame_count_the_model_cannot_take_is_a_400_not_a_failed_batch(gw: Gateway) -> None:
    model = gw.deploy("t10_video_classification", "", "video-classification")
    wrong = gw.call("/v1/classifications/video", model=model, inputs="clip.mp4", num_frames=3)
    assert_error(wrong, 400, param="num_frames")
    assert len(gw.ok("/v1/classifications/video", model=model, inputs="clip.mp4", top_k=1)) == 1


def test_video_paths_outside_the_media_root_are_refused(gw: Gateway) -> None:
    model = gw.deploy("t10_video_classification", "", "video-classification")
    for outside in ("/etc/passwd", "../files/clip.mp4"):
        assert_error(gw.call("/v1/classifications/video", model=model, inputs=outside), 400, param="inputs")


# ---------------------------------------------------------------- across endpoints


# ---------------------------------------------------------------- text classification

SENTENCES = ["what a wonderful film", "the plot was dull", "an actor", "paris is in france"]


def test_text_classification_scores_equal_the_transformers_pipelines(gw: Gateway) -> None:
    from transformers import pipeline

    model = gw.deploy("t15_text_classification", "", "text-classification")
    reference = pipeline("text-classification", model=str(gw.recipes / "t15_text_classification"), top_k=None)
    served = gw.ok("/v1/classifications/text", model=model, inputs=SENTENCES, top_k=None)
    assert len(served) == len(SENTENCES)
    for answer, expected in zip(served, reference(SENTENCES), strict=True):
        assert same(answer, expected), (answer, expected)
        assert {r["label"] for r in answer} == {"negative", "neutral", "positive"}


def test_text_classification_gives_the_best_label_of_one_text_and_top_k_of_a_list(gw: Gateway) -> None:
    model = gw.deploy("t15_text_classification", "", "text-classification")
    every = gw.ok("/v1/classifications/text", model=model, inputs=SENTENCES[0], top_k=None)
    assert gw.ok("/v1/classifications/text", model=model, inputs=SENTENCES[0]) == every[:1]
    two = gw.ok("/v1/classifications/text", model=model, inputs=SENTENCES[:2], top_k=2)
    assert [len(labels) for labels in two] == [2, 2] and same(two[0], every[:2])
    raw = gw.ok(
        "/v1/classifications/text", model=model, inputs=SENTENCES[0], top_k=None, function_to_apply="none"
    )
    assert not np.isclose(sum(r["score"] for r in raw), 1.0)  # logits, not probabilities
    assert np.isclose(sum(r["score"] for r in every), 1.0)


def test_text_pairs_are_classified_as_pairs(gw: Gateway) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = gw.deploy("t15_text_classification", "", "text-classification")
    folder = str(gw.recipes / "t15_text_classification")
    pair = {"text": "a man plays", "text_pair": "someone is playing"}
    served = gw.ok("/v1/classifications/text", model=model, inputs=[pair, "a man plays"], top_k=None)
    tokenizer, classifier = (
        AutoTokenizer.from_pretrained(folder),
        AutoModelForSequenceClassification.from_pretrained(folder),
    )
    with torch.inference_mode():
        logits = classifier(**tokenizer("a man plays", "someone is playing", return_tensors="pt")).logits[0]
        alone = classifier(**tokenizer("a man plays", return_tensors="pt")).logits[0]
    labels = classifier.config.id2label.values()
    for answer, reference in ((served[0], logits), (served[1], alone)):
        expected = dict(zip(labels, reference.softmax(-1).tolist(), strict=True))
        assert {r["label"]: r["score"] for r in answer} == pytest.approx(expected, abs=2e-6)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"inputs": []}, "inputs"),
        ({"inputs": ""}, "inputs"),
        ({"inputs": {"text": "a"}}, "inputs"),
        ({"inputs": "a", "top_k": 0}, "top_k"),
        ({"inputs": "a", "function_to_apply": "tanh"}, "function_to_apply"),
    ],
)
def test_bad_text_classification_requests_answer_400_naming_the_field(
    gw: Gateway, body: dict[str, Any], param: str
) -> None:
    model = gw.deploy("t15_text_classification", "", "text-classification")
    response = gw.call("/v1/classifications/text", model=model, **body)
    assert_error(response, 400)
    assert response.json()["error"]["param"].startswith(param)


# ---------------------------------------------------------------- zero-shot text classification

LABELS = ["technology", "sports", "politics"]


@pytest.mark.parametrize("multi_label", [False, True])
def test_zero_shot_text_scores_equal_the_transformers_pipelines(gw: Gateway, multi_label: bool) -> None:
    from transformers import pipeline

    model = gw.deploy("t17_zero_shot_classification", "", "zero-shot-classification")
    reference = pipeline("zero-shot-classification", model=str(gw.recipes / "t17_zero_shot_classification"))
    template = "The topic is {}."
    served = gw.ok(
        "/v1/classifications/zero-shot/text",
        model=model,
        inputs=SENTENCES[:2],
        candidate_labels=LABELS,
        hypothesis_template=template,
        multi_label=multi_label,
    )
    expected = reference(
        SENTENCES[:2], candidate_labels=LABELS, hypothesis_template=template, multi_label=multi_label
    )
    for answer, wanted in zip(served, expected, strict=True):
        assert answer["sequence"] == wanted["sequence"] and answer["labels"] == wanted["labels"]
        np.testing.assert_allclose(answer["scores"], wanted["scores"], atol=1e-5)
    if not multi_label:
        assert all(np.isclose(sum(a["scores"]), 1.0) for a in served)
    one = gw.ok(
        "/v1/classifications/zero-shot/text", model=model, inputs=SENTENCES[0], candidate_labels=LABELS
    )
    assert one["sequence"] == SENTENCES[0] and sorted(one["labels"]) == sorted(LABELS)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"inputs": "a", "candidate_labels": []}, "candidate_labels"),
        ({"inputs": "a"}, "candidate_labels"),
        (
            {"inputs": "a", "candidate_labels": ["x"], "hypothesis_template": "no placeholder"},
            "hypothesis_template",
        ),
        ({"inputs": [], "candidate_labels": ["x"]}, "inputs"),
    ],
)
def test_bad_zero_shot_text_requests_answer_400_naming_the_field(
    gw: Gateway, body: dict[str, Any], param: str
) -> None:
    model = gw.deploy("t17_zero_shot_classification", "", "zero-shot-classification")
    response = gw.call("/v1/classifications/zero-shot/text", model=model, **body)
    assert_error(response, 400)
    assert response.json()["error"]["param"].startswith(param)


def test_a_classifier_without_an_entailment_label_fails_to_load_with_the_reason(gw: Gateway) -> None:
    """The sentiment model is a sequence classifier too (inspection accepts it), but not an NLI one."""
    model = f"not-nli-{len(gw.deployed)}"
    artifact_id = push_folder_sync(
        gw.http, gw.key, gw.recipes / "t15_text_classification", "zero-shot-classification"
    )
    created = gw.http.post(
        "/v1/deployments",
        json={"model": model, "artifact_id": artifact_id, "readiness": "cold"},
        headers=bearer(gw.key),
    )
    assert created.status_code == 201, created.text
    answer = gw.call("/v1/classifications/zero-shot/text", model=model, inputs="a", candidate_labels=["x"])
    assert_error(answer, 503, "deployment_unavailable")
    assert "entailment" in answer.json()["error"]["message"]


# ---------------------------------------------------------------- image classification, object detection


def test_image_classification_equals_the_transformers_pipeline_as_json_or_raw_body(gw: Gateway) -> None:
    from PIL import Image
    from transformers import pipeline

    model = gw.deploy("t18_image_classification", "", "image-classification")
    images = [png(seed=1), png(40, 40, seed=2)]
    reference = pipeline("image-classification", model=str(gw.recipes / "t18_image_classification"))
    expected = [reference(Image.open(io.BytesIO(d)), top_k=3) for d in images]
    served = gw.ok("/v1/classifications/image", model=model, inputs=[b64(d) for d in images], top_k=3)
    assert all(same(a, e) for a, e in zip(served, expected, strict=True)), (served, expected)
    raw = gw.http.post(
        "/v1/classifications/image",
        params={"model": model, "top_k": 3},
        content=images[0],
        headers={**bearer(gw.key), "Content-Type": "image/png"},
        timeout=120,
    )
    assert raw.status_code == 200, raw.text
    assert same(raw.json(), expected[0])
    assert len(gw.ok("/v1/classifications/image", model=model, inputs=b64(images[0]))) == 3  # ≤ labels


def test_object_detection_equals_the_transformers_pipeline_with_boxes_inside_the_image(gw: Gateway) -> None:
    from PIL import Image
    from transformers import pipeline

    model = gw.deploy("t19_object_detection", "", "object-detection")
    picture = png(64, 48, seed=3)
    reference = pipeline("object-detection", model=str(gw.recipes / "t19_object_detection"))
    expected = reference(Image.open(io.BytesIO(picture)), threshold=0.0)
    served = gw.ok("/v1/images/object-detection", model=model, inputs=b64(picture), threshold=0.0)
    assert len(served) == len(expected) > 0
    for answer, wanted in zip(served, expected, strict=True):
        assert answer["label"] == wanted["label"] and answer["box"] == wanted["box"]
        assert answer["score"] == pytest.approx(wanted["score"], abs=1e-5)
        box = answer["box"]
        assert 0 <= box["xmin"] <= box["xmax"] <= 64 and 0 <= box["ymin"] <= box["ymax"] <= 48
    none = gw.ok("/v1/images/object-detection", model=model, inputs=[b64(picture)], threshold=1.0)
    assert none == [[]]


def test_depth_is_the_transformers_pipelines_map_as_a_png_and_values_of_the_images_size(gw: Gateway) -> None:
    from PIL import Image
    from transformers import pipeline

    model = gw.deploy("t20_depth_estimation", "", "depth-estimation")
    picture = png(64, 48, seed=4)
    expected = pipeline("depth-estimation", model=str(gw.recipes / "t20_depth_estimation"))(
        Image.open(io.BytesIO(picture))
    )
    served = gw.ok("/v1/images/depth-estimation", model=model, inputs=b64(picture))
    depth = Image.open(io.BytesIO(base64.b64decode(served["depth"])))
    assert depth.size == (64, 48) and depth.mode == "L"
    assert np.array_equal(np.asarray(depth), np.asarray(expected["depth"]))
    values = np.asarray(served["predicted_depth"])
    assert values.shape == (48, 64)
    np.testing.assert_allclose(values, expected["predicted_depth"].numpy(), rtol=1e-4, atol=1e-5)
    lean = gw.ok(
        "/v1/images/depth-estimation", model=model, inputs=[b64(picture)], return_predicted_depth=False
    )
    assert lean[0]["depth"] == served["depth"] and lean[0].get("predicted_depth") is None


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/classifications/image", {"inputs": "bm90IGFuIGltYWdl"}, "inputs"),
        ("/v1/classifications/image", {"inputs": [], "top_k": 1}, "inputs"),
        ("/v1/images/object-detection", {"inputs": "bm90IGFuIGltYWdl"}, "inputs"),
        ("/v1/images/object-detection", {"inputs": "aGVsbG8=", "threshold": 2}, "threshold"),
        ("/v1/images/depth-estimation", {"inputs": "bm90IGFuIGltYWdl"}, "inputs"),
    ],
)
def test_bad_image_task_requests_answer_400_naming_the_field(
    gw: Gateway, path: str, body: dict[str, Any], param: str
) -> None:
    recipe, task = {
        "/v1/classifications/image": ("t18_image_classification", "image-classification"),
        "/v1/images/object-detection": ("t19_object_detection", "object-detection"),
        "/v1/images/depth-estimation": ("t20_depth_estimation", "depth-estimation"),
    }[path]
    response = gw.call(path, model=gw.deploy(recipe, "", task), **body)
    assert_error(response, 400)
    assert response.json()["error"]["param"].startswith(param)


# ---------------------------------------------------------------- extractive question answering

CONTEXT = "my name is sarah and i live in london with my dog"


def brute_force_spans(
    folder: Path, question: str, context: str, max_len: int
) -> list[tuple[float, int, int]]:
    """Every span of the context's tokens scored as softmax(start) × softmax(end) over the context's
    tokens and the first token, by plain loops: what the endpoint must find, computed another way."""
    import torch
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForQuestionAnswering.from_pretrained(str(folder)).eval()
    encoded = tokenizer(question, context, return_offsets_mapping=True, return_tensors="pt")
    offsets = encoded.pop("offset_mapping")[0].tolist()
    with torch.inference_mode():
        out = model(**encoded)
    kept = [i for i, s in enumerate(encoded.sequence_ids(0)) if s == 1 or i == 0]
    start = dict(zip(kept, out.start_logits[0, kept].softmax(-1).tolist(), strict=True))
    end = dict(zip(kept, out.end_logits[0, kept].softmax(-1).tolist(), strict=True))
    tokens = [i for i in kept if i != 0]
    return sorted(
        (
            (start[a] * end[b], offsets[a][0], offsets[b][1])
            for a in tokens
            for b in tokens
            if 0 <= b - a < max_len
        ),
        reverse=True,
    )


def test_question_answering_finds_the_best_spans_of_the_context(gw: Gateway) -> None:
    model = gw.deploy("t21_question_answering", "", "question-answering")
    question = "where does sarah live"
    spans = brute_force_spans(gw.recipes / "t21_question_answering", question, CONTEXT, 4)
    answers = gw.ok(
        "/v1/question-answering/text",
        model=model,
        question=question,
        context=CONTEXT,
        top_k=3,
        max_answer_len=4,
    )
    assert [(a["start"], a["end"]) for a in answers] == [(s, e) for _, s, e in spans[:3]]
    for answer, (score, start, end) in zip(answers, spans, strict=False):
        assert answer["answer"] == CONTEXT[start:end] and answer["score"] == pytest.approx(score, rel=1e-4)


def test_question_answering_pairs_lists_and_answers_a_list_per_pair(gw: Gateway) -> None:
    model = gw.deploy("t21_question_answering", "", "question-answering")
    questions = ["where does sarah live", "who is sarah"]
    one = [gw.ok("/v1/question-answering/text", model=model, question=q, context=CONTEXT) for q in questions]
    both = gw.ok("/v1/question-answering/text", model=model, question=questions, context=[CONTEXT, CONTEXT])
    broadcast = gw.ok("/v1/question-answering/text", model=model, question=questions, context=CONTEXT)
    assert [[a["answer"] for a in answers] for answers in both] == [[a["answer"] for a in x] for x in one]
    assert [[a["answer"] for a in answers] for answers in broadcast] == [
        [a["answer"] for a in x] for x in one
    ]
    assert all(len(answers) == 1 for answers in both)


def test_the_impossible_answer_competes_as_an_empty_span_when_asked(gw: Gateway) -> None:
    model = gw.deploy("t21_question_answering", "", "question-answering")
    body = {"model": model, "question": "who", "context": CONTEXT, "top_k": 100, "max_answer_len": 20}
    spans = gw.ok("/v1/question-answering/text", **body)
    with_null = gw.ok("/v1/question-answering/text", **body, handle_impossible_answer=True)
    empty = [a for a in with_null if a["answer"] == ""]
    assert not any(a["answer"] == "" for a in spans)
    assert len(empty) == 1 and (empty[0]["start"], empty[0]["end"]) == (0, 0) and 0 < empty[0]["score"] < 1
    assert [a["score"] for a in with_null] == sorted((a["score"] for a in with_null), reverse=True)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"question": ["a", "b"], "context": ["c", "d", "e"]}, "body"),
        ({"question": "", "context": "c"}, "question"),
        ({"question": "a"}, "context"),
        ({"question": "a", "context": "c", "top_k": 0}, "top_k"),
        ({"question": "a", "context": "c", "max_answer_len": 0}, "max_answer_len"),
        ({"question": "where " * 80, "context": CONTEXT}, "question"),  # fills the model's 64 tokens
    ],
)
def test_bad_question_answering_requests_answer_400(gw: Gateway, body: dict[str, Any], param: str) -> None:
    model = gw.deploy("t21_question_answering", "", "question-answering")
    response = gw.call("/v1/question-answering/text", model=model, **body)
    assert_error(response, 400)
    if param != "body":
        assert response.json()["error"]["param"].startswith(param)


# ---------------------------------------------------------------- reranking

QUERY = "what is the capital of france"
DOCUMENTS = ["paris is the capital of france", "berlin is in germany", "the film was dull", "a cat"]


def test_rerank_equals_sentence_transformers_cross_encoder_rank(gw: Gateway) -> None:
    from sentence_transformers import CrossEncoder

    model = gw.deploy("t16_text_ranking", "", "text-ranking")
    expected = CrossEncoder(str(gw.recipes / "t16_text_ranking"), device="cpu").rank(QUERY, DOCUMENTS)
    answer = gw.ok("/v1/rerank", model=model, query=QUERY, documents=DOCUMENTS)
    results = answer["results"]
    assert [r["index"] for r in results] == [e["corpus_id"] for e in expected]
    np.testing.assert_allclose(
        [r["relevance_score"] for r in results], [e["score"] for e in expected], atol=1e-5
    )
    assert all("document" not in r for r in results)
    assert answer["model"] == model and answer["usage"]["total_tokens"] > 0
    assert answer["meta"]["billed_units"]["search_units"] == 1


def test_rerank_top_n_and_documents_as_objects_with_their_text_returned(gw: Gateway) -> None:
    model = gw.deploy("t16_text_ranking", "", "text-ranking")
    every = gw.ok("/rerank", model=model, query=QUERY, documents=DOCUMENTS)["results"]
    best = gw.ok(
        "/v1/rerank",
        model=model,
        query=QUERY,
        documents=[{"text": d} for d in DOCUMENTS],
        top_n=2,
        return_documents=True,
    )["results"]
    assert [(r["index"], r["document"]["text"]) for r in best] == [
        (r["index"], DOCUMENTS[r["index"]]) for r in every[:2]
    ]
    jina = gw.ok("/v1/rerank", model=model, query=QUERY, documents=DOCUMENTS, top_n=1, return_text=True)
    assert jina["results"][0]["document"]["text"] == DOCUMENTS[every[0]["index"]]
    long = gw.ok("/v1/rerank", model=model, query="capital " * 200, documents=["paris " * 200, "a cat"])
    assert sorted(r["index"] for r in long["results"]) == [
        0,
        1,
    ]  # longer than the model reads: cut, not refused


def test_cohere_clients_v1_and_v2_rerank_unchanged_but_for_base_url_and_key(gw: Gateway) -> None:
    import cohere

    model = gw.deploy("t16_text_ranking", "", "text-ranking")
    expected = gw.ok("/v1/rerank", model=model, query=QUERY, documents=DOCUMENTS)["results"]
    base_url = str(gw.http.base_url).rstrip("/")
    v2 = cohere.ClientV2(api_key=gw.key, base_url=base_url).rerank(
        model=model, query=QUERY, documents=DOCUMENTS, top_n=3
    )
    assert [(r.index, round(r.relevance_score, 5)) for r in v2.results] == [
        (r["index"], round(r["relevance_score"], 5)) for r in expected[:3]
    ]
    v1 = cohere.Client(api_key=gw.key, base_url=base_url).rerank(
        model=model, query=QUERY, documents=DOCUMENTS, return_documents=True
    )
    assert [r.index for r in v1.results] == [r["index"] for r in expected]
    assert (
        v1.results[0].document is not None and v1.results[0].document.text == DOCUMENTS[expected[0]["index"]]
    )


def test_langchains_cohere_reranker_orders_documents_as_the_endpoint_does(gw: Gateway) -> None:
    from langchain_cohere import CohereRerank
    from langchain_core.documents import Document

    model = gw.deploy("t16_text_ranking", "", "text-ranking")
    expected = gw.ok("/v1/rerank", model=model, query=QUERY, documents=DOCUMENTS)["results"]
    reranker = CohereRerank(
        model=model, cohere_api_key=gw.key, base_url=str(gw.http.base_url).rstrip("/"), top_n=2
    )
    kept = reranker.compress_documents([Document(page_content=d) for d in DOCUMENTS], QUERY)
    assert [d.page_content for d in kept] == [DOCUMENTS[r["index"]] for r in expected[:2]]
    assert [round(d.metadata["relevance_score"], 5) for d in kept] == [
        round(r["relevance_score"], 5) for r in expected[:2]
    ]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"query": QUERY, "documents": []}, "documents"),
        ({"query": "", "documents": ["a"]}, "query"),
        ({"documents": ["a"]}, "query"),
        ({"query": QUERY, "documents": ["a"], "top_n": 0}, "top_n"),
        ({"query": QUERY, "documents": [{"title": "a"}]}, "documents"),
        ({"query": QUERY, "documents": ["a"], "return_documnets": True}, "return_documnets"),
    ],
)
def test_bad_rerank_requests_answer_400_naming_the_field(
    gw: Gateway, body: dict[str, Any], param: str
) -> None:
    model = gw.deploy("t16_text_ranking", "", "text-ranking")
    response = gw.call("/v1/rerank", model=model, **body)
    assert_error(response, 400)
    assert response.json()["error"]["param"].startswith(param)


def test_rerank_on_a_deployment_of_another_task_is_not_supported(gw: Gateway) -> None:
    model = gw.deploy("t15_text_classification", "", "text-classification")
    assert_error(
        gw.call("/v1/rerank", model=model, query=QUERY, documents=DOCUMENTS),
        400,
        code="endpoint_not_supported",
    )
    ranker = gw.deploy("t16_text_ranking", "", "text-ranking")
    assert_error(
        gw.call("/v1/classifications/text", model=ranker, inputs="a"), 400, code="endpoint_not_supported"
    )


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/fill-mask", {"inputs": "a [MASK]"}),
        ("/v1/images/feature-extraction", {"inputs": "aGVsbG8="}),
        ("/v1/classifications/zero-shot/image", {"image": "aGVsbG8=", "candidate_labels": ["a"]}),
    ],
)
def test_an_endpoint_of_another_pipeline_is_not_supported(
    gw: Gateway, path: str, body: dict[str, Any]
) -> None:
    model = gw.deploy("t01_token_classification", "", "token-classification")
    assert_error(gw.call(path, model=model, **body), 400, code="endpoint_not_supported")


def test_concurrent_task_requests_share_model_calls(gw: Gateway) -> None:
    model = gw.deploy("t02_fill_mask", "", "fill-mask")
    gw.ok("/v1/fill-mask", model=model, inputs="a [MASK]")  # loaded
    before = _batches(gw, gw.deployed[model])
    with ThreadPoolExecutor(16) as pool:
        answers = list(
            pool.map(lambda i: gw.call("/v1/fill-mask", model=model, inputs=f"the [MASK] {i}"), range(32))
        )
    assert all(a.status_code == 200 for a in answers)
    calls, requests = (
        after - first for after, first in zip(_batches(gw, gw.deployed[model]), before, strict=True)
    )
    assert requests == 32 and calls < 32


def _batches(gw: Gateway, deployment_id: str) -> tuple[float, float]:
    text = gw.http.get("/metrics").text
    count = sum_ = 0.0
    for line in text.splitlines():
        if f'deployment="{deployment_id}"' in line:
            if line.startswith("modelhost_batch_size_count"):
                count = float(line.rsplit(" ", 1)[1])
            elif line.startswith("modelhost_batch_size_sum"):
                sum_ = float(line.rsplit(" ", 1)[1])
    return count, sum_
