"""Image generation (api.md §4.3) and edits (OpenAI's multipart form) through a live server, driven by the
official `openai` SDK and plain HTTP, on the tiny recipe Stable Diffusion pushed as three artifacts:
text-to-image (`painter`), image-to-image (`editor`) and inpainting (`inpainter`). The tiny model's
default size is 32×32; tests use it, small `[w, h]` pairs and one or two steps."""

from __future__ import annotations

import base64
import io
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from PIL import Image

from modelhost.tasks.diffusion import fitted, mask_for
from tests.conftest import make_settings
from tests.helpers import ADMIN_KEY, assert_error, bearer, push_folder_sync
from tests.live import live_server

GENERATIONS = "/v1/images/generations"
EDITS = "/v1/images/edits"


def png(width: int = 64, height: int = 64, tint: int = 0) -> bytes:
    """A gradient picture (distinct per `tint`) as PNG bytes."""
    x = np.linspace(0, 255, width, dtype=np.uint8)[None, :].repeat(height, axis=0)
    y = np.linspace(0, 255, height, dtype=np.uint8)[:, None].repeat(width, axis=1)
    pixels = np.stack([x, y, np.full_like(x, tint)], axis=-1)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def half_mask(width: int = 64, height: int = 64) -> bytes:
    """White (repaint) on the left half, black (keep) on the right."""
    pixels = np.zeros((height, width), dtype=np.uint8)
    pixels[:, : width // 2] = 255
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def pixels(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"), dtype=np.int16)


@dataclass
class Studio:
    url: str
    key: str
    http: httpx.Client

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.key, max_retries=0, timeout=120)

    def generate(self, **body: Any) -> httpx.Response:
        defaults = {"model": "painter", "num_inference_steps": 1, "response_format": "b64_json"}
        return self.http.post(GENERATIONS, json={**defaults, **body}, headers=bearer(self.key))

    def generated(self, **body: Any) -> dict[str, Any]:
        response = self.generate(**body)
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer

    def edit(self, files: list[tuple[str, bytes]], **fields: Any) -> httpx.Response:
        defaults = {
            "model": "editor",
            "prompt": "a cat",
            "num_inference_steps": 2,
            "response_format": "b64_json",
        }
        data = {k: str(v) for k, v in {**defaults, **fields}.items() if v is not None}
        parts = [(name, (f"{name}.png", content, "image/png")) for name, content in files]
        return self.http.post(EDITS, data=data, files=parts, headers=bearer(self.key))

    def edited(self, files: list[tuple[str, bytes]], **fields: Any) -> dict[str, Any]:
        response = self.edit(files, **fields)
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer


@pytest.fixture(scope="module")
def studio(tmp_path_factory: pytest.TempPathFactory, recipes: Path) -> Iterator[Studio]:
    root = tmp_path_factory.mktemp("images")
    settings = make_settings(root, f"sqlite:///{root / 'db.sqlite'}", worker_threads=1)
    with live_server(settings) as url:
        http = httpx.Client(base_url=url, timeout=120)
        key = http.post("/v1/admin/accounts", json={"name": "studio"}, headers=bearer(ADMIN_KEY)).json()[
            "api_key"
        ]
        for model, pipeline in (
            ("painter", "text-to-image"),
            ("editor", "image-to-image"),
            ("inpainter", "inpainting"),
        ):
            artifact = push_folder_sync(http, key, recipes / "t13_diffusers_sd", pipeline)
            created = http.post(
                "/v1/deployments",
                json={"model": model, "artifact_id": artifact, "readiness": "cold"},
                headers=bearer(key),
            )
            assert created.status_code == 201, created.text
        yield Studio(url, key, http)
        http.close()


# ---------------------------------------------------------------- generations


def test_generation_answers_exactly_the_spec_shape(studio: Studio) -> None:
    before = int(time.time())
    answer = studio.generated(prompt="a fox", n=2)
    assert set(answer) == {"model", "created", "id", "data", "size", "output_format"}
    assert answer["model"] == "painter" and answer["id"].startswith("img-")
    assert before <= answer["created"] <= time.time() + 1
    assert answer["size"] == "32x32" and answer["output_format"] == "png"  # auto: the model's default size
    assert len(answer["data"]) == 2
    for item in answer["data"]:
        assert set(item) == {"url", "b64_json"} and item["url"] is None
        image = Image.open(io.BytesIO(base64.b64decode(item["b64_json"])))
        assert image.format == "PNG" and image.size == (32, 32)


def test_the_openai_sdk_generates_images_at_a_listed_size(studio: Studio) -> None:
    answer = studio.client().images.generate(
        model="painter",
        prompt="a fox",
        size="256x256",
        response_format="b64_json",
        extra_body={"num_inference_steps": 1, "seed": 1},
    )
    assert answer.size == "256x256" and answer.data is not None and len(answer.data) == 1
    assert answer.data[0].b64_json is not None
    assert Image.open(io.BytesIO(base64.b64decode(answer.data[0].b64_json))).size == (256, 256)


def test_a_size_pair_sets_width_and_height(studio: Studio) -> None:
    answer = studio.generated(size=[96, 64])
    assert answer["size"] == "96x64"
    assert pixels(answer["data"][0]["b64_json"]).shape == (64, 96, 3)


def test_the_same_seed_and_parameters_give_byte_identical_images(studio: Studio) -> None:
    first = [d["b64_json"] for d in studio.generated(prompt="a fox", n=2, seed=7)["data"]]
    again = [d["b64_json"] for d in studio.generated(prompt="a fox", n=2, seed=7)["data"]]
    other = [d["b64_json"] for d in studio.generated(prompt="a fox", n=2, seed=8)["data"]]
    assert first == again
    assert first[0] != first[1]  # the second image uses seed + 1
    assert other[0] != first[0]


def test_without_a_seed_every_image_is_new(studio: Studio) -> None:
    first = studio.generated(prompt="a fox")["data"][0]["b64_json"]
    second = studio.generated(prompt="a fox")["data"][0]["b64_json"]
    assert first != second


@pytest.mark.parametrize(
    "change",
    [{"prompt": "a dog"}, {"negative_prompt": "blurry"}, {"num_inference_steps": 2}, {"guidance_scale": 1.0}],
    ids=lambda change: next(iter(change)),
)
def test_each_option_reaches_the_pipeline(studio: Studio, change: dict[str, Any]) -> None:
    baseline = {"prompt": "a fox", "seed": 3, "guidance_scale": 7.5}
    assert (
        studio.generated(**baseline)["data"][0]["b64_json"]
        != studio.generated(**{**baseline, **change})["data"][0]["b64_json"]
    )


def test_a_prompt_is_optional_for_unconditional_generation(studio: Studio) -> None:
    answer = studio.generated(seed=1)
    assert len(answer["data"]) == 1 and answer["data"][0]["b64_json"]


@pytest.mark.parametrize(("output_format", "pil_format"), [("jpeg", "JPEG"), ("webp", "WEBP")])
def test_jpeg_and_webp_are_output_formats(studio: Studio, output_format: str, pil_format: str) -> None:
    answer = studio.generated(output_format=output_format)
    assert answer["output_format"] == output_format
    assert Image.open(io.BytesIO(base64.b64decode(answer["data"][0]["b64_json"]))).format == pil_format


def test_url_answers_serve_the_same_bytes_as_b64_json(studio: Studio) -> None:
    options = {"num_inference_steps": 1, "seed": 11}
    linked = studio.client().images.generate(
        model="painter", prompt="a fox", extra_body=options
    )  # url: default
    assert linked.data is not None and linked.data[0].b64_json is None and linked.data[0].url is not None
    url = linked.data[0].url
    assert url.startswith(f"{studio.url}/v1/files/file")
    served = httpx.get(url)  # the link is the key: no Authorization header
    assert served.status_code == 200 and served.headers["content-type"] == "image/png"
    inline = studio.generated(prompt="a fox", **options)["data"][0]["b64_json"]
    assert served.content == base64.b64decode(inline)


def test_a_tampered_link_signature_is_404(studio: Studio) -> None:
    url = studio.generated(response_format="url")["data"][0]["url"]
    tampered = url[:-1] + ("0" if url[-1] != "0" else "1")
    assert httpx.get(url).status_code == 200
    assert_error(httpx.get(tampered), 404, code="file_not_found")


def test_the_sdks_files_content_reads_a_generated_image_by_its_id_with_the_accounts_key_only(
    studio: Studio,
) -> None:
    url = studio.generated(response_format="url")["data"][0]["url"]
    file_id = httpx.URL(url).path.split("/")[3]
    assert studio.client().files.content(file_id).content == httpx.get(url).content
    other = studio.http.post("/v1/admin/accounts", json={"name": "other"}, headers=bearer(ADMIN_KEY))
    assert_error(
        studio.http.get(f"/v1/files/{file_id}/content", headers=bearer(other.json()["api_key"])),
        404,
        code="file_not_found",
    )


@pytest.mark.parametrize("size", ["100x100", "64x60", "1024X1024", [65, 64], [64], [64, 64, 64], [32, 32], 7])
def test_unknown_sizes_are_400_naming_size(studio: Studio, size: Any) -> None:
    assert_error(studio.generate(size=size), 400, param="size")


@pytest.mark.parametrize("n", [0, -1, 11])
def test_n_outside_1_to_10_is_400_naming_n(studio: Studio, n: int) -> None:
    assert_error(studio.generate(n=n), 400, param="n")


def test_unknown_fields_are_400_naming_the_field(studio: Studio) -> None:
    error = assert_error(studio.generate(qualty="hd"), 400, param="qualty")
    assert "Extra inputs are not permitted" in error["message"]


def test_a_width_x_height_string_sets_the_size(studio: Studio) -> None:
    answer = studio.generated(size="96x64")
    assert answer["size"] == "96x64"
    assert pixels(answer["data"][0]["b64_json"]).shape == (64, 96, 3)


def test_openai_image_fields_that_change_nothing_are_accepted_and_change_nothing(studio: Studio) -> None:
    baseline = {"prompt": "a fox", "seed": 5}
    accepted = {
        "quality": "high",
        "style": "vivid",
        "moderation": "low",
        "background": "opaque",
        "output_compression": 80,
        "partial_images": 2,
        "complexity": "low",
        "safety_identifier": "hashed-user",
        "user": "user-1",
    }
    plain = studio.generated(**baseline)["data"][0]["b64_json"]
    assert studio.generated(**baseline, **accepted)["data"][0]["b64_json"] == plain


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("background", "transparent"),
        ("output_format", "gif"),
        ("frame_count", 4),
        ("frame_duration_ms", 100),
        ("svg", {"model": "x"}),
    ],
)
def test_image_fields_we_cannot_honour_are_400_naming_them(studio: Studio, field: str, value: Any) -> None:
    assert_error(studio.generate(**{field: value}), 400, param=field)


