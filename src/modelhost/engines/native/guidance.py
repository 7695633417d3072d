"""The engine's `Constraint` backed by an llguidance matcher (worker side: needs torch)."""

from __future__ import annotations

from typing import Any

import llguidance
import numpy as np
import torch

from modelhost.engines.native.engine import Constraint
from modelhost.errors import InvalidRequest


class GrammarConstraint(Constraint):
    def __init__(self, tokenizer: Any, grammar: str, param: str | None = None) -> None:
        self._matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if self._matcher.is_error():
            raise InvalidRequest(f"The schema cannot be enforced: {self._matcher.get_error()}", param=param)

    def allowed(self, vocab_size: int) -> torch.Tensor:
        packed = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
        bits = np.unpackbits(packed, bitorder="little")[:vocab_size].astype(bool)
        if bits.shape[0] < vocab_size:
            bits = np.concatenate([bits, np.zeros(vocab_size - bits.shape[0], dtype=bool)])
        return torch.from_numpy(bits)

    def accept(self, token: int) -> None:
        self._matcher.consume_token(token)

    @property
    def done(self) -> bool:
        return bool(self._matcher.is_stopped())
