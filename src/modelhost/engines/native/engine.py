"""The generation engine of a text-generation replica: continuous batching over one causal LM.

Every call to `step` runs one decoding step for all running sequences in a single forward pass.
Sequences join between steps (their prompt is prefilled on its own, then its KV cache is merged into
the batch's, left-padded) and leave between steps (finished, cancelled): nobody waits for the longest
request of a batch, and a cancelled request costs at most the step already running.

Each sequence keeps its own sampling parameters, random generator (a seed reproduces its output),
stop conditions and, for constrained decoding, its grammar matcher that masks the logits.
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from modelhost.engines.interface import Engine, Event
from modelhost.engines.native.attention import attention_kernels
from modelhost.engines.native.cuda_graphs import DecodeGraphs
from modelhost.engines.native.kv_cache import CacheLayout, Plan, SlotCache, common_prefix
from modelhost.errors import Overloaded
from modelhost.generation.contract import GenerationStarted, Logprob, Text, TokenLogprob
from modelhost.generation.fairness import (
    FAIR_SLOWDOWN,
    KeptShare,
    StepCosts,
    TokenWeights,
    VirtualTokenCounters,
)
from modelhost.generation.priority import BUSY_SECONDS, enqueue, low_cap
from modelhost.generation.requests import SamplingParams
from modelhost.generation.text import IncrementalDecoder, StopStrings

__all__ = ["Event", "GenerationEngine", "SamplingParams", "Sequence"]
HELD_BACK_POLL = 0.005  # seconds a step with only held-back low sequences waits


class Constraint:
    """What the engine needs of a grammar matcher (see `generation.grammar`)."""

    def allowed(self, vocab_size: int) -> torch.Tensor:  # bool [vocab_size]
        raise NotImplementedError

    def accept(self, token: int) -> None:
        raise NotImplementedError

    @property
    def done(self) -> bool:
        raise NotImplementedError


@dataclass(eq=False)
class Sequence:
    id: int
    prompt: list[int]
    params: SamplingParams
    decoder: IncrementalDecoder
    constraint: Constraint | None = None
    generated: list[int] = field(default_factory=list)
    stops: StopStrings = field(default_factory=lambda: StopStrings(()))
    generator: torch.Generator | None = None
    finish: str | None = None
    started: bool = False
    slot: int = -1  # its row of the KV cache, from admission on
    cached_tokens: int = 0  # prompt tokens reused from the cache
    low: bool = False  # flex or a batch line: held back behind interactive ones (`generation.priority`)
    priority: int = 0  # vLLM's number (lower first), which orders its key's own waiting sequences
    tenant: str = ""  # whom it runs for, `<account>/<key>` (`generation.fairness`)
    weights: tuple[float, float] = (1.0, 1.0)  # that tenant's, (account, key)
    decoded_at: int = 0  # the engine's decoding step that last gave it a token
    salt: str | None = None  # its prefix cache (`GenerationRequest.cache_salt`): it reuses only its salt's
    # a vision-language prompt: the processor's image tensors (`pixel_values`, ...) for its prefill. Its
    # image tokens are negative in `prompt` (a hash of the image and the position), so the prefix cache
    # tells different images apart; the model sees `image_token` there.
    images: dict[str, Any] | None = None
    image_token: int = -1
    # a continuation (`GenerationRequest.continued`): its prompt's last `carried` tokens are output the
    # replica that died had sent, counted as generated (limits, penalties, `completion_tokens`)
    carried: int = 0

    @property
    def reusable(self) -> int:
        """How many prompt tokens may come from the cache: all but the last (its logits give the first
        new token); for a prompt with images only those before the first image, whose features must
        all enter in one forward pass."""
        if self.params.prompt_logprobs:
            return 0
        if self.images is not None:
            return min(len(self.prompt) - 1, next((i for i, t in enumerate(self.prompt) if t < 0), 0))
        return len(self.prompt) - 1

    @property
    def length(self) -> int:
        return len(self.prompt) + len(self.generated)

    @property
    def produced(self) -> int:
        """Output tokens so far, those carried over included."""
        return self.carried + len(self.generated)

    @property
    def output(self) -> list[int]:
        return (
            [*self.prompt[len(self.prompt) - self.carried :], *self.generated]
            if self.carried
            else self.generated
        )


class GenerationEngine(Engine[Sequence]):
    """Continuous batching over one causal LM with a slot KV cache (`engines.native.kv_cache`): the
    stepped `Engine` of `engines.interface`, taking `Sequence`s.

    Sequences pass through three lists: `waiting` (no slot yet), `prefilling` (a slot, the prompt going
    into the cache a chunk at a time) and `running` (decoding, one token per step). Running sequences
    always hold slots `0..len(running)-1` in order, prefilling ones the next slots, so a decoding step
    reads a view of the cache's first rows."""

    vocab_size: int
    context_length: int

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        device: str,
        max_running: int,
        context_length: int,
        token_text: Callable[[int], str],
        *,
        cache_bytes: int | None = None,
        prefill_chunk: int | None = None,
        max_waiting: int = 4096,
        cuda_graphs: bool = True,
        clock: Callable[[], float] = time.monotonic,
        token_weights: TokenWeights | None = None,
    ) -> None:
        self.model = _with_attention_the_engine_masks(model)
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.context_length = context_length
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.eos_ids = _eos_ids(model, tokenizer)
        self._eos = torch.tensor(sorted(self.eos_ids), dtype=torch.long, device=self.device)
        self._token_text = token_text
        cuda = self.device.type == "cuda"
        layout = CacheLayout.of(model)
        budget = cache_bytes or default_cache_bytes(self.device, layout, context_length, max_running)
        self.max_running = layout.slots_for(budget, context_length, max_running)
        self.prefill_chunk = prefill_chunk or (2048 if cuda else 256)
        self.max_waiting = max_waiting
        self.cache = SlotCache(self.max_running, context_length, self.device, layout.dtype)
        self.waiting: deque[Sequence] = deque()
        self.prefilling: list[Sequence] = []
        self.running: list[Sequence] = []
        self.reused_tokens = 0  # prompt tokens taken from the cache instead of computed, ever
        self._clock = clock
        self._interactive_at = -BUSY_SECONDS  # when the last interactive sequence arrived
        self.served = VirtualTokenCounters(token_weights)  # whose turn it is (`generation.fairness`)
        self.step_costs = StepCosts()  # a decoding step's time by batch size, from the steps themselves
        self.fair_slowdown = FAIR_SLOWDOWN
        self._steps = 0  # decoding steps so far
        self._share = KeptShare()  # the decoding batch's share while tenants share it (`_shared`)
        self._pending: list[tuple[int, Event]] = []
        self._mask_value = torch.finfo(layout.dtype).min
        self._graphs: DecodeGraphs | None = DecodeGraphs(self) if cuda and cuda_graphs else None

    # ---------------------------------------------------------------- requests

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.prefilling and not self.running

    @property
    def cache_usage(self) -> float:
        """The fraction of the KV cache's slots that running and prefilling sequences hold: each holds
        a whole slot (a whole context's memory) whatever its length, and at 1 new sequences wait. Free
        slots keep prefixes for reuse, but any sequence may take them: they count as free."""
        return (len(self.running) + len(self.prefilling)) / self.max_running

    @property
    def held(self) -> int:
        """Sequences the engine holds, in any state."""
        return len(self.waiting) + len(self.prefilling) + len(self.running)

    def add(self, sequence: Sequence, low: bool = False) -> None:
        """Queue a sequence; `Overloaded` (429 for its caller) when too many already wait for a slot. It
        waits in the order of `generation.priority.enqueue`: a `low` one (flex, a batch line) behind every
        other, and admitted only into the room `_admit` leaves it."""
        if len(self.waiting) >= self.max_waiting:
            raise Overloaded(
                f"The model's {self.max_running} generation slots are busy and {self.max_waiting} "
                "requests already wait for one; retry later."
            )
        if sequence.params.seed is not None:  # a continuation's: a fresh stream, from the seed and the cut
            seed = sequence.params.seed + sequence.carried
            sequence.generator = torch.Generator(device=self.device).manual_seed(seed)
        sequence.stops = StopStrings(sequence.params.stop, include=sequence.params.include_stop_str_in_output)
        if sequence.carried:
            _replay(sequence)
        sequence.low = low
        if not low:
            self._interactive_at = self._clock()
        self.served.arrive(
            sequence.tenant,
            (s.tenant for s in (*self.waiting, *self.prefilling, *self.running)),
            sequence.weights,
        )
        enqueue(self.waiting, sequence)

    @torch.inference_mode()  # closing ranks moves cached keys and values: inference tensors
    def cancel(self, sequence_id: int) -> None:
        """Forget a sequence: before the next step starts, so its slot is free for that step."""
        self.waiting = deque(s for s in self.waiting if s.id != sequence_id)
        for sequence in (*self.prefilling, *self.running):
            if sequence.id == sequence_id:
                sequence.finish = "cancelled"
        self._drop_finished()

    def abort(self) -> list[int]:
        """Drop every sequence (after a failed step, whose state cannot be trusted); their IDs."""
        ids = [s.id for s in (*self.running, *self.prefilling, *self.waiting)]
        self.running, self.prefilling, self.waiting, self._pending = [], [], deque(), []
        self.cache.held = [[] for _ in range(self.cache.slots)]  # what a failed forward wrote is unknown
        return ids

    @torch.inference_mode()
    def warm_up(self) -> None:
        """Capture the decoding steps' CUDA graphs now (a hot or warm replica's first request is then as
        fast as its hundredth); nothing to do on CPU."""
        if self._graphs is not None:
            self._graphs.capture_all()

    # ---------------------------------------------------------------- stepping

    @torch.inference_mode()
    def step(self) -> list[tuple[int, Event]]:
        """Give waiting sequences free slots, prefill up to `prefill_chunk` prompt tokens, then one
        decoding step for all running sequences; the events of this step. A step that prefills the
        first request of a tenant with nothing running decodes only that tenant's sequences: its first
        token (sent when the step ends) does not wait for a decoding step of the others' whole batch
        (a light tenant's time to first token; the others lose one step)."""
        self._admit()
        arriving = {s.tenant for s in self.prefilling} - {s.tenant for s in self.running}
        if self.prefilling:
            self._prefill()
        decoding = self._decoding()
        if arriving and any(s.tenant not in arriving for s in decoding):
            decoding = [s for s in decoding if s.tenant in arriving]
        if decoding:
            started = time.perf_counter()
            self._decode(decoding)
            self.step_costs.record(len(decoding), time.perf_counter() - started)
        elif not self.prefilling and not self.idle:  # only held-back low sequences, waiting or paused
            time.sleep(HELD_BACK_POLL)  # rather than spinning until the interactive traffic's window ends
        self._drop_finished()
        events, self._pending = self._pending, []
        return events

    def _admit(self) -> None:
        """Waiting sequences take the next free slots: the first waiting one of the tenant that has been
        served least (`generation.fairness`), interactive ones before any low one; each starts from the
        longest prefix of its prompt any slot holds (`SlotCache.admit` chooses which free slot it takes:
        one holding that prefix, or the least recently used), and its tenant is charged the prompt
        tokens it computes. Low ones (all behind the others) take only the room
        `generation.priority.low_cap` leaves them: none while an interactive sequence is held, one while
        one arrived in the last `BUSY_SECONDS`, all slots but one otherwise."""
        while self.waiting and len(self.running) + len(self.prefilling) < self.max_running:
            index = self._next_waiting()
            sequence = self.waiting[index]
            if sequence.low and sum(s.low for s in (*self.running, *self.prefilling)) >= self._low_cap():
                return
            del self.waiting[index]
            target = len(self.running) + len(self.prefilling)
            length = self.cache.admit(sequence.prompt, sequence.reusable, target, sequence.salt)
            sequence.slot, sequence.cached_tokens = target, length
            self.reused_tokens += length
            self.served.charge(sequence.tenant, prompt=len(sequence.prompt) - length)
            self.prefilling.append(sequence)

    def _next_waiting(self) -> int:
        """The place in `waiting` of the sequence to admit next: among the interactive ones (all ahead
        of the low ones), or the low ones when none is, the first of the least served tenant."""
        low = self.waiting[0].low
        tenants = dict.fromkeys(s.tenant for s in self.waiting if s.low == low)
        if len(tenants) == 1:
            return 0
        turn = self.served.least(tenants)
        return next(i for i, s in enumerate(self.waiting) if s.low == low and s.tenant == turn)

    def _low_cap(self, waiting: bool = True) -> int:
        """How many low sequences may run now (`generation.priority.low_cap`), counting interactive
        sequences that wait (`waiting`: for admission) or only those holding slots (for pausing: one
        that waits while no slot is free, as when low ones fill a one-slot engine, waits for them)."""
        held = (*self.running, *self.prefilling, *(self.waiting if waiting else ()))
        interactive = any(not s.low for s in held)
        recent = self._clock() - self._interactive_at < BUSY_SECONDS
        return low_cap(self.max_running, interactive, recent)

    def _decoding(self) -> list[Sequence]:
        """The running sequences that decode this step: all of them, but while interactive traffic goes
        on only the oldest low ones `_low_cap` allows (none while an interactive sequence is held), the
        others paused in their slots (their caches kept) until it is over. Low sequences admitted when
        the engine was idle would otherwise slow every decoding step of the interactive ones that
        follow, for as long as they run. And when tenants share the batch, a light tenant's requests
        (fewer than an equal split) decode in a batch small enough that a step takes at most
        `fair_slowdown` × a step of one, the heaviest tenants' requests pausing in turns to make room
        (`generation.fairness.decoding_share`, with `step_costs` learnt from the steps)."""
        lows = [s for s in self.running if s.low]
        cap = self._low_cap(waiting=False) if lows else 0
        decoding = self.running
        if len(lows) > cap:
            going = {id(s) for s in sorted(lows, key=lambda s: s.id)[:cap]}
            decoding = [s for s in self.running if not s.low or id(s) in going]
        decoding = self._shared(decoding)
        if len(decoding) < len(self.running):
            self._to_front(decoding)
        return decoding

    def _shared(self, decoding: list[Sequence]) -> list[Sequence]:
        """`generation.fairness.decoding_share` of `decoding`, kept for `ROTATE_STEPS` steps (each new
        share moves sequences between slots) unless a sequence arrived or one of the share left."""
        return self._share.choose(
            decoding,
            self._steps,
            self.step_costs.cap(self.fair_slowdown),
            lambda s: s.id,
            lambda s: s.tenant,
            self.served,
            lambda s: self._steps - s.decoded_at,
        )

    def _to_front(self, decoding: list[Sequence]) -> None:
        """Move the sequences that decode this step into the first slots (each swapped with a paused one
        there), so that the step reads a view of the cache's first rows, not a gathered copy of them."""
        going = {id(s) for s in decoding}
        behind = [s for s in decoding if s.slot >= len(decoding)]
        ahead = [s for s in self.running if s.slot < len(decoding) and id(s) not in going]
        for sequence, paused in zip(behind, ahead, strict=True):
            self._move(sequence, paused.slot)
        self.running.sort(key=lambda s: s.slot)
        decoding.sort(key=lambda s: s.slot)

    def _prefill(self) -> None:
        """The next chunks of prompts in one forward pass (left-padded), within the token budget; a
        sequence whose whole prompt is in the cache samples its first token and starts running."""
        budget = self.prefill_chunk
        rows: list[tuple[Sequence, list[int], int]] = []  # sequence, its chunk, its first position
        for sequence in self._ready_to_prefill():
            done = len(self.cache.held[sequence.slot])
            left = len(sequence.prompt) - done
            whole = sequence.params.prompt_logprobs or sequence.images is not None
            take = left if whole else min(left, budget)
            if take <= 0 or (rows and (take > budget or sequence.images is not None)):
                break
            rows.append((sequence, sequence.prompt[done : done + take], done))
            budget -= take
            if budget <= 0 or sequence.images is not None:  # images: one prompt per forward pass
                break
        if not rows:
            return
        images = rows[0][0].images
        width = max(len(chunk) for _, chunk, _ in rows)
        read_length = _round_up(max(start + len(chunk) for _, chunk, start in rows), 64, self.context_length)
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        positions = torch.zeros((len(rows), width), dtype=torch.long)
        columns = torch.full((len(rows), width), self.cache.scratch, dtype=torch.long)
        mask = torch.zeros((len(rows), 1, width, read_length), dtype=torch.bool)
        mask[:, :, :, 0] = True  # padding queries look at one harmless column (never all -inf)
        for row, (_, chunk, start) in enumerate(rows):
            pad = width - len(chunk)
            span = torch.arange(start, start + len(chunk))
            ids[row, pad:] = torch.tensor(chunk)
            positions[row, pad:] = span
            columns[row, pad:] = span
            mask[row, 0, pad:, :] = torch.arange(read_length)[None, :] <= span[:, None]
        slots = torch.tensor([s.slot for s, _, _ in rows])
        self.cache.plan = Plan(
            slots[:, None].expand(-1, width).to(self.device),
            columns.to(self.device),
            slots.to(self.device),
            read_length,
        )
        keep = 0 if any(s.params.prompt_logprobs for s, _, _ in rows) else 1
        if images is not None:
            ids[ids < 0] = rows[0][0].image_token
        logits = self._forward(ids, positions, mask, logits_to_keep=keep, extra=images).float()
        finished: list[tuple[int, Sequence]] = []
        for row, (sequence, chunk, _) in enumerate(rows):
            self.cache.held[sequence.slot] += chunk
            if len(self.cache.held[sequence.slot]) == len(sequence.prompt):
                finished.append((row, sequence))
        if not finished:
            return
        for row, sequence in finished:
            started = GenerationStarted(
                prompt_tokens=len(sequence.prompt), cached_tokens=sequence.cached_tokens
            )
            if sequence.params.prompt_logprobs:
                own = logits[row, width - len(sequence.prompt) :]
                started.prompt_logprobs = self._prompt_logprobs(sequence, own)
            sequence.started = True
            self._pending.append((sequence.id, started))
        sequences = [sequence for _, sequence in finished]
        tokens = self._sample(sequences, logits[[row for row, _ in finished], -1, :])
        for sequence, token in zip(sequences, tokens, strict=True):
            self._emit(sequence, token)
            self.prefilling.remove(sequence)
            if sequence.finish is None:  # it runs: into the first slot after the running ones
                self._move(sequence, len(self.running))
                self.running.append(sequence)
            else:
                self._free(sequence)

    def _ready_to_prefill(self) -> list[Sequence]:
        """The prefilling sequences that can go on this step, each first taking the longest prefix of
        its prompt that any slot holds by now. One whose prompt shares more with a sequence ahead of it
        that is still being prefilled waits for that one (64 requests with one system prompt compute
        it once, not 64 times)."""
        ready: list[Sequence] = []
        for index, sequence in enumerate(self.prefilling):
            if sequence.params.prompt_logprobs:
                ready.append(sequence)
                continue
            limit = sequence.reusable
            done = len(self.cache.held[sequence.slot])
            source, length = self.cache.longest_prefix(sequence.prompt, limit, sequence.salt)
            if length > done and source != sequence.slot:
                self.cache.copy_prefix(source, sequence.slot, length)
                sequence.cached_tokens += length - done
                self.reused_tokens += length - done
                done = length
            ahead = max(
                (
                    common_prefix(s.prompt, sequence.prompt, limit)
                    for s in self.prefilling[:index]
                    if s.salt == sequence.salt
                ),
                default=0,
            )
            if ahead <= done:
                ready.append(sequence)
        return ready

    def _decode(self, decoding: list[Sequence]) -> None:
        """One token for each of `decoding` (the running sequences, or those not paused): each feeds its
        last token at its last position."""
        lengths = [s.length for s in decoding]
        last = [s.generated[-1] for s in decoding]
        for sequence, token in zip(decoding, last, strict=True):
            self.cache.held[sequence.slot].append(token)
        logits = None
        every = len(decoding) == len(self.running)
        first = all(s.slot == row for row, s in enumerate(decoding))  # a view of the cache's first rows
        if every and self._graphs is not None and self._graphs.fits(len(lengths), max(lengths)):
            logits = self._graphs.decode(last, lengths)
        if logits is None:  # no graph for this step (or its capture failed just now): eagerly
            logits = self._decode_eagerly(last, lengths, None if first else [s.slot for s in decoding])
        tokens = self._sample(decoding, logits.float())
        self._steps += 1
        for sequence, token in zip(decoding, tokens, strict=True):
            sequence.decoded_at = self._steps
            self._emit(sequence, token)

    def _decode_eagerly(self, last: list[int], lengths: list[int], slots: list[int] | None) -> torch.Tensor:
        """A decoding step without a graph, for the first running rows or (`slots`) some of them."""
        batch = len(last)
        read_length = _round_up(max(lengths), 64, self.context_length)
        columns = torch.tensor(lengths)[:, None] - 1
        mask = (torch.arange(read_length)[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :]
        rows = torch.arange(batch) if slots is None else torch.tensor(slots)
        read = None if slots is None else rows.to(self.device)
        self.cache.plan = Plan(rows[:, None].to(self.device), columns.to(self.device), read, read_length)
        return self._forward(torch.tensor(last)[:, None], columns, mask, logits_to_keep=1)[:, -1, :]

    def _forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        allowed: torch.Tensor,
        logits_to_keep: int,
        extra: dict[str, Any] | None = None,
    ) -> torch.Tensor:
        """The model's logits for `ids` at `positions`, attending where `allowed` (bool, `[batch, 1,
        query, read_length]`) says; keys and values go where the cache's plan says. `extra`: a
        vision-language prompt's image tensors."""
        device = self.device
        positions = positions.to(device)
        inputs = {k: v.to(device) for k, v in (extra or {}).items()}
        if "pixel_values" in inputs:
            inputs["pixel_values"] = inputs["pixel_values"].to(self.cache.dtype)
        with attention_kernels(device):
            out = self.model(
                input_ids=ids.to(device),
                attention_mask=self.masks(allowed.to(device), positions),
                position_ids=positions,
                past_key_values=self.cache,
                use_cache=True,
                logits_to_keep=logits_to_keep,
                **inputs,
            )
        logits: torch.Tensor = out.logits
        return logits

    def masks(self, allowed: torch.Tensor, positions: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor]:
        """Additive attention masks as the model takes them: one tensor, or one per layer type for
        models that name their layers' types (they take a dict and use each as it is). Sliding-window
        layers also drop the keys more than their window behind each query."""
        config = self.model.config.get_text_config()
        window = int(getattr(config, "sliding_window", None) or 0)
        types = getattr(config, "layer_types", None)

        def additive(allowed: torch.Tensor) -> torch.Tensor:
            mask = torch.zeros(allowed.shape, dtype=self.cache.dtype, device=allowed.device)
            return mask.masked_fill_(~allowed, self._mask_value)

        def windowed() -> torch.Tensor:
            columns = torch.arange(allowed.shape[-1], device=allowed.device)
            near: torch.Tensor = columns[None, None, :] > positions[:, :, None] - window
            return allowed & near[:, None]

        if types:
            return {
                kind: additive(windowed() if kind == "sliding_attention" and window else allowed)
                for kind in set(types)
            }
        if window and getattr(config, "use_sliding_window", True):
            return additive(windowed())
        return additive(allowed)

    def _move(self, sequence: Sequence, slot: int) -> None:
        """Put `sequence` in `slot`, swapping with whichever sequence (or cached content) was there."""
        if sequence.slot == slot:
            return
        other = next((s for s in (*self.running, *self.prefilling) if s.slot == slot), None)
        self.cache.swap(sequence.slot, slot)
        if other is not None:
            other.slot = sequence.slot
        sequence.slot = slot

    def _free(self, sequence: Sequence) -> None:
        """A sequence that left its slot: the slot moves past the prefilling ones (keeping running and
        prefilling slots first), its contents stay for prefix reuse, as used now."""
        self.cache.touch(sequence.slot)
        if self.prefilling:
            last = max(self.prefilling, key=lambda s: s.slot)
            if last.slot > sequence.slot:
                self.cache.swap(last.slot, sequence.slot)
                last.slot, sequence.slot = sequence.slot, last.slot

    def _drop_finished(self) -> None:
        """Finished and cancelled sequences leave; the running ones close ranks in slots 0..n-1."""
        for sequence in [s for s in self.prefilling if s.finish is not None]:
            self.prefilling.remove(sequence)
            self._free(sequence)
        while any(s.finish is not None for s in self.running):
            index = next(i for i, s in enumerate(self.running) if s.finish is not None)
            gone, tail = self.running[index], self.running[-1]
            if tail is not gone:
                self.cache.swap(gone.slot, tail.slot)
                gone.slot, tail.slot = tail.slot, gone.slot
                self.running[index] = tail
            self.running.pop()
            self._free(gone)

    # ---------------------------------------------------------------- sampling

    def _sample(self, sequences: list[Sequence], logits: torch.Tensor) -> list[int]:
        """One token per row of `logits` (raw model scores), each under its sequence's parameters.
        Greedy rows without logits processing (the common case) take one argmax for all of them."""
        logprobs = torch.log_softmax(logits, dim=-1) if any(s.params.logprobs for s in sequences) else None
        early = [r for r, s in enumerate(sequences) if s.produced < s.params.min_tokens]
        processed = [r for r, s in enumerate(sequences) if self._needs_processing(s)]
        if early or processed:
            logits = logits.clone()
        if early and self.eos_ids:  # `min_tokens` not reached: no end of sequence yet
            logits[torch.tensor(early, device=logits.device)[:, None], self._eos[None, :]] = -math.inf
        for row in early:  # nor any of its stop tokens
            if sequences[row].params.stop_token_ids:
                logits[row, list(sequences[row].params.stop_token_ids)] = -math.inf
        for row in processed:
            self._process(sequences[row], logits[row])
        tokens: list[int] = torch.argmax(logits, dim=-1).tolist()
        for row, sequence in enumerate(sequences):
            params = sequence.params
            if params.temperature != 0:
                probs = _truncated(torch.softmax(logits[row] / params.temperature, dim=-1), params)
                tokens[row] = int(torch.multinomial(probs, 1, generator=sequence.generator))
            if logprobs is not None and params.logprobs:
                entry = self._logprob(logprobs[row], tokens[row], params)
                self._pending.append((sequence.id, Logprob(entry)))
        return tokens

    def _needs_processing(self, sequence: Sequence) -> bool:
        params = sequence.params
        penalized = sequence.produced and (params.presence_penalty or params.frequency_penalty)
        repeated = params.repetition_penalty != 1.0
        return bool(penalized or repeated or params.logit_bias or sequence.constraint is not None)

    def _process(self, sequence: Sequence, scores: torch.Tensor) -> None:
        """Penalties, the logit bias and the grammar's mask applied to one row's scores, in place. The
        mask comes last, so no bias can bring back a token the grammar forbids (nor an end of sequence
        before `min_tokens`, already -inf)."""
        params = sequence.params
        if params.repetition_penalty != 1.0:
            _repetition_penalty(scores, sequence, params.repetition_penalty)
        if sequence.produced and (params.presence_penalty or params.frequency_penalty):
            counts = torch.bincount(
                torch.tensor(sequence.output, device=scores.device), minlength=scores.shape[0]
            )[: scores.shape[0]].to(scores.dtype)
            scores -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).to(
                scores.dtype
            )
        if params.logit_bias:
            tokens = torch.tensor([t for t, _ in params.logit_bias], device=scores.device)
            biases = torch.tensor([b for _, b in params.logit_bias], dtype=scores.dtype, device=scores.device)
            scores.index_add_(0, tokens, biases)
        if sequence.constraint is not None:
            scores.masked_fill_(~sequence.constraint.allowed(self.vocab_size).to(scores.device), -math.inf)

    def _logprob(self, logprobs: torch.Tensor, token: int, params: SamplingParams) -> TokenLogprob:
        entry = TokenLogprob(self._token_text(token), token, float(logprobs[token]))
        if params.top_logprobs:
            values, ids = torch.topk(logprobs, params.top_logprobs)
            entry.top = [(self._token_text(int(i)), float(v)) for v, i in zip(values, ids, strict=True)]
        return entry

    def _prompt_logprobs(self, sequence: Sequence, logits: torch.Tensor) -> list[TokenLogprob]:
        logprobs = torch.log_softmax(logits[:-1], dim=-1)
        first = sequence.prompt[0]
        entries = [TokenLogprob(self._token_text(first), first)]
        for position, token in enumerate(sequence.prompt[1:]):
            entries.append(self._logprob(logprobs[position], token, sequence.params))
        return entries

    # ---------------------------------------------------------------- output

    def _emit(self, sequence: Sequence, token: int) -> None:
        """Record a sampled token, release its text, decide whether the sequence is finished."""
        params = sequence.params
        ready = sequence.produced >= params.min_tokens
        is_eos = ready and token in self.eos_ids and not params.ignore_eos
        # a stop token (`stop_token_ids`) ends it as the end of sequence does: not in the text nor
        # counted, unless `include_stop_str_in_output` (then both, as vLLM)
        stop_token = ready and token in params.stop_token_ids
        silent = is_eos or (stop_token and not params.include_stop_str_in_output)
        if sequence.constraint is not None and not silent:
            sequence.constraint.accept(token)
        finish: str | None = None
        if silent:
            text, finish, added = "", "stop", []
        else:
            added = [token]
            sequence.generated.append(token)
            self.served.charge(sequence.tenant, output=1)
            text = sequence.stops.feed(sequence.decoder.push(token))
            finish = "stop" if sequence.stops.stopped or stop_token else None
            if finish is None and sequence.constraint is not None and sequence.constraint.done:
                finish = "stop"
            if finish is None and (
                sequence.produced >= params.max_tokens or sequence.length >= self.context_length
            ):
                finish = "length"
        if finish is not None:
            text += sequence.stops.feed(sequence.decoder.flush()) + sequence.stops.flush()
            sequence.finish = finish
        self._pending.append(
            (
                sequence.id,
                Text(text=text, completion_tokens=sequence.produced, finish=finish, token_ids=added),
            )
        )


