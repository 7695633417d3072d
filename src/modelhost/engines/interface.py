"""What an engine is: the one module that says what each kind of engine implements, and what every
generation engine gives back (docs/architecture.md, "Engines inside a replica" and "Adding an engine").

A replica hosts one engine. Each kind is a Protocol here, which its classes declare by subclassing it
(mypy checks that they fulfil it; tests/test_engine_table.py that every row of `ENGINE_TABLE` names
classes that still define every member):

- `Engine`, stepped by the replica's synchronous loop (`runtime.worker.sync_worker` →
  `runtime.worker.host.ReplicaHost` → the text-generation handler, which holds it as an `Engine`) between
  messages: requests join (`add`, in the engine's own shape) and leave between steps, and each step returns
  the events it made. modelhost's own engine (`engines.native.engine.GenerationEngine`, the `transformers`
  row's text generation).
- `StreamingEngine` and `BatchEngine` (either: `SelfSteppingEngine`), which step themselves and run each
  request to its end in an asyncio loop (`runtime.worker.async_worker.AsyncWorker`, which takes the one
  engine object): `generate` a request emitting `Event`s, `abort` one, or `run` a batch task's request;
  `warm_up` before `Ready`, `errored` once none can run, `shutdown`. vLLM's (`engines.vllm.VllmModel`, in
  its own processes), llama.cpp's server (`engines.llamacpp.LlamaCppModel`, in the worker's process) and
  that server in embedding mode (`engines.llamacpp_embeddings.LlamaCppEmbedder`, a `BatchEngine`: a
  feature-extraction deployment's requests).
- `Runner`, an encoder runtime (`engines.encoders`: `OnnxRuntimeRunner`, `OpenVinoRunner`): an exported
  model, arrays in and out. It takes the place of a batch handler's torch model when the replica loads:
  a handler that offers its model (an `EncoderHandler`: `encoder_slot` gives its
  `engines.encoders.EncoderSlot`) gets a `RuntimeModel` over the runner that `engines.encoders.prepare`
  measured and chose; the host then runs its batches through the handler, as it runs torch's.

The `transformers` row's other tasks have no engine object: the task handler (`tasks.base.TaskHandler`)
runs its torch model itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from modelhost.generation.contract import GenerationEvent, GenerationRequest

if TYPE_CHECKING:
    import numpy as np

    from modelhost.engines.encoders import EncoderSlot

Event = GenerationEvent
"""One event of one generation, alike from every generation engine (`generation.contract`: `Started`,
`Logprob`, `Text` with `finish` on the last, `Failed`)."""

Emit = Callable[[Event], None]
"""Where a self-stepping engine sends a request's events, as they come."""

Submitted = TypeVar("Submitted", contravariant=True)


@runtime_checkable
class Engine(Protocol[Submitted]):
    """What the replica's loop and the handler that feeds it need of an engine they step: taking a
    request (in the engine's own shape, `Submitted`: ours takes a `Sequence`, which the handler builds),
    whether it has work, how many sequences it holds (the `Stats` answer and the generating gauge), how
    full its KV cache is (`modelhost_kv_cache_usage_ratio`), cancelling one, one step, dropping everything
    after a step that failed, and a warm-up before the first request; and its vocabulary and context,
    which the handler checks requests against."""

    vocab_size: int  # the model's output rows: what a grammar's token mask covers
    context_length: int  # the longest sequence it holds, prompt and answer

    def add(self, request: Submitted, low: bool = False) -> None:
        """Queue a request; a `low` one (a batch line) waits behind every other."""
        ...

    @property
    def idle(self) -> bool: ...

    @property
    def held(self) -> int: ...

    @property
    def cache_usage(self) -> float:
        """The fraction of its KV cache that the sequences it holds take, 0 to 1."""
        ...

    def cancel(self, sequence_id: int) -> None: ...

    def step(self) -> list[tuple[int, Event]]:
        """One step for every sequence held; the events it made, each with its sequence's ID."""
        ...

    def abort(self) -> list[int]:
        """Drop every sequence (after a failed step, whose state cannot be trusted); their IDs."""
        ...

    def warm_up(self) -> None: ...


@runtime_checkable
class AsyncEngine(Protocol):
    """What the asyncio worker needs of any loaded engine that steps itself, whatever it serves."""

    async def warm_up(self) -> None:
        """One short request before `Ready`, through the path every request takes: a model the engine
        loads but cannot run fails its load with the engine's reason, rather than every request later."""
        ...

    @property
    def errored(self) -> bool:
        """No request can run any more: the worker exits and the supervisor starts another."""
        ...

    def shutdown(self) -> None:
        """Stop the engine and whatever it started (processes, threads, a server)."""
        ...


@runtime_checkable
class StreamingEngine(AsyncEngine, Protocol):
    """A self-stepping engine that generates (text generation): one request at a time, run to its end."""

    async def generate(self, request_id: str, request: GenerationRequest, emit: Emit) -> None:
        """Run one request to its end (`request_id` unique in the worker), emitting its events. Bad input
        is an `error` event (the caller's 400); a failure of the engine's raises."""
        ...

    async def abort(self, request_id: str) -> None:
        """Stop a request `generate` runs (its caller is gone, or cancelled it)."""
        ...

    def continues(self, request: GenerationRequest) -> bool:
        """Whether its events for `request` say their tokens and it takes a continuation of it (issue 73):
        such a generation moves to another replica when this one dies or drains."""
        ...

    def cache_usage(self) -> float | None:
        """How full its KV cache is now, 0 to 1 (`modelhost_kv_cache_usage_ratio`); None where the engine
        does not say."""
        ...


@runtime_checkable
class BatchEngine(AsyncEngine, Protocol):
    """A self-stepping engine that answers a batch task (llama.cpp's embeddings): each request runs as it
    comes, and the engine batches concurrent ones itself."""

    async def run(self, item: dict[str, Any], low: bool, started: Callable[[], None]) -> dict[str, Any]:
        """One request (the task's item; `low`: a batch line), `started` called as it goes to the model:
        its output, or `{"error": ...}` for bad input (the caller's 400). A failure of the engine's
        raises."""
        ...


SelfSteppingEngine = StreamingEngine | BatchEngine
"""What `runtime.worker.async_worker.AsyncWorker` hosts."""


@runtime_checkable
class Runner(Protocol):
    """An encoder runtime: an exported model loaded in it, its input names, and a call from arrays to
    arrays (the outputs named, in that order)."""

    input_names: list[str]

    def run(self, outputs: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]: ...


@runtime_checkable
class EncoderHandler(Protocol):
    """A batch handler whose torch model an encoder runtime may replace: it offers the model, the outputs
    it reads, how its inputs are made and how to put a runtime's model in its place."""

    def encoder_slot(self, state: Any) -> EncoderSlot: ...
