"""The shape every task handler has (LitServe-style): load once, run a batch, warm up."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Protocol

from typing_extensions import TypeIs

from modelhost.generation.contract import GenerationEvent, StreamRequest


class TaskHandler(Protocol):
    """A batch task, run inside a replica. Items and outputs are msgpack-able dicts.

    `run` answers one output per item, in order. An output `{"error": {"message", "param", "code"}}`
    (`errors.item_error`, `errors.error_of`) is a client error of that item alone (the gateway answers
    it with 400); other items are unaffected.
    The replica batches the requests of every gateway process into one `run` call.
    """

    def load(self, model_dir: Path, device: str) -> Any: ...
    def run(self, model: Any, batch: list[dict[str, Any]]) -> list[dict[str, Any]]: ...
    def warmup_item(self) -> dict[str, Any]: ...


class StreamingTaskHandler(Protocol):
    """A streaming task (text generation, video jobs), run inside a replica: requests join and leave
    between steps, and each step yields `(request id, event)` pairs. An event with `finish` or
    `error` is a request's last. The replica calls `start` and `cancel` only between steps, never
    while one runs, so a handler needs no locks for them.
    """

    streaming: ClassVar[bool]  # True: what tells a streaming handler from a batch one (`is_streaming`)

    def load(self, model_dir: Path, device: str) -> Any: ...
    def warmup(self, state: Any) -> None: ...
    def start(self, state: Any, request_id: int, request: StreamRequest) -> None:
        """Queue a request (`generation.contract`: a handler takes its own kind and refuses the other);
        raise `ModelhostError` (its caller's 400) when it cannot run."""
        ...

    def cancel(self, state: Any, request_id: int) -> None: ...
    def step(self, state: Any) -> list[tuple[int, GenerationEvent]]: ...
    def abort(self, state: Any) -> list[int]:
        """A step raised: drop every request, returning their IDs (each gets an internal error)."""
        ...

    def handoff(self, state: Any) -> list[int] | None:
        """A drain (issue 73): drop every request, returning their IDs, each to continue on another
        replica from what its gateway has sent; None where the engine cannot continue another's
        generation (its requests then run to their end here)."""
        ...

    def idle(self, state: Any) -> bool: ...
    def running(self, state: Any) -> int: ...
    def cache_usage(self, state: Any) -> float | None:
        """The fraction of the replica's KV cache its requests hold (`modelhost_kv_cache_usage_ratio`);
        None for a handler without one."""
        ...


AnyTaskHandler = TaskHandler | StreamingTaskHandler


def is_streaming(handler: AnyTaskHandler) -> TypeIs[StreamingTaskHandler]:
    """Batch handlers declare no `streaming`; streaming ones declare it True."""
    return getattr(handler, "streaming", False) is True


def options_key(item: dict[str, Any], fields: tuple[str, ...]) -> tuple[Any, ...]:
    """Items whose options are equal can share one model call."""
    return tuple(repr(item.get(f)) for f in fields)


def grouped(batch: list[dict[str, Any]], fields: tuple[str, ...]) -> dict[tuple[Any, ...], list[int]]:
    """Indices of the batch's items grouped by the options in `fields`, in order of first appearance."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for index, item in enumerate(batch):
        groups.setdefault(options_key(item, fields), []).append(index)
    return groups


def generate_groups(batch: list[dict[str, Any]], fields: tuple[str, ...]) -> list[list[int]]:
    """Indices of the items that may share one `generate` call: equal options in `fields`, and no
    `generate_kwargs.seed`. A seeded item's call holds its own inputs only: sampled tokens depend on the
    batch's size and neighbours, and a seed promises the same answer whatever else the worker runs."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for index, item in enumerate(batch):
        key = options_key(item, fields)
        if (item.get("generate_kwargs") or {}).get("seed") is not None:
            key = (*key, index)
        groups.setdefault(key, []).append(index)
    return list(groups.values())