def _replay(sequence: Sequence) -> None:
    """A continuation's carried tokens through what `_emit` keeps per sequence (the grammar's state, the
    text decoder's, the stop strings'), their text dropped: the replica that died sent it. What comes
    next is then decoded, matched and constrained exactly as on the replica it left."""
    for token in sequence.prompt[len(sequence.prompt) - sequence.carried :]:
        if sequence.constraint is not None:
            sequence.constraint.accept(token)
        sequence.stops.feed(sequence.decoder.push(token))


def default_cache_bytes(device: torch.device, layout: CacheLayout, context_length: int, slots: int) -> int:
    """The KV cache's memory when the operator sets none (`MODELHOST_KV_CACHE_MB`): on CUDA half of
    what is free once the model is loaded; on CPU enough for `slots` whole contexts, but at most an
    eighth of the machine's memory (the benchmark's 33 M model with 2048 tokens: 44 slots on 24 GB)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * 0.5)
    wanted = slots * (context_length + 1) * layout.bytes_per_token
    return min(wanted, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 8)


def _with_attention_the_engine_masks(model: Any) -> Any:
    """The engine passes its own additive masks, which `sdpa` and `eager` attention take as they are."""
    if model.config._attn_implementation not in ("sdpa", "eager"):
        model.set_attn_implementation("sdpa")
    return model


def _round_up(value: int, step: int, most: int) -> int:
    return min(most, -(-value // step) * step)


def _repetition_penalty(scores: torch.Tensor, sequence: Sequence, penalty: float) -> None:
    """Every token of the prompt and the output so far made less likely (above 1) or more (below), as
    transformers and vLLM do: a positive score divided by `penalty`, a negative one multiplied. Image
    placeholders (negative IDs in the prompt) are no tokens of the vocabulary."""
    seen = [t for t in (*sequence.prompt, *sequence.generated) if 0 <= t < scores.shape[0]]
    if not seen:
        return
    tokens = torch.tensor(sorted(set(seen)), device=scores.device)
    chosen = scores[tokens]
    scores[tokens] = torch.where(chosen > 0, chosen / penalty, chosen * penalty)


def _truncated(probs: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution to sample from, in transformers' order: the `top_k` most likely tokens, of those
    the smallest set whose probability reaches `top_p` (nucleus), then those at least `min_p` times as
    likely as the most likely one. Weights, not renormalised: `torch.multinomial` needs no sum of 1."""
    if params.top_k > 0 and params.top_k < probs.shape[-1]:
        values, ids = torch.topk(probs, params.top_k)
        probs = torch.zeros_like(probs).scatter_(-1, ids, values)
    if params.top_p < 1.0:
        ordered, order = torch.sort(probs, descending=True)
        outside = torch.cumsum(ordered, dim=-1) - ordered > params.top_p * ordered.sum()
        ordered[outside] = 0
        probs = torch.zeros_like(probs).scatter_(-1, order, ordered)
    if params.min_p > 0:
        probs = torch.where(probs >= params.min_p * probs.max(), probs, torch.zeros_like(probs))
    return probs


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(v for v in value if isinstance(v, int))
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)
