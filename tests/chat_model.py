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


def long_context_copy(recipes: Path, root: Path) -> Path:
    """The recipe chat model with a 2048-token context (its tiny vocabulary makes a prompt with two tool
    schemas about 500 tokens, the recipe's whole context). Rotary positions need no more weights."""
    folder = root / "chat-model"
    shutil.copytree(recipes / "t11_text_generation_chat", folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 2048}))
    return folder


@contextmanager
def served_chat_model(root: Path, recipes: Path, **settings: Any) -> Iterator[ChatServer]:
    """A live gateway with an account and a warm `chat` deployment of the long-context chat model."""
    database_url = f"sqlite:///{root / 'db.sqlite'}"
    with live_server(make_settings(root, database_url, worker_threads=1, **settings)) as url:
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
        yield ChatServer(url, key, http, deployment.json()["id"], database_url)
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
