"""Fair shares of a generating engine: virtual token counters (issue 72; docs/limits.md, "Generation").

The method is the Virtual Token Counter (Sheng et al., "Fairness in Serving Large Language Models",
OSDI 2024): the engine counts the service each tenant has received, in weighted tokens, and the next
request it admits is one of the tenant that has received the least among those that wait. So a tenant's
share of a model is what it has been served, not how fast it sends: a key that queues 64 streams is
admitted no faster than one that sends a request at a time, once the other's counter has caught up.

- **Two levels.** A request's tenant is `<account>/<key>` (`auth.principal.current_tenant`). Accounts
  share the engine between them (several accounts' adapters on one base), and inside an account its keys
  (and the people who own them) share what the account gets: the engine picks the account with the least
  service first, then in it the key with the least. A tenant without a `/` is a key of account "".
- **Weighted tokens.** A prompt token computed costs `TokenWeights.prompt` (1), an output token
  `TokenWeights.output` (2: each is a decoding step of its own, where a prompt's tokens go through the
  model together; the paper's weights). Prompt tokens taken from the prefix cache cost nothing: they
  were not computed.
- **Weights.** An account's `weight` (set by the operator) and a key's inside its account (set by the
  account's admins), 1 by default, travel with each request (`GenerationRequest.weights`): a tenant's
  service is divided by its weight at each level before it is counted, so two backlogged accounts of
  weights 2 and 1 are served tokens 2:1 (the paper's weighted VTC).
- **The lift rule.** A tenant that has nothing held by the engine (waiting or running) when its request
  arrives has its counter raised to the least counter of the tenants that do (at its level: among the
  accounts, or among its account's keys), never lowered: time spent idle is not banked as credit to
  flood the engine later, and a tenant returning after a burst does not wait for the others to catch up
  with service it received long ago. When the engine holds nothing at all the counters start again.

A tenant's own requests keep their order (its waiting requests in `generation.priority`'s order: its
`priority` numbers first, and `flex` ones behind everyone's interactive work): the counters only choose
whose turn it is.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class TokenWeights:
    """What a token served costs in a tenant's counter (module docstring)."""

    prompt: float = 1.0
    output: float = 2.0


def levels(tenant: str) -> tuple[str, str]:
    """(account, key) of a tenant `<account>/<key>`; a bare key is one of account ""."""
    account, _, key = tenant.rpartition("/")
    return account, key


