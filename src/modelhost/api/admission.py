"""Admission: which keyed routes a request must be admitted to before it runs, decided here for every
route at once (docs/security.md, "Admission"; docs/limits.md).

To be **admitted** is to pass `api.deps.admit`: 402 `insufficient_credits` once the account is out of
credits, 429 past its spend caps, and 429 past the key's or the account's rate limits (the request then
holds its place until it ends). The key check (`api.middleware.KeyFirst`) admits a request right after
its key, before anything reads its body, so what a tenant sends costs at most its own request.

The rule, by method, so that a route added later is admitted without anyone remembering:
- a route that **stores data or starts work** (`POST`, `PUT`, `PATCH`) is admitted (`ADMIT`);
- a read (`GET`, `HEAD`) is not, except one that asks a replica (it may load a cold deployment:
  `ADMITTED_READS`) and the Files API's, which count against the rate limits (`LIMIT`, as its docs have
  always said);
- what only **removes or stops** (`DELETE`, a `.../cancel`, a fine-tuning job's `.../pause`, OpenAI's
  cancel of an eval run: `STOPS`) is not: it is how an account stops spending, and must work when its
  credits have run out;
- and `EXEMPT` below: routes that change who may act (keys, people, the MCP allow-list), which must work
  for an account out of credits (a leaked key is rotated or revoked at 0 credits), each with its reason.
The operator's routes (`/v1/admin/*`) belong to no account; public routes have no key and are
throttled per client address instead (`auth.anonymous`). `tests/test_admission.py` checks every route of
the OpenAPI document against this rule: 402 and 429 where it admits.
"""

from __future__ import annotations

from enum import Enum

from modelhost.api.deps import Guard, require_admin

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH"})
# what only stops work, by the end of its path (a fine-tuning job's pause keeps its checkpoints)
STOPPING_ENDS = ("/cancel", "/pause")


class Admission(Enum):
    ADMIT = "credits, spend caps and rate limits"
    LIMIT = "rate limits only"
    NONE = "not admitted"


# (method, path template) → why a state-changing route is not admitted
EXEMPT: dict[tuple[str, str], str] = {
    ("POST", "/v1/keys"): "who may act: keys are made for an account out of credits too",
    ("POST", "/v1/keys/{key_id}/rotate"): "who may act: a leaked key is rotated whatever the balance",
    ("PATCH", "/v1/keys/{key_id}"): "who may act: a key's name and limits",
    ("POST", "/v1/users"): "who may act: people and their roles",
    ("PATCH", "/v1/users/{user_id}"): "who may act: people, their roles and quotas",
    ("PATCH", "/v1/role-quotas"): "who may act: the quotas of the roles' people",
    ("PATCH", "/v1/role-weights"): "who may act: the roles' shares inside the account",
    ("PUT", "/v1/mcp-servers"): "who may act: the servers this account's keys may reach",
}
# routes that only stop work though their path does not end in `/cancel` (OpenAI's own paths)
STOPS = frozenset({("POST", "/v1/evals/{eval_id}/runs/{run_id}")})
# reads that ask a replica, which may load a cold deployment for them
ADMITTED_READS = frozenset({("GET", "/tokenizer_info")})
# reads counted against the rate limits (the Files API's: docs/batch.md)
LIMITED_READS = frozenset(
    {("GET", "/v1/files"), ("GET", "/v1/files/{file_id}"), ("GET", "/v1/files/{file_id}/content")}
)
# removals counted against the rate limits (a file's bytes go with it: the Files API's, as its reads)
LIMITED_REMOVALS = frozenset({("DELETE", "/v1/files/{file_id}")})


def admission_of(method: str, path: str, guard: Guard | None) -> Admission:
    """How a request to the route `path` (its template) with `method` is admitted (module docstring)."""
    if guard is None or guard is require_admin:
        return Admission.NONE
    if (method, path) in ADMITTED_READS:
        return Admission.ADMIT
    if (method, path) in LIMITED_READS or (method, path) in LIMITED_REMOVALS:
        return Admission.LIMIT
    stops = path.endswith(STOPPING_ENDS) or (method, path) in STOPS
    if method not in STATE_CHANGING or stops or (method, path) in EXEMPT:
        return Admission.NONE
    return Admission.ADMIT