def test_streaming_sends_one_completed_event_per_image(studio: Studio) -> None:
    options = {"num_inference_steps": 1, "seed": 9, "n": 2}
    events = list(
        studio.client().images.generate(model="painter", prompt="a fox", stream=True, extra_body=options)
    )
    assert [e.type for e in events] == ["image_generation.completed"] * 2
    whole = studio.generated(prompt="a fox", **options)
    assert [e.b64_json for e in events] == [d["b64_json"] for d in whole["data"]]  # type: ignore[union-attr]
    assert all(e.size == "32x32" and e.output_format == "png" for e in events)  # type: ignore[union-attr]


def test_each_endpoint_refuses_deployments_of_other_pipelines(studio: Studio) -> None:
    assert_error(studio.generate(model="editor"), 400, code="endpoint_not_supported")
    assert_error(studio.edit([("image", png())], model="painter"), 400, code="endpoint_not_supported")


# ---------------------------------------------------------------- edits


def test_the_openai_sdk_edits_an_image_at_its_own_size(studio: Studio) -> None:
    answer = studio.client().images.edit(
        model="editor",
        image=("cat.png", png(96, 64), "image/png"),
        prompt="a cat",
        response_format="b64_json",
        extra_body={"num_inference_steps": 2, "seed": 1},
    )
    assert answer.size == "96x64" and answer.data is not None and len(answer.data) == 1
    assert answer.data[0].b64_json is not None and pixels(answer.data[0].b64_json).shape == (64, 96, 3)


