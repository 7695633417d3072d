"""Chat with images (issue 19): an `image-text-to-text` deployment of the tiny LLaVA (t07 `llava`)
answers OpenAI `image_url` parts through the same engine as text chat, checked with the openai SDK
against the model's own `generate`."""

from __future__ import annotations

import base64
import http.server
import io
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anthropic
import httpx
import numpy as np
import openai
import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor

from modelhost.protocol.tasks import MAX_MEDIA_INPUTS
from tests.conftest import make_settings
from tests.helpers import ADMIN_KEY, Gateway, bearer
from tests.live import live_server

QUESTION = "what is in the picture?"
NEW_TOKENS = 8


def png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def data_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def message(url: str) -> list[dict[str, object]]:
    return [
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": QUESTION}],
        }
    ]


def expected_answer(folder: Path, image: bytes) -> str:
    """What the model itself generates, greedy, for the same chat and image."""
    processor = AutoProcessor.from_pretrained(folder)
    model = AutoModelForImageTextToText.from_pretrained(folder).eval()
    chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
    text = processor.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=text, images=[Image.open(io.BytesIO(image)).convert("RGB")], return_tensors="pt")
    with torch.inference_mode():
        tokens = model.generate(
            **inputs, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False
        )
    answer: str = processor.tokenizer.decode(
        tokens[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True
    )
    return answer


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """A local HTTP server of images (its loopback address is allowed to this module's gateway)."""
    root = tmp_path_factory.mktemp("images")
    (root / "cat.png").write_bytes(png(1))
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(root))  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, recipes: Path) -> Iterator[Gateway]:
    root = tmp_path_factory.mktemp("vision")
    settings = make_settings(
        root, f"sqlite:///{root / 'db.sqlite'}", worker_threads=1, media_allow_networks=["127.0.0.1/32"]
    )
    with live_server(settings) as url, httpx.Client(base_url=url, timeout=120) as client:
        created = client.post("/v1/admin/accounts", json={"name": "vlm"}, headers=bearer(ADMIN_KEY))
        yield Gateway(client, created.json()["api_key"], recipes)


