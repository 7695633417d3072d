"""What a replica needs of an engine, and what every generation engine gives back.

A replica hosts one engine (docs/architecture.md, "Engines inside a replica"). Four host it today:

- modelhost's own engine (`engines.native`) is stepped by the replica's synchronous loop
  (`runtime.worker.sync_worker` → `runtime.worker.host.ReplicaHost` → the text-generation handler) between
  messages: requests join and leave between steps, and each step returns the events it made. That is `Engine`.
- vLLM's engine (`engines.vllm`) steps itself, in its own processes: its host (`runtime.worker.vllm_worker`,
  an asyncio loop) loads it, warms it up, runs each request with `generate`, aborts one, and watches
  whether it `errored`. Its requests end in the same `Event`s.
- llama.cpp's server (`engines.llamacpp`, GGUF files) steps itself too, in the worker's process: its
  host (`runtime.worker.llamacpp_worker`) shares the vLLM worker's asyncio loop
  (`runtime.worker.async_worker`) and the same `generate` / `abort` / `errored` shape.
- the encoder runtimes (`engines.encoders`) take the place of a batch handler's torch model when the
  replica loads (`prepare` over the handler's `EncoderSlot`); the host runs their batches through the
  handler, as it runs torch's.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from modelhost.generation.contract import GenerationEvent

Event = GenerationEvent
"""One event of one generation, alike from every generation engine (`generation.contract`: `Started`,
`Logprob`, `Text` with `finish` on the last, `Failed`)."""


@runtime_checkable
class Engine(Protocol):
    """What the replica's loop needs of an engine it steps: whether it has work, how many sequences it
    holds (the `Stats` answer and the generating gauge), cancelling one, one step, dropping everything
    after a step that failed, and a warm-up before the first request. Submitting a request is the
    engine's own shape (ours takes a `Sequence`), made by the handler that builds it."""

    @property
    def idle(self) -> bool: ...

    @property
    def held(self) -> int: ...

    def cancel(self, sequence_id: int) -> None: ...

    def step(self) -> list[tuple[int, Event]]:
        """One step for every sequence held; the events it made, each with its sequence's ID."""
        ...

    def abort(self) -> list[int]:
        """Drop every sequence (after a failed step, whose state cannot be trusted); their IDs."""
        ...

    def warm_up(self) -> None: ...