def test_several_images_give_n_results_each_in_order(studio: Studio) -> None:
    """Image 0's n results, then image 1's; the i-th result uses seed + i."""
    first, second = png(tint=0), png(tint=255)
    together = studio.client().images.edit(  # a list: the SDK sends `image[]` parts
        model="editor",
        image=[("a.png", first, "image/png"), ("b.png", second, "image/png")],
        prompt="a cat",
        n=2,
        response_format="b64_json",
        extra_body={"num_inference_steps": 2, "seed": 3},
    )
    assert together.data is not None and len(together.data) == 4
    results = [pixels(d.b64_json or "") for d in together.data]
    alone = [pixels(d["b64_json"]) for d in studio.edited([("image", first)], n=2, seed=3)["data"]]
    alone += [pixels(d["b64_json"]) for d in studio.edited([("image", second)], n=2, seed=5)["data"]]
    for result, expected in zip(results, alone, strict=True):  # equal up to batch-size float noise
        assert np.abs(result - expected).max() <= 3
    assert np.abs(results[0] - results[2]).mean() > 10  # the two images' results really differ


def test_repeated_image_parts_are_the_same_as_image_brackets(studio: Studio) -> None:
    files = [png(tint=0), png(tint=255)]
    repeated = studio.edited([("image", f) for f in files], seed=4)
    brackets = studio.edited([("image[]", f) for f in files], seed=4)
    assert len(repeated["data"]) == 2
    assert [d["b64_json"] for d in repeated["data"]] == [d["b64_json"] for d in brackets["data"]]


def test_an_edit_size_resizes_the_results(studio: Studio) -> None:
    answer = studio.edited([("image", png(64, 64))], size="[96, 64]")
    assert answer["size"] == "96x64" and pixels(answer["data"][0]["b64_json"]).shape == (64, 96, 3)


