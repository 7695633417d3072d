"""Service tiers: who goes first in a replica's queues and its engine, the one rule every queue applies.

A request comes in one of three tiers (OpenAI's `service_tier`): `priority`, `default` or `flex`; a line
of a batch job (`modelhost.batches`) runs as `flex` does. Its place follows from two things:

- a number, vLLM's `priority` (lower goes first; 0 by default, -1 for the `priority` tier when the
  request names no number): it orders a key's own waiting requests, never another key's. A key's
  waiting requests keep the places their arrival gave them and are sorted by their numbers over those
  places (`enqueue`), so every other key finds as many of this key's requests ahead of it as it would
  without numbers: a key's priorities cannot slow another key (docs/limits.md, "Service tiers");
- `low` (`flex` and batch lines): it waits behind every interactive request of every key, and is not
  even admitted into free room while interactive traffic goes on (`low_cap`; the transformers engine
  also pauses those already running): ordering a waiting list changes nothing when the engine has free
  slots, and a flex flood that filled them would make every decoding step of an interactive request
  that much slower.

The answer's `service_tier` says what was applied (`applied_tier`).
"""

from __future__ import annotations

from collections.abc import MutableSequence
from typing import Literal, Protocol, TypeVar

from modelhost.protocol.common import PRIORITY_BOUND

Tier = Literal["priority", "default", "flex"]
TIERS: tuple[Tier, ...] = ("priority", "default", "flex")
PRIORITY = -1  # the number of a `priority` tier request that names none (vLLM: lower runs first)
BUSY_SECONDS = 0.5  # an interactive request this recent means interactive traffic is going on
LOW_WHILE_BUSY = 1  # the low requests (flex, batch lines) that run meanwhile, no interactive one held
__all__ = ["PRIORITY_BOUND", "applied_tier", "enqueue", "low_cap", "numeric_priority"]


class Queued(Protocol):
    """What a waiting entry tells the rule: its key, its number, whether it is low."""

    @property
    def tenant(self) -> str: ...

    @property
    def priority(self) -> int: ...

    @property
    def low(self) -> bool: ...


Q = TypeVar("Q", bound=Queued)


def numeric_priority(tier: str | None, priority: int | None) -> int:
    """A request's number: the one it names, else -1 for the `priority` tier and 0 for the others."""
    if priority is not None:
        return priority
    return PRIORITY if tier == "priority" else 0


def applied_tier(priority: int, low: bool) -> Tier:
    """The tier a request ran in, as its answer's `service_tier` says: `flex` (held back), `priority`
    (ahead of its key's default requests) or `default`."""
    if low:
        return "flex"
    return "priority" if priority < 0 else "default"


def enqueue(waiting: MutableSequence[Q], entry: Q) -> None:
    """Put a request into a waiting list kept in this order. A low one goes last; another goes before
    the first low one, then its key's waiting requests are sorted by their numbers (stably: equal ones
    keep their arrival order) over the places they hold, so that no other key finds more of this key's
    requests ahead of it than arrival order would put there (module docstring)."""
    if entry.low:
        waiting.append(entry)
        return
    waiting.insert(next((i for i, e in enumerate(waiting) if e.low), len(waiting)), entry)
    places = [i for i, e in enumerate(waiting) if not e.low and e.tenant == entry.tenant]
    ordered = sorted((waiting[i] for i in places), key=lambda e: e.priority)
    for index, queued in zip(places, ordered, strict=True):
        waiting[index] = queued


def low_cap(slots: int, interactive: bool, recent: bool) -> int:
    """How many low requests (flex, batch lines) may run among `slots`: none while an interactive
    request is held (`interactive`: running or waiting); `LOW_WHILE_BUSY` while none is but one arrived
    in the last `BUSY_SECONDS` (`recent`: between one caller's turns, so that low work still moves);
    otherwise every slot but one, which stays free for the next interactive request (all of them when
    there is only one)."""
    if interactive:
        return 0
    return LOW_WHILE_BUSY if recent else max(1, slots - 1)
