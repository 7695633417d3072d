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

from collections.abc import Iterable
from dataclasses import dataclass


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

    def arrive(self, tenant: str, held: Iterable[str]) -> None:
        """A request of `tenant` arrives while the engine holds requests of the tenants `held`: the lift
        rule, at both levels."""
        held_levels = {levels(other) for other in held}
        if not held_levels:
            self._accounts.clear()
            self._keys.clear()
            return
        account, key = levels(tenant)
        accounts = {other_account for other_account, _ in held_levels}
        if account not in accounts:
            least = min(self._accounts.get(other, 0.0) for other in accounts)
            self._accounts[account] = max(self._accounts.get(account, 0.0), least)
        keys = [(account, other_key) for other_account, other_key in held_levels if other_account == account]
        if keys and (account, key) not in keys:
            least = min(self._keys.get(other, 0.0) for other in keys)
            self._keys[account, key] = max(self._keys.get((account, key), 0.0), least)

    def charge(self, tenant: str, prompt: int = 0, output: int = 0) -> None:
        """Service given to `tenant`: `prompt` tokens computed, `output` tokens generated."""
        cost = prompt * self.weights.prompt + output * self.weights.output
        if cost:
            account, key = levels(tenant)
            self._accounts[account] = self._accounts.get(account, 0.0) + cost
            self._keys[account, key] = self._keys.get((account, key), 0.0) + cost

    def counters(self, tenant: str) -> tuple[float, float]:
        """(its account's counter, its key's counter inside the account)."""
        account, key = levels(tenant)
        return self._accounts.get(account, 0.0), self._keys.get((account, key), 0.0)

    def least(self, tenants: Iterable[str]) -> str:
        """Whose turn it is among `tenants` (at least one): the least served account's least served key;
        on equal counters the first given (the one whose request waits longest)."""
        given = list(tenants)
        account = levels(min(given, key=lambda tenant: self._accounts.get(levels(tenant)[0], 0.0)))[0]
        return min(
            (tenant for tenant in given if levels(tenant)[0] == account),
            key=lambda tenant: self._keys.get(levels(tenant), 0.0),
        )