class VirtualTokenCounters:
    """The counters of one engine (module docstring). Not thread-safe: the engine's loop owns it."""

    def __init__(self, weights: TokenWeights | None = None) -> None:
        self.weights = weights or TokenWeights()
        self._accounts: dict[str, float] = {}
        self._keys: dict[tuple[str, str], float] = {}
        self._shares: dict[str, float] = {}  # accounts' weights, as their latest request said
        self._key_shares: dict[tuple[str, str], float] = {}

    def arrive(self, tenant: str, held: Iterable[str], shares: tuple[float, float] = (1.0, 1.0)) -> None:
        """A request of `tenant`, whose weights are `shares` (its account's, its key's), arrives while the
        engine holds requests of the tenants `held`: the lift rule, at both levels."""
        held_levels = {levels(other) for other in held}
        account, key = levels(tenant)
        if not held_levels:
            for table in (self._accounts, self._keys, self._shares, self._key_shares):
                table.clear()
        self._shares[account], self._key_shares[account, key] = (max(share, 1e-6) for share in shares)
        if not held_levels:
            return
        accounts = {other_account for other_account, _ in held_levels}
        if account not in accounts:
            least = min(self._accounts.get(other, 0.0) for other in accounts)
            self._accounts[account] = max(self._accounts.get(account, 0.0), least)
        keys = [(account, other_key) for other_account, other_key in held_levels if other_account == account]
        if keys and (account, key) not in keys:
            least = min(self._keys.get(other, 0.0) for other in keys)
            self._keys[account, key] = max(self._keys.get((account, key), 0.0), least)

    def charge(self, tenant: str, prompt: int = 0, output: int = 0) -> None:
        """Service given to `tenant`: `prompt` tokens computed, `output` tokens generated, counted divided
        by its weights."""
        cost = prompt * self.weights.prompt + output * self.weights.output
        if cost:
            account, key = levels(tenant)
            self._accounts[account] = self._accounts.get(account, 0.0) + cost / self._shares.get(account, 1.0)
            key_share = self._key_shares.get((account, key), 1.0)
            self._keys[account, key] = self._keys.get((account, key), 0.0) + cost / key_share

    def counters(self, tenant: str) -> tuple[float, float]:
        """(its account's counter, its key's counter inside the account)."""
        account, key = levels(tenant)
        return self._accounts.get(account, 0.0), self._keys.get((account, key), 0.0)

    def rank(self, tenant: str, held: Iterable[str]) -> tuple[float, float]:
        """How far `tenant` is above the least served of `held` (the tenants with requests in the engine;
        at each level: its account above the least served account, its key above the least served key
        of its account): what an engine that orders requests by a number fixed at their arrival (vLLM)
        is given, small whatever the counters have grown to."""
        account, key = levels(tenant)
        held_levels = {levels(other) for other in held} | {(account, key)}
        accounts = min(self._accounts.get(other, 0.0) for other, _ in held_levels)
        keys = min(self._keys.get(other, 0.0) for other in held_levels if other[0] == account)
        own_account, own_key = self.counters(tenant)
        return own_account - accounts, own_key - keys

    def order(self, tenants: Iterable[str]) -> list[str]:
        """`tenants` least served first: accounts by their counters, and inside each account its keys by
        theirs (a key's counter only compares with its own account's keys); equal ones in the order
        given (the one whose request waits longest first)."""
        given = list(tenants)
        accounts = sorted(
            dict.fromkeys(levels(t)[0] for t in given), key=lambda a: self._accounts.get(a, 0.0)
        )
        place = {account: index for index, account in enumerate(accounts)}
        return sorted(given, key=lambda t: (place[levels(t)[0]], self._keys.get(levels(t), 0.0)))

    def least(self, tenants: Iterable[str]) -> str:
        """Whose turn it is among `tenants` (at least one): the first of `order`."""
        return self.order(tenants)[0]


class HeldTenants:
    """The tenants whose requests an engine holds, where the engine keeps no list of its own to read
    them from (llama.cpp's slots, vLLM): what `VirtualTokenCounters.arrive` and `rank` are given."""

    def __init__(self) -> None:
        self._requests: collections.Counter[str] = collections.Counter()

    def __iter__(self) -> Iterator[str]:
        return iter(self._requests)

    @contextlib.contextmanager
    def holding(self, tenant: str) -> Iterator[None]:
        """One request of `tenant` held for the block."""
        self._requests[tenant] += 1
        try:
            yield
        finally:
            self._requests[tenant] -= 1
            if not self._requests[tenant]:
                del self._requests[tenant]


FAIR_SLOWDOWN = 3.0  # a light tenant's decoding steps take at most this × a step of its requests alone
_EMA = 0.2  # the weight of a new measurement in a batch size's step time
ROTATE_STEPS = 32  # decoding steps a share of the batch is kept before the paused requests' turn