def sdk(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{str(gw.http.base_url).rstrip('/')}/v1", api_key=gw.key)


def vlm(gw: Gateway) -> str:
    return gw.deploy("t07_visual_question_answering", "llava", "image-text-to-text", model="llava-chat")


def ask(client: openai.OpenAI, model: str, url: str) -> str:
    answer = client.chat.completions.create(
        model=model,
        messages=message(url),
        max_tokens=NEW_TOKENS,
        extra_body={"min_tokens": NEW_TOKENS},
        temperature=0,
    )
    return answer.choices[0].message.content or ""


def test_the_sdk_streams_an_answer_about_an_image_sent_as_a_data_uri_and_as_a_url(
    gw: Gateway, files: tuple[Path, str]
) -> None:
    client, model = sdk(gw), vlm(gw)
    expected = expected_answer(gw.recipes / "t07_visual_question_answering" / "llava", png(1))
    stream = client.chat.completions.create(
        model=model,
        messages=message(data_uri(png(1))),
        max_tokens=NEW_TOKENS,
        extra_body={"min_tokens": NEW_TOKENS},
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 1 and "".join(pieces) == expected
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == NEW_TOKENS
    assert usage.prompt_tokens > 16  # the 16 image tokens count
    assert ask(client, model, f"{files[1]}/cat.png") == expected


def test_two_images_with_the_same_question_get_their_own_answers_not_a_cached_one(gw: Gateway) -> None:
    client, model = sdk(gw), vlm(gw)
    folder = gw.recipes / "t07_visual_question_answering" / "llava"
    answers = {seed: ask(client, model, data_uri(png(seed))) for seed in (2, 3, 2)}
    expected = {seed: expected_answer(folder, png(seed)) for seed in (2, 3)}
    assert expected[2] != expected[3]  # the model does look at the image: a shared prefix would show
    assert answers == expected


def test_concurrent_image_chats_decode_together_and_each_equals_its_generate(gw: Gateway) -> None:
    """Each image prompt is prefilled on its own forward pass, then they decode in one batch."""
    client, model = sdk(gw), vlm(gw)
    folder = gw.recipes / "t07_visual_question_answering" / "llava"
    seeds = [5, 6, 5, 6]
    with ThreadPoolExecutor(len(seeds)) as pool:
        answers = list(pool.map(lambda seed: ask(client, model, data_uri(png(seed))), seeds))
    expected = {seed: expected_answer(folder, png(seed)) for seed in (5, 6)}
    assert answers == [expected[seed] for seed in seeds]


@pytest.mark.parametrize("url", ["http://10.1.2.3/cat.png", "http://127.0.0.2/cat.png"])
def test_an_image_at_a_private_address_is_refused_with_400(gw: Gateway, url: str) -> None:
    """The module allows 127.0.0.1/32 (its image server); any other private or loopback address is refused."""
    with pytest.raises(openai.BadRequestError) as refused:
        ask(sdk(gw), vlm(gw), url)
    error = refused.value.body
    assert isinstance(error, dict) and error["param"] == "messages[0].content[0].image_url.url", error


def test_a_part_that_is_not_an_image_is_a_400_naming_it(gw: Gateway) -> None:
    """Decoded in the worker, with the same image rules as every media input; the error names the part."""
    url = "data:image/png;base64," + base64.b64encode(b"not a picture").decode()
    parts = [{"type": "text", "text": "look:"}, {"type": "image_url", "image_url": {"url": url}}]
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as refused:
            sdk(gw).chat.completions.create(
                model=vlm(gw), messages=[{"role": "user", "content": parts}], max_tokens=2, stream=stream
            )
        error = refused.value.body
        assert isinstance(error, dict) and error["param"] == "messages[0].content[1].image_url.url", error


def test_more_images_than_the_media_limit_are_refused_before_fetching(gw: Gateway) -> None:
    parts = [{"type": "image_url", "image_url": {"url": "http://10.1.2.3/x.png"}}] * (MAX_MEDIA_INPUTS + 1)
    with pytest.raises(openai.BadRequestError) as refused:
        sdk(gw).chat.completions.create(
            model=vlm(gw),
            messages=[{"role": "user", "content": parts}],
            max_tokens=2,
        )
    error = refused.value.body
    assert isinstance(error, dict) and error["param"] == f"messages[0].content[{MAX_MEDIA_INPUTS}]", error


def test_a_text_only_chat_deployment_refuses_an_image_with_400(gw: Gateway) -> None:
    model = gw.deploy("t11_text_generation_chat", "", "text-generation", model="text-chat")
    with pytest.raises(openai.BadRequestError) as refused:
        ask(sdk(gw), model, data_uri(png(1)))
    assert "text only" in str(refused.value)


# ---------------------------------------------------------------- the Messages API's image blocks


def test_anthropic_image_blocks_as_base64_and_url_answer_as_image_url_parts(
    gw: Gateway, files: tuple[Path, str]
) -> None:
    model = vlm(gw)
    client = anthropic.Anthropic(base_url=str(gw.http.base_url).rstrip("/"), api_key=gw.key, max_retries=0)
    expected = ask(sdk(gw), model, data_uri(png(1)))

    def answer(source: dict[str, str]) -> str:
        content = [{"type": "image", "source": source}, {"type": "text", "text": QUESTION}]
        message = client.messages.create(
            model=model,
            messages=[{"role": "user", "content": content}],  # type: ignore[typeddict-item]
            max_tokens=NEW_TOKENS,
            extra_body={"temperature": 0},
        )
        return "".join(block.text for block in message.content if block.type == "text")

    data = base64.b64encode(png(1)).decode()
    assert answer({"type": "base64", "media_type": "image/png", "data": data}) == expected
    assert answer({"type": "url", "url": f"{files[1]}/cat.png"}) == expected
    with pytest.raises(anthropic.BadRequestError) as refused:
        answer({"type": "url", "url": "http://10.0.0.1/cat.png"})
    assert refused.value.response.json()["error"]["type"] == "invalid_request_error"
    assert "messages[0].content[0].source" in refused.value.response.json()["error"]["message"]


# ---------------------------------------------------------------- the Responses API's input_image parts


def image_input(url: str) -> list[dict[str, object]]:
    return [
        {
            "role": "user",
            "content": [{"type": "input_image", "image_url": url}, {"type": "input_text", "text": QUESTION}],
        }
    ]


def test_the_responses_api_answers_input_image_parts_streamed_and_chained(gw: Gateway) -> None:
    client, model = sdk(gw), vlm(gw)
    folder = gw.recipes / "t07_visual_question_answering" / "llava"
    options: dict[str, object] = {
        "max_output_tokens": NEW_TOKENS,
        "temperature": 0,
        "extra_body": {"min_tokens": NEW_TOKENS},
    }
    events = list(
        client.responses.create(model=model, input=image_input(data_uri(png(4))), stream=True, **options)
    )
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert events[-1].type == "response.incomplete"  # max_output_tokens reached, as asked
    first = events[-1].response
    assert "".join(deltas) == first.output_text == expected_answer(folder, png(4))
    assert first.usage is not None and first.usage.input_tokens > 16  # the image tokens count
    items = client.responses.input_items.list(first.id).data
    assert [p.type for p in items[0].content] == ["input_image", "input_text"]
    # the chain carries the image: the follow-up is read with it (and the image is read again)
    second = client.responses.create(
        model=model, input="and what colour is it?", previous_response_id=first.id, **options
    )
    assert second.status == "incomplete" and second.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens


@pytest.mark.parametrize(
    ("url", "param"),
    [
        ("http://10.1.2.3/cat.png", "input[0].content[0].image_url"),
        ("data:image/png;base64,bm90IGEgcGljdHVyZQ==", "input[0].content[0].image_url"),
    ],
)
def test_a_bad_input_image_is_a_400_naming_its_part(gw: Gateway, url: str, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        sdk(gw).responses.create(model=vlm(gw), input=image_input(url), max_output_tokens=2)
    error = refused.value.body
    assert isinstance(error, dict) and error["param"] == param, error


def test_a_text_only_deployment_refuses_an_input_image_with_400(gw: Gateway) -> None:
    model = gw.deploy("t11_text_generation_chat", "", "text-generation", model="text-chat")
    with pytest.raises(openai.BadRequestError) as refused:
        sdk(gw).responses.create(model=model, input=image_input(data_uri(png(1))), max_output_tokens=2)
    error = refused.value.body
    assert isinstance(error, dict) and error["param"] == "input[0].content", error
    assert "text only" in error["message"]