def test_a_mask_makes_an_image_to_image_deployment_inpaint(studio: Studio) -> None:
    files = [("image", png()), ("mask", half_mask())]
    on_editor = studio.edited(files, seed=2)["data"][0]["b64_json"]
    on_inpainter = studio.edited(files, model="inpainter", seed=2)["data"][0]["b64_json"]
    without_mask = studio.edited(files[:1], seed=2)["data"][0]["b64_json"]
    assert on_editor == on_inpainter != without_mask


def test_an_inpainting_deployment_without_a_mask_is_400_naming_mask(studio: Studio) -> None:
    assert_error(studio.edit([("image", png())], model="inpainter"), 400, param="mask")


def test_an_edit_without_a_prompt_is_400_naming_prompt(studio: Studio) -> None:
    response = studio.http.post(
        EDITS,
        data={"model": "editor"},
        files=[("image", ("a.png", png(), "image/png"))],
        headers=bearer(studio.key),
    )
    assert_error(response, 400, param="prompt")


def test_an_edit_without_an_image_is_400_naming_image(studio: Studio) -> None:
    assert_error(studio.edit([("mask", half_mask())]), 400, param="image")


GIF = b"GIF89a\x01\x00\x01\x00\x00\x00\x00;"


@pytest.mark.parametrize(
    ("files", "param"),
    [
        ([("image", GIF)], "image"),
        ([("image", png()), ("image", b"just text")], "image[1]"),
        ([("image", png()), ("mask", GIF)], "mask"),
    ],
    ids=["image", "second-image", "mask"],
)
def test_files_that_are_not_png_jpeg_or_webp_are_400_naming_the_field(
    studio: Studio, files: list[tuple[str, bytes]], param: str
) -> None:
    assert_error(studio.edit(files), 400, code="invalid_media", param=param)


@pytest.mark.parametrize(
    ("files", "param"),
    [
        ([("image", b"\x89PNG\r\n\x1a\nnot really a png")], "image"),
        ([("image", png()), ("mask", b"\xff\xd8\xff\xe0 truncated jpeg")], "mask"),
    ],
    ids=["image", "mask"],
)
def test_an_undecodable_image_is_400_naming_the_field(
    studio: Studio, files: list[tuple[str, bytes]], param: str
) -> None:
    assert_error(studio.edit(files), 400, code="invalid_media", param=param)


@pytest.mark.parametrize(
    ("field", "value"),
    [("n", "0"), ("n", "11"), ("n", "two"), ("size", "100x100"), ("size", "[65, 64]"), ("strength", "1.5"),
     ("seed", "-1"), ("output_format", "gif"), ("background", "transparent")],
)  # fmt: skip
def test_edit_form_fields_follow_the_generation_rules(studio: Studio, field: str, value: str) -> None:
    assert_error(studio.edit([("image", png())], **{field: value}), 400, param=field)


def test_an_edit_markup_is_400_naming_markup(studio: Studio) -> None:
    assert_error(studio.edit([("image", png()), ("markup", png())]), 400, param="markup")


def test_an_edit_streams_its_completed_events(studio: Studio) -> None:
    response = studio.edit([("image", png())], stream="true", seed=2)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    assert response.text.startswith("event: image_edit.completed\ndata: ")
    event = json.loads(response.text.split("data: ", 1)[1])
    assert event["type"] == "image_edit.completed"
    assert event["b64_json"] == studio.edited([("image", png())], seed=2)["data"][0]["b64_json"]


def test_more_than_10_results_in_one_edit_is_400_naming_n(studio: Studio) -> None:
    assert_error(studio.edit([("image", png()), ("image", png())], n=6), 400, param="n")


def test_an_edit_that_is_not_a_multipart_form_is_400(studio: Studio) -> None:
    response = studio.http.post(
        EDITS, json={"model": "editor", "prompt": "a cat"}, headers=bearer(studio.key)
    )
    assert_error(response, 400, code="invalid_request")


# ---------------------------------------------------------------- pure rules


@pytest.mark.parametrize(
    ("given", "size"),
    [((96, 64), (96, 64)), ((100, 70), (96, 64)), ((40, 40), (64, 64)), ((4000, 3000), (2048, 1536))],
)
def test_an_edits_auto_size_is_the_image_size_fitted_to_the_grid(
    given: tuple[int, int], size: tuple[int, int]
) -> None:
    assert fitted(*given) == size


def test_masks_keep_their_polarity_white_repaints() -> None:
    mask = Image.open(io.BytesIO(half_mask(32, 32))).convert("RGB")
    resized = np.asarray(mask_for(mask, (64, 64)))
    assert resized.shape == (64, 64)
    assert resized[:, :28].min() == 255 and resized[:, 36:].max() == 0