class StepCosts:
    """What a decoding step costs at each batch size, learnt from the engine's own steps: on a CPU a step
    of 33 sequences takes several times a step of one (on a GPU nearly the same), which is what makes a
    heavy tenant's batch slow a light tenant's every token. Fitted as a line over the sizes seen (the
    moving average of each), so that `cap` can say how large a batch keeps a step within `slowdown` of a
    step of one sequence; None until two sizes, one of them small, have been seen."""

    def __init__(self) -> None:
        self.seconds: dict[int, float] = {}

    def record(self, size: int, seconds: float) -> None:
        before = self.seconds.get(size)
        self.seconds[size] = seconds if before is None else before + _EMA * (seconds - before)

    def cap(self, slowdown: float = FAIR_SLOWDOWN) -> int | None:
        """The largest batch whose step is estimated within `slowdown` × a step of one (None: unknown,
        or no batch size slows a step that much)."""
        sizes = sorted(self.seconds)
        if len(sizes) < 2 or sizes[0] > 4:
            return None
        mean_size = sum(sizes) / len(sizes)
        mean_seconds = sum(self.seconds.values()) / len(sizes)
        spread = sum((size - mean_size) ** 2 for size in sizes)
        slope = sum((size - mean_size) * (self.seconds[size] - mean_seconds) for size in sizes) / spread
        one = mean_seconds + slope * (1 - mean_size)
        if slope <= 0 or one <= 0:
            return None
        return max(1, int(1 + (slowdown - 1) * one / slope))


FAIR_ARGS = "modelhost_fair"  # the key of a request's `FairArgs` in vLLM's `SamplingParams.extra_args`


@dataclass(frozen=True, slots=True)
class FairArgs:
    """What an engine's scheduler needs of a request to share the engine fairly: its tenant
    (`<account>/<key>`), their weights (account's, key's), its own `priority` and whether it is low
    (flex, a batch line). Crosses into vLLM's engine core as a list in `SamplingParams.extra_args`
    (`engines.vllm_scheduler`), which vLLM sends as MessagePack."""

    tenant: str = ""
    weights: tuple[float, float] = (1.0, 1.0)
    priority: int = 0
    low: bool = False

    def write(self) -> list[object]:
        return [self.tenant, self.weights[0], self.weights[1], self.priority, self.low]

    @classmethod
    def read(cls, value: object) -> FairArgs:
        """The arguments `write` made; the defaults (an anonymous tenant) for anything else."""
        if not isinstance(value, list | tuple) or len(value) != 5:
            return cls()
        tenant, account, key, priority, low = value
        try:
            return cls(str(tenant), (float(account), float(key)), int(priority), bool(low))
        except (TypeError, ValueError):
            return cls()


RANK_BITS = 24  # bits of an engine's number for each level of a tenant's rank (`engine_number`)


def engine_number(rank: tuple[float, float], priority: int, low: bool, priority_bound: int) -> int:
    """One number for an engine that runs the lowest first and keeps arrival order among equal ones
    (vLLM's priority scheduling), from a request's tenant's `rank` (`VirtualTokenCounters.rank`), its own
    `priority` (-`priority_bound` to `priority_bound`: orders its tenant's requests only) and whether it
    is `low` (flex, a batch line: behind every interactive request): low first, then the account's rank,
    then the key's, then the request's own number. Ranks past 2**`RANK_BITS` weighted tokens count as
    that much."""
    most = (1 << RANK_BITS) - 1
    account, key = (min(most, max(0, int(part))) for part in rank)
    own = priority + priority_bound
    width = (2 * priority_bound + 1).bit_length()
    return (((int(low) << RANK_BITS | account) << RANK_BITS | key) << width) | own


