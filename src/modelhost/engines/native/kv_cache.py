"""The KV cache of a generation engine: one block of memory per replica, in slots, allocated once.

Every layer keeps its keys and values in one tensor `[slots, kv_heads, capacity + 1, head_dim]`. A
sequence owns one slot for its whole life and its token at position `p` lives in column `p`, so a
decoding step writes one column per sequence and reads the first columns of the first rows: a view,
never a copy, and the same shapes step after step (what CUDA graphs need). The extra last column is
scratch: padding rows and padding tokens write there, and no mask ever lets attention read it.

A slot keeps its keys and values after its sequence leaves, and `held` remembers which tokens they
belong to, so a new prompt that starts with the same tokens (a shared system prompt, an agent's growing
conversation) copies them instead of computing them again (see docs/generation.md). Which free slot a
new sequence takes is `admit`'s choice: the one holding most of its prompt's prefix when little else is
lost, else the least recently used one (`used`), so a replica keeps as many prefixes as it has free
slots. Every chat prompt shares its template's first tokens: taking the slot of the longest match
whatever it held would let such a short match wipe out a long prefix.

A slot's content also has a salt (`salts`, a request's `cache_salt`: docs/access.md, "Cache salts"): a
prefix is reused only by a sequence of the same salt, so what one key's prompts left in the cache never
shortens (and so never reveals, through `cached_tokens`) another salt's prompt.

The cache duck-types the part of transformers' `Cache` that decoder models call: `update(keys,
values, layer_idx)` stores this forward's keys and values where the engine's `plan` says and returns
what attention reads. The engine passes its own 4D attention mask, which transformers uses as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class CacheLayout:
    """How much memory a token costs, from the model's config; and so how many slots fit a budget."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @classmethod
    def of(cls, model: Any) -> CacheLayout:
        config = model.config.get_text_config()
        heads = int(config.num_attention_heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        dtype = next(model.parameters()).dtype
        return cls(int(config.num_hidden_layers), kv_heads, head_dim, dtype)

    @property
    def bytes_per_token(self) -> int:
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.layers * self.kv_heads * self.head_dim * itemsize

    def slots_for(self, budget_bytes: int, capacity: int, most: int) -> int:
        """Slots of `capacity` tokens that fit `budget_bytes`: at least 1, at most `most`."""
        per_slot = self.bytes_per_token * (capacity + 1)
        return max(1, min(most, budget_bytes // per_slot))


@dataclass
class Plan:
    """Where one forward pass writes and what it reads (set by the engine before each forward).

    `write_rows`/`write_columns` are `[batch, query_length]` slot and column indices of each input token;
    `read_rows` are the slots each batch row reads (None: rows `0..batch-1`, a view), `read_length` the
    columns it reads."""

    write_rows: torch.Tensor
    write_columns: torch.Tensor
    read_rows: torch.Tensor | None
    read_length: int


class SlotCache:
    def __init__(self, slots: int, capacity: int, device: torch.device, dtype: torch.dtype) -> None:
        self.slots, self.capacity = slots, capacity
        self.scratch = capacity  # the column padding writes to
        self.device, self.dtype = device, dtype
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.held: list[list[int]] = [[] for _ in range(slots)]  # tokens whose keys/values each slot holds
        self.salts: list[str | None] = [None] * slots  # the salt of the sequence that computed them
        self.used: list[int] = [0] * slots  # when each slot was last used, on `clock` (moves with `swap`)
        self.clock = 0
        self.plan: Plan | None = None

    # ---------------------------------------------------------------- what the model calls

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *_: Any, **__: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this forward's `[batch, kv_heads, query, head_dim]` keys and values; what attention
        reads: `[batch, kv_heads, read_length, head_dim]`."""
        if layer_idx == len(self.keys):  # first forward: the layer's memory, in its real shape
            shape = (self.slots, key_states.shape[1], self.capacity + 1, key_states.shape[3])
            self.keys.append(torch.zeros(shape, dtype=key_states.dtype, device=self.device))
            self.values.append(torch.zeros(shape, dtype=value_states.dtype, device=self.device))
        plan = self.plan
        assert plan is not None, "the engine sets a plan before every forward"
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        keys[plan.write_rows, :, plan.write_columns] = key_states.transpose(1, 2)
        values[plan.write_rows, :, plan.write_columns] = value_states.transpose(1, 2)
        if plan.read_rows is None:
            batch = key_states.shape[0]
            return keys[:batch, :, : plan.read_length], values[:batch, :, : plan.read_length]
        return keys[plan.read_rows, :, : plan.read_length], values[plan.read_rows, :, : plan.read_length]

    def get_seq_length(self, layer_idx: int = 0) -> int:  # asked by models only without position IDs
        return 0

    # ---------------------------------------------------------------- moving slots

    def touch(self, slot: int) -> None:
        """`slot` was used now (its content reused, or a sequence joined or left it)."""
        self.clock += 1
        self.used[slot] = self.clock

    def copy_prefix(self, source: int, target: int, length: int) -> None:
        """Make `target` hold the first `length` tokens of `source` (a reused prompt prefix); both count
        as used now, the source first (a prefix just reused is worth keeping)."""
        for tensors in (self.keys, self.values):
            for layer in tensors:
                layer[target, :, :length] = layer[source, :, :length]
        self.held[target] = self.held[source][:length]
        self.salts[target] = self.salts[source]
        self.touch(source)
        self.touch(target)

    def swap(self, a: int, b: int) -> None:
        """Exchange two slots' contents (keeping the engine's running sequences in the first slots)."""
        if a == b:
            return
        length = max(len(self.held[a]), len(self.held[b]))
        if length:
            for tensors in (self.keys, self.values):
                for layer in tensors:
                    saved = layer[a, :, :length].clone()
                    layer[a, :, :length] = layer[b, :, :length]
                    layer[b, :, :length] = saved
        self.held[a], self.held[b] = self.held[b], self.held[a]
        self.salts[a], self.salts[b] = self.salts[b], self.salts[a]
        self.used[a], self.used[b] = self.used[b], self.used[a]

    def admit(self, tokens: list[int], limit: int, first_free: int, salt: str | None = None) -> int:
        """Ready slot `first_free` (slots from there on are free, the ones before busy) for a sequence
        whose prompt is `tokens`, of `salt`, holding the longest prefix of it (at most `limit` tokens)
        any slot of the same salt holds; that length.

        A free slot holding that prefix is taken as it is, cut to the match, when that loses less than
        it keeps (the rest of an earlier answer to the same prompt) or when it is the least recently
        used free slot anyway. Otherwise the sequence takes the least recently used free slot and the
        prefix is copied there: a short match (the chat template's first tokens, shared by every
        prompt) must not wipe out the long prefix after it. Either way the slot taken is swapped into
        `first_free`."""
        lengths = [
            common_prefix(held, tokens, limit) if own == salt else 0
            for held, own in zip(self.held, self.salts, strict=True)
        ]
        length = max(lengths, default=0)
        victim = self.least_recently_used(first_free)
        matches = [slot for slot in range(self.slots) if length and lengths[slot] == length]
        # free slots whose content may be cut to the match: the least recently used, or one that
        # loses less than it keeps
        cheap = [s for s in matches if s >= first_free and (s == victim or len(self.held[s]) < 2 * length)]
        if cheap:  # cut to the match: whatever it held beyond is lost
            taken = source = min(cheap, key=lambda slot: len(self.held[slot]))
        else:
            taken, source = victim, next(iter(matches), -1)
        self.swap(taken, first_free)
        if taken != source and length:  # a swap moved the source only when it was at `first_free`
            self.copy_prefix(taken if source == first_free else source, first_free, length)
        self.held[first_free] = self.held[first_free][:length]
        self.salts[first_free] = salt
        self.touch(first_free)
        return length

    def least_recently_used(self, first_free: int) -> int:
        """The free slot (from `first_free` on) to give up first: an empty one, else the least recently
        used of those whose content another slot mostly holds too, else the least recently used.

        Two requests with one prompt at once leave two slots holding it (the second had the prefix
        copied): giving up one of them loses nothing, where giving up the least recently used slot
        would lose the only copy of another prompt, whose next request misses and takes yet another."""
        free = sorted(
            range(first_free, self.slots), key=lambda slot: (bool(self.held[slot]), self.used[slot])
        )
        if not self.held[free[0]]:
            return free[0]
        return next((slot for slot in free if self._mostly_held_elsewhere(slot)), free[0])

    def _mostly_held_elsewhere(self, slot: int) -> bool:
        """Whether another slot of its salt holds at least three quarters of this one's tokens as its own
        prefix.
        The token where that part ends is compared first: it differs between unrelated prompts, so the
        whole part is compared only for a likely copy (every chat prompt shares its template's first
        tokens, so a prefix search would cost slices for every pair of slots at every admission)."""
        held, salt = self.held[slot], self.salts[slot]
        enough = max(1, 3 * len(held) // 4)
        last = held[enough - 1]
        return any(
            len(other) >= enough and other[enough - 1] == last and other[:enough] == held[:enough]
            for o, other in enumerate(self.held)
            if o != slot and self.salts[o] == salt
        )

    def longest_prefix(self, tokens: list[int], limit: int, salt: str | None = None) -> tuple[int, int]:
        """The slot of `salt` holding the longest prefix of `tokens` (at most `limit` of them), and its
        length."""
        best, best_length = -1, 0
        for slot, held in enumerate(self.held):
            if self.salts[slot] != salt:
                continue
            length = common_prefix(held, tokens, limit)
            if length > best_length:
                best, best_length = slot, length
        return best, best_length


def common_prefix(a: list[int], b: list[int], limit: int) -> int:
    n = min(len(a), len(b), limit)
    if n == 0 or a[0] != b[0]:
        return 0
    if a[:n] == b[:n]:
        return n
    low, high = 1, n  # a[:low] == b[:low] and a[:high] != b[:high]
    while high - low > 1:
        middle = (low + high) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle
    return low
