"""Decoding steps replayed from CUDA graphs: one kernel launch a step instead of hundreds.

A decoding step of a small batch costs the GPU well under a millisecond but costs Python and the
launches of a few hundred kernels about 10 ms. A CUDA graph records those launches once and replays
them; it needs fixed shapes and fixed memory, which the slot cache gives (`engines.native.kv_cache`):
running sequences are the cache's first rows, so a step reads a view of fixed size.

Graphs are captured per (batch bucket, length bucket): the batch is padded to the next bucket (padding
rows write to the scratch column and read one column), the keys read to the next length bucket. The
engine captures them all in its warm-up, so a warm or hot deployment's first request replays them; a
bucket first needed later is captured then. A capture that fails turns graphs off for the replica
(logged), which then runs every step eagerly as on CPU.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import torch

from modelhost.engines.native.attention import attention_kernels
from modelhost.engines.native.kv_cache import Plan, SlotCache

log = logging.getLogger("modelhost.generation")
BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
LENGTH_BUCKETS = (256, 512, 1024, 2048, 4096)  # longer reads run eagerly (attention dominates there)


class Decoding(Protocol):
    """What the graphs read of the engine that owns them: its model, its cache and its masks."""

    model: Any
    device: torch.device
    cache: SlotCache
    max_running: int

    def masks(self, allowed: torch.Tensor, positions: torch.Tensor) -> Any: ...


class DecodeGraphs:
    def __init__(self, engine: Decoding) -> None:
        self.engine = engine
        slots, capacity = engine.max_running, engine.cache.capacity
        self.batches = sorted({b for b in BATCH_BUCKETS if b < slots} | {slots})
        self.lengths = sorted(
            {n for n in LENGTH_BUCKETS if n < capacity} | {min(capacity, LENGTH_BUCKETS[-1])}
        )
        device = engine.device
        self.ids = torch.zeros((slots, 1), dtype=torch.long, device=device)
        self.positions = torch.zeros((slots, 1), dtype=torch.long, device=device)
        self.columns = torch.full((slots, 1), engine.cache.scratch, dtype=torch.long, device=device)
        self.rows = torch.arange(slots, device=device)[:, None]
        self.masks: dict[int, Any] = {}  # length bucket → the static mask(s) its graphs read
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool: Any = None
        self.disabled = False

    def fits(self, batch: int, longest: int) -> bool:
        return not self.disabled and batch <= self.batches[-1] and longest <= self.lengths[-1]

    def capture_all(self) -> None:
        """Every bucket's graph, largest first (smaller ones then reuse its memory)."""
        for length in reversed(self.lengths):
            for batch in reversed(self.batches):
                if self.disabled:
                    return
                self._graph(batch, length)

    def decode(self, last: list[int], lengths: list[int]) -> torch.Tensor | None:
        """The logits of one decoding step for sequences 0..n-1 (their last tokens and lengths); None
        when this step's graph failed to capture just now (the engine then runs the step eagerly)."""
        count = len(last)
        batch = next(b for b in self.batches if b >= count)
        length = next(n for n in self.lengths if n >= max(lengths))
        padded = torch.tensor(lengths + [1] * (batch - count), dtype=torch.long)
        tokens = torch.tensor(last + [0] * (batch - count), dtype=torch.long)
        columns = padded - 1
        columns[count:] = self.engine.cache.scratch
        device = self.engine.device
        self.ids[:batch, 0].copy_(tokens, non_blocking=True)
        self.positions[:batch, 0].copy_(padded - 1, non_blocking=True)
        self.columns[:batch, 0].copy_(columns, non_blocking=True)
        allowed = (torch.arange(length)[None, :] < padded[:, None])[:, None, None, :].to(device)
        self._fill_masks(length, batch, allowed)
        captured = self._graph(batch, length)
        if captured is None:
            return None
        graph, logits = captured
        graph.replay()
        return logits[:count]

    # ---------------------------------------------------------------- capture

    def _fill_masks(self, length: int, batch: int, allowed: torch.Tensor) -> None:
        masks = self.engine.masks(allowed, self.positions[:batch])
        static = self._static_masks(length)
        if isinstance(masks, dict):
            for kind, mask in masks.items():
                static[kind][:batch].copy_(mask)
        else:
            static[:batch].copy_(masks)

    def _static_masks(self, length: int) -> Any:
        if length not in self.masks:
            slots = self.engine.max_running
            allowed = torch.zeros((slots, 1, 1, length), dtype=torch.bool, device=self.engine.device)
            allowed[..., 0] = True
            self.masks[length] = self.engine.masks(allowed, self.positions)
        return self.masks[length]

    def _graph(self, batch: int, length: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor] | None:
        key = (batch, length)
        if key not in self.graphs and not self.disabled:
            try:
                self.graphs[key] = self._capture(batch, length)
            except Exception:  # a model or kernel that cannot be captured: eager from now on
                log.exception(
                    "CUDA graph capture failed (batch %d, length %d); decoding eagerly", batch, length
                )
                self.disabled = True
        return self.graphs.get(key)

    def _capture(self, batch: int, length: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        engine = self.engine
        static = self._static_masks(length)
        masks = {k: m[:batch] for k, m in static.items()} if isinstance(static, dict) else static[:batch]
        plan = Plan(self.rows[:batch], self.columns[:batch], None, length)
        saved = self.columns[:batch].clone()
        self.columns[:batch] = engine.cache.scratch  # rehearsals write nowhere that matters

        def forward() -> torch.Tensor:
            engine.cache.plan = plan
            with attention_kernels(engine.device):
                out = engine.model(
                    input_ids=self.ids[:batch],
                    attention_mask=masks,
                    position_ids=self.positions[:batch],
                    past_key_values=engine.cache,
                    use_cache=True,
                    logits_to_keep=1,
                )
            logits: torch.Tensor = out.logits[:, -1, :]
            return logits

        side = torch.cuda.Stream(engine.device)  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream(engine.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                forward()
        torch.cuda.current_stream(engine.device).wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = forward()
        self.columns[:batch].copy_(saved)
        return graph, logits