def decoding_share(
    decoding: list[T],
    cap: int | None,
    tenant_of: Callable[[T], str],
    counters: VirtualTokenCounters,
    waited: Callable[[T], int],
    lingering: Iterable[str] = (),
) -> list[T]:
    """The sequences of `decoding` that decode this step when tenants share the batch: all of them,
    unless the batch is over `cap` and some tenant is light (fewer sequences than an equal split of the
    cap). Then the light tenants' sequences all decode, in a batch of `cap`, and the heavy tenants' fill
    the rest by turns, the least served tenant first and inside each the sequence that has `waited`
    longest first (none is starved: a paused one has waited longer at the next step); the others pause
    in their slots. Tenants all heavy share the full batch: a smaller one would slow them all for none.
    `lingering` tenants (`Lingering`: their last request has just ended) count as light tenants with
    nothing decoding: the batch stays small for the next request of a client that sends one at a time,
    which would otherwise find a step of the whole batch under way when it comes."""
    if cap is None or len(decoding) <= cap:
        return decoding
    by_tenant: dict[str, list[T]] = {}
    for sequence in decoding:
        by_tenant.setdefault(tenant_of(sequence), []).append(sequence)
    for tenant in lingering:
        by_tenant.setdefault(tenant, [])
    if len(by_tenant) < 2:
        return decoding
    equal = max(1, cap // len(by_tenant))
    light = [tenant for tenant, held in by_tenant.items() if len(held) <= equal]
    if not light:
        return decoding
    chosen = {id(sequence) for tenant in light for sequence in by_tenant[tenant]}
    heavy = [
        sorted(by_tenant[tenant], key=waited, reverse=True)
        for tenant in counters.order(tenant for tenant in by_tenant if tenant not in light)
    ]
    room, turn = cap - len(chosen), 0
    while room > 0 and any(heavy):
        queue = heavy[turn % len(heavy)]
        if queue:
            chosen.add(id(queue.pop(0)))
            room -= 1
        turn += 1
    return [sequence for sequence in decoding if id(sequence) in chosen]


class KeptShare:
    """`decoding_share`, kept for `ROTATE_STEPS` steps unless a sequence arrived or one of the share
    left: each new share costs its engine something (ours moves caches between slots; vLLM's model
    runner takes requests out of its batch and puts others in), so the paused ones take their turn
    every `ROTATE_STEPS` steps rather than every step, or when the lingering tenants change. One per
    engine; `key` names a sequence."""

    def __init__(self) -> None:
        # the share, all the sequences then, the step then and the lingering tenants then
        self._share: tuple[set[Hashable], set[Hashable], int, frozenset[str]] | None = None

    def choose(
        self,
        decoding: list[T],
        step: int,
        cap: int | None,
        key: Callable[[T], Hashable],
        tenant_of: Callable[[T], str],
        counters: VirtualTokenCounters,
        waited: Callable[[T], int],
        lingering: Iterable[str] = (),
    ) -> list[T]:
        """The sequences of `decoding` that decode at engine step `step` (`decoding_share`)."""
        ids, lingered = {key(sequence) for sequence in decoding}, frozenset(lingering)
        if self._share is not None:
            share, seen, since, then = self._share
            if share <= ids and ids <= seen and step - since < ROTATE_STEPS and lingered == then:
                return [sequence for sequence in decoding if key(sequence) in share]
        chosen = decoding_share(decoding, cap, tenant_of, counters, waited, lingered)
        kept = len(chosen) < len(decoding)
        self._share = ({key(sequence) for sequence in chosen}, ids, step, lingered) if kept else None
        return chosen


LINGER_SECONDS = 0.25  # how long a tenant whose last request ended still counts in sharing the batch


class Lingering:
    """The tenants whose last request in an engine ended in the last `LINGER_SECONDS`. A client that
    sends one request at a time sends its next as soon as the last is answered: were the batch given
    back to the others at once, its next request would find a step of their whole batch under way, and
    its first token would wait for it (`decoding_share`). vLLM's scheduler uses it
    (`engines.vllm_shares`); the transformers engine does not, as each change of its share moves caches
    between slots (docs/limits.md)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._ended: dict[str, float] = {}

    def ended(self, tenant: str) -> None:
        """`tenant`'s last request in the engine has ended."""
        self._ended[tenant] = self._clock()

    def tenants(self, held: Iterable[str]) -> list[str]:
        """The lingering tenants, but those with requests `held` by the engine again."""
        if not self._ended:
            return []
        now, back = self._clock(), set(held)
        self._ended = {t: at for t, at in self._ended.items() if now - at < LINGER_SECONDS and t not in back}
        return list(self._ended)
