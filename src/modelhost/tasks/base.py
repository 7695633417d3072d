"""The shape every task handler has (LitServe-style): load once, run a batch, warm up."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol


class TaskHandler(Protocol):
    """Runs inside a replica worker. Items and outputs are msgpack-able dicts.

    `run` answers one output per item, in order. An output `{"error": {"message", "param"}}` is a
    client error of that item alone (the gateway answers it with 400); other items are unaffected.
    """

    def load(self, model_dir: Path, device: str) -> Any: ...
    def run(self, model: Any, batch: list[dict[str, Any]]) -> list[dict[str, Any]]: ...
    def warmup_item(self) -> dict[str, Any]: ...


def item_error(message: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "param": param}}
