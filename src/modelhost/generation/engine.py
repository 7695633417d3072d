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
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache

from modelhost.generation.text import IncrementalDecoder, StopStrings

Event = dict[str, Any]


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: bool = False
    top_logprobs: int = 0
    prompt_logprobs: bool = False


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

    @property
    def length(self) -> int:
        return len(self.prompt) + len(self.generated)


class GenerationEngine:
    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        device: str,
        max_running: int,
        context_length: int,
        token_text: Callable[[int], str],
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.max_running = max_running
        self.context_length = context_length
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.eos_ids = _eos_ids(model, tokenizer)
        self._token_text = token_text
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._cache: DynamicCache | None = None
        self._mask = torch.zeros((0, 0), dtype=torch.long, device=self.device)
        self._positions = torch.zeros(0, dtype=torch.long, device=self.device)
        self._next = torch.zeros(0, dtype=torch.long, device=self.device)
        self._pending: list[tuple[int, Event]] = []

    # ---------------------------------------------------------------- requests

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def add(self, sequence: Sequence) -> None:
        if sequence.params.seed is not None:
            sequence.generator = torch.Generator(device=self.device).manual_seed(sequence.params.seed)
        sequence.stops = StopStrings(sequence.params.stop)
        self.waiting.append(sequence)

    def cancel(self, sequence_id: int) -> None:
        """Forget a sequence: before the next step starts, so its slot is free for that step."""
        self.waiting = deque(s for s in self.waiting if s.id != sequence_id)
        for sequence in self.running:
            if sequence.id == sequence_id:
                sequence.finish = "cancelled"
        self._drop_finished()

    def abort(self) -> list[int]:
        """Drop every sequence (after a failed step, whose state cannot be trusted); their IDs."""
        ids = [s.id for s in (*self.running, *self.waiting)]
        self.running, self.waiting, self._cache, self._pending = [], deque(), None, []
        return ids

    # ---------------------------------------------------------------- stepping

    @torch.inference_mode()
    def step(self) -> list[tuple[int, Event]]:
        """Admit waiting sequences (one batched prefill), then one decoding step for all running ones;
        the events of this step."""
        admitted: list[Sequence] = []
        while self.waiting and len(self.running) + len(admitted) < self.max_running:
            admitted.append(self.waiting.popleft())
        if admitted:
            self._prefill(admitted)
        if self.running:
            self._decode()
        self._drop_finished()
        events, self._pending = self._pending, []
        return events

    def _prefill(self, sequences: list[Sequence]) -> None:
        """All new prompts in one forward pass (left-padded), each then sampling its first token;
        those that go on join the running batch."""
        width = max(len(s.prompt) for s in sequences)
        ids = torch.zeros((len(sequences), width), dtype=torch.long, device=self.device)
        mask = torch.zeros_like(ids)
        for row, sequence in enumerate(sequences):
            length = len(sequence.prompt)
            ids[row, width - length :] = torch.tensor(sequence.prompt, device=self.device)
            mask[row, width - length :] = 1
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        cache = DynamicCache()
        keep = 0 if any(s.params.prompt_logprobs for s in sequences) else 1
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=keep,
        )
        logits = out.logits.float()
        for row, sequence in enumerate(sequences):
            started: Event = {"started": True, "prompt_tokens": len(sequence.prompt)}
            if sequence.params.prompt_logprobs:
                own = logits[row, width - len(sequence.prompt) :]
                started["prompt_logprobs"] = self._prompt_logprobs(sequence, own)
            sequence.started = True
            self._pending.append((sequence.id, started))
        tokens = self._sample(sequences, logits[:, -1, :])
        for sequence, token in zip(sequences, tokens, strict=True):
            self._emit(sequence, token)
        going = [row for row, s in enumerate(sequences) if s.finish is None]
        if going:
            index = torch.tensor(going, device=self.device)
            for layer in _layers(cache):
                layer.keys, layer.values = layer.keys[index], layer.values[index]
            self._join(
                [sequences[r] for r in going],
                cache,
                mask[index],
                positions[index, -1] + 1,
                [tokens[r] for r in going],
            )

    def _join(
        self,
        sequences: list[Sequence],
        cache: DynamicCache,
        mask: torch.Tensor,
        positions: torch.Tensor,
        tokens: list[int],
    ) -> None:
        """Merge prefilled sequences (their cache, mask, next positions and tokens) into the running
        batch, left-padding whichever side is shorter."""
        next_tokens = torch.tensor(tokens, device=self.device)
        if self._cache is None or not self.running:
            self._cache, self._mask, self._positions, self._next = cache, mask, positions, next_tokens
            self.running = list(sequences)
            return
        width = max(self._mask.shape[1], mask.shape[1])
        for ours, theirs in zip(_layers(self._cache), _layers(cache), strict=True):
            ours.keys = torch.cat([_left_pad(ours.keys, width), _left_pad(theirs.keys, width)])
            ours.values = torch.cat([_left_pad(ours.values, width), _left_pad(theirs.values, width)])
        self._mask = torch.cat([_left_pad_mask(self._mask, width), _left_pad_mask(mask, width)])
        self._positions = torch.cat([self._positions, positions])
        self._next = torch.cat([self._next, next_tokens])
        self.running += sequences

    def _decode(self) -> None:
        ones = torch.ones((len(self.running), 1), dtype=torch.long, device=self.device)
        self._mask = torch.cat([self._mask, ones], dim=1)
        out = self.model(
            input_ids=self._next[:, None],
            attention_mask=self._mask,
            position_ids=self._positions[:, None],
            past_key_values=self._cache,
            use_cache=True,
        )
        self._positions = self._positions + 1
        tokens = self._sample(self.running, out.logits[:, -1, :].float())
        self._next = torch.tensor(tokens, device=self.device)
        for sequence, token in zip(self.running, tokens, strict=True):
            self._emit(sequence, token)

    def _drop_finished(self) -> None:
        keep = [i for i, s in enumerate(self.running) if s.finish is None]
        if len(keep) == len(self.running):
            return
        self.running = [self.running[i] for i in keep]
        if not keep or self._cache is None:
            self._cache, self.running = None, []
            return
        index = torch.tensor(keep, device=self.device)
        self._mask, self._positions, self._next = self._mask[index], self._positions[index], self._next[index]
        first = int(self._mask.any(dim=0).nonzero()[0])  # columns that are padding in every row go
        self._mask = self._mask[:, first:]
        for layer in _layers(self._cache):
            layer.keys = layer.keys[index, :, first:]
            layer.values = layer.values[index, :, first:]

    # ---------------------------------------------------------------- sampling

    def _sample(self, sequences: list[Sequence], logits: torch.Tensor) -> list[int]:
        """One token per row of `logits` (raw model scores), each under its sequence's parameters."""
        logprobs = torch.log_softmax(logits, dim=-1) if any(s.params.logprobs for s in sequences) else None
        logits = logits.clone()
        for row, sequence in enumerate(sequences):
            self._process(sequence, logits[row])
        tokens: list[int] = []
        for row, sequence in enumerate(sequences):
            params = sequence.params
            if params.temperature == 0:
                token = int(torch.argmax(logits[row]))
            else:
                probs = _top_p(torch.softmax(logits[row] / params.temperature, dim=-1), params.top_p)
                token = int(torch.multinomial(probs, 1, generator=sequence.generator))
            tokens.append(token)
            if logprobs is not None and params.logprobs:
                self._pending.append((sequence.id, {"logprob": self._logprob(logprobs[row], token, params)}))
        return tokens

    def _process(self, sequence: Sequence, scores: torch.Tensor) -> None:
        """Penalties, the grammar's mask and `min_tokens` applied to one row's scores, in place."""
        params = sequence.params
        if sequence.generated and (params.presence_penalty or params.frequency_penalty):
            counts = torch.bincount(
                torch.tensor(sequence.generated, device=scores.device), minlength=scores.shape[0]
            )[: scores.shape[0]].to(scores.dtype)
            scores -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).to(
                scores.dtype
            )
        if sequence.constraint is not None:
            scores.masked_fill_(~sequence.constraint.allowed(self.vocab_size).to(scores.device), -math.inf)
        if len(sequence.generated) < params.min_tokens and self.eos_ids:
            scores[list(self.eos_ids)] = -math.inf

    def _logprob(self, logprobs: torch.Tensor, token: int, params: SamplingParams) -> Event:
        entry: Event = {"token": self._token_text(token), "id": token, "logprob": float(logprobs[token])}
        if params.top_logprobs:
            values, ids = torch.topk(logprobs, params.top_logprobs)
            entry["top"] = [[self._token_text(int(i)), float(v)] for v, i in zip(values, ids, strict=True)]
        return entry

    def _prompt_logprobs(self, sequence: Sequence, logits: torch.Tensor) -> list[Event | None]:
        logprobs = torch.log_softmax(logits[:-1], dim=-1)
        first = sequence.prompt[0]
        entries: list[Event | None] = [
            {"token": self._token_text(first), "id": first, "logprob": None, "top": None}
        ]
        for position, token in enumerate(sequence.prompt[1:]):
            entries.append(self._logprob(logprobs[position], token, sequence.params))
        return entries

    # ---------------------------------------------------------------- output

    def _emit(self, sequence: Sequence, token: int) -> None:
        """Record a sampled token, release its text, decide whether the sequence is finished."""
        params = sequence.params
        is_eos = token in self.eos_ids and len(sequence.generated) >= params.min_tokens
        if sequence.constraint is not None and not is_eos:
            sequence.constraint.accept(token)
        finish: str | None = None
        if is_eos:
            text, finish = "", "stop"
        else:
            sequence.generated.append(token)
            text = sequence.stops.feed(sequence.decoder.push(token))
            finish = "stop" if sequence.stops.stopped else None
            if finish is None and sequence.constraint is not None and sequence.constraint.done:
                finish = "stop"
            if finish is None and (
                len(sequence.generated) >= params.max_tokens or sequence.length >= self.context_length
            ):
                finish = "length"
        if finish is not None:
            text += sequence.stops.feed(sequence.decoder.flush()) + sequence.stops.flush()
            sequence.finish = finish
        event: Event = {"text": text, "completion_tokens": len(sequence.generated)}
        if finish is not None:
            event["finish"] = finish
        self._pending.append((sequence.id, event))


def _layers(cache: DynamicCache) -> list[Any]:
    """The cache's layers; `DynamicCache()` holds only full-attention `DynamicLayer`s (keys, values)."""
    return list(cache.layers)


def _left_pad(states: torch.Tensor, width: int) -> torch.Tensor:
    """[batch, heads, length, dim] → [batch, heads, width, dim] with zeros in front."""
    missing = width - states.shape[2]
    if missing == 0:
        return states
    pad = states.new_zeros((states.shape[0], states.shape[1], missing, states.shape[3]))
    return torch.cat([pad, states], dim=2)


def _left_pad_mask(mask: torch.Tensor, width: int) -> torch.Tensor:
    missing = width - mask.shape[1]
    return mask if missing == 0 else torch.cat([mask.new_zeros((mask.shape[0], missing)), mask], dim=1)


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches `top_p` (nucleus)."""
    if top_p >= 1.0:
        return probs
    ordered, order = torch.sort(probs, descending=True)
    outside = torch.cumsum(ordered, dim=-1) - ordered > top_p
    ordered[outside] = 0
    return torch.zeros_like(probs).scatter_(-1, order, ordered)


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
