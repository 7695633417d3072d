"""The tiny recipe chat model served by a live gateway, shared by the chat and agent tests."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from modelhost.api.app import create_app
from tests.conftest import make_settings
from tests.helpers import ADMIN_KEY, bearer, push_folder_sync
from tests.live import live_server

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "integer"}}, "required": ["zone"]},
    },
}


@dataclass
class ChatServer:
    url: str
    key: str
    http: httpx.Client
    deployment_id: str
    database_url: str
    app: Any = None  # the live server's app: `app.state.services` for tests that call a service itself


def long_context_copy(recipes: Path, root: Path) -> Path:
    """The recipe chat model with a 2048-token context (its tiny vocabulary makes a prompt with two tool
    schemas about 500 tokens, the recipe's whole context). Rotary positions need no more weights."""
    folder = root / "chat-model"
    shutil.copytree(recipes / "t11_text_generation_chat", folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 2048}))
    return folder


def thinking_copy(recipes: Path, root: Path) -> Path:
    """The long-context chat model with a Qwen3-style thinking template, so that the replica sees a
    `qwen3` family: its generation prompt opens a thought (`<think>`, as Qwen3's thinking models'
    `<think>\n`), or writes an empty one when the request's `enable_thinking` is false; an assistant's
    earlier `reasoning_content` is rendered in its turn. The random model never closes the thought
    (greedily it repeats the prompt's last character, `>`): its whole answer is reasoning."""
    folder = long_context_copy(recipes, root)
    template = (folder / "chat_template.jinja").read_text()
    content = "{{- content_text(message['content']) -}}"
    earlier = (
        "{%- if message['reasoning_content'] is string -%}"
        "{{- '<think>\\n' + message['reasoning_content'] + '\\n</think>\\n\\n' -}}{%- endif -%}"
    )
    prompt = "{{- '<|im_start|>assistant\\n' -}}"
    opened = (
        "{%- if enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}"
        "{%- else -%}{{- '<think>' -}}{%- endif -%}"
    )
    assert content in template and prompt in template
    template = template.replace(content, earlier + content, 1).replace(prompt, prompt + opened, 1)
    (folder / "chat_template.jinja").write_text(template)
    return folder


@contextmanager
def served_chat_model(root: Path, recipes: Path, **settings: Any) -> Iterator[ChatServer]:
    """A live gateway with an account and a warm `chat` deployment of the long-context chat model."""
    database_url = f"sqlite:///{root / 'db.sqlite'}"
    built = make_settings(root, database_url, worker_threads=1, **settings)
    app = create_app(built)
    with live_server(built, app) as url:
        http = httpx.Client(base_url=url, timeout=120)
        created = http.post("/v1/admin/accounts", json={"name": root.name}, headers=bearer(ADMIN_KEY))
        key = created.json()["api_key"]
        artifact = push_folder_sync(http, key, long_context_copy(recipes, root), "text-generation")
        deployment = http.post(
            "/v1/deployments",
            json={"model": "chat", "artifact_id": artifact, "readiness": "warm"},
            headers=bearer(key),
        )
        assert deployment.status_code == 201, deployment.text
        yield ChatServer(url, key, http, deployment.json()["id"], database_url, app)
        http.close()


def greedy_reference(recipes: Path, messages: list[Any], tokens: int) -> str:
    """What the recipe chat model answers greedily with exactly `tokens` new tokens, generated in this
    process with transformers itself: the reference a served (any backend) greedy answer must equal."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = recipes / "t11_text_generation_chat"  # the same weights and tokenizer as the deployments
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    out = model.generate(**ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
    text: str = tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    return text
