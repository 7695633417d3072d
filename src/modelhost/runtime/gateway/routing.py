"""Which replica a generation goes to: the one most likely to hold its prompt's prefix in its KV cache.

A request's affinity is what the client says about it (`prompt_cache_key`, `user`, the Messages API's
`metadata.user_id`) or, without that, a hash of its prompt's leading bytes: the tools, the system
messages and the first message after them, as the chat template receives them (tools and the system
prompt come first in every template), or a completion's prompt, cut at `PREFIX_BYTES`. Requests that
agree on those share their leading tokens, which is what a prefix cache reuses: a long system prompt
decides alone (its first `PREFIX_BYTES`), and a conversation keeps its first message as it grows, so
every turn of it (a Responses chain's included) goes where its earlier turns are cached.

The replica is chosen by rendezvous hashing (highest random weight) of the affinity with each live
replica's route (its socket path, or its Serve application's name): a pure function of the request and
the replica set, so every gateway process of a server, and every server that sees the same replicas,
makes the same choice without sharing any state, and when a replica comes or goes only the affinities
it held move. The preferred replica is skipped for the least busy one when it has `max_imbalance` or
more requests in flight beyond that one's (what this gateway process sent: each process counts its
own), so one hot prefix cannot queue behind itself while another replica idles.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

import msgspec

from modelhost.generation.contract import GenerationRequest, StreamRequest

PREFIX_BYTES = 2048  # about 500 tokens of a prompt: the part that decides its cache affinity


class Routable(Protocol):
    @property
    def route(self) -> str: ...
    @property
    def in_flight(self) -> int: ...


T = TypeVar("T", bound=Routable)


def affinity_of(request: StreamRequest | object) -> str:
    """What places the request (empty: nothing, the least busy replica takes it; anything but a
    generation has none)."""
    if not isinstance(request, GenerationRequest) or request.asks_tokenizer:
        return ""
    if request.affinity:
        return "key:" + request.affinity
    if request.messages is not None:
        lead = msgspec.json.encode([request.tools or [], _leading(request.messages)])[:PREFIX_BYTES]
    elif isinstance(request.prompt, str):
        lead = request.prompt.encode()[:PREFIX_BYTES]
    elif request.prompt:
        lead = msgspec.json.encode(request.prompt[: PREFIX_BYTES // 4])
    else:
        return ""
    return "prefix:" + hashlib.blake2b(lead, digest_size=16).hexdigest()


def _leading(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The system (and developer) messages and the first message after them: what every later turn of
    the conversation starts with too, whatever was said since."""
    for index, message in enumerate(messages):
        if message.get("role") not in ("system", "developer"):
            return messages[: index + 1]
    return messages


def preferred(replicas: Sequence[T], affinity: str) -> T:
    """The replica `affinity` belongs to among `replicas` (rendezvous hashing)."""
    return max(replicas, key=lambda r: weight(affinity, r.route))


def weight(affinity: str, route: str) -> bytes:
    """The replica with the highest weight for an affinity holds it (rendezvous hashing)."""
    return hashlib.blake2b(f"{affinity}\0{route}".encode(), digest_size=8).digest()


def choose(replicas: Sequence[T], affinity: str, max_imbalance: int) -> T:
    """The replica for a request: its affinity's, unless that one is `max_imbalance` or more requests
    busier than the least busy; then the least busy. `replicas` are live and not empty."""
    least = min(replicas, key=lambda r: r.in_flight)
    if not affinity or len(replicas) == 1:
        return least
    chosen = preferred(replicas, affinity)
    return chosen if chosen.in_flight - least.in_flight < max_imbalance else least
