"""The control protocol: what a server's gateway processes ask of its supervisor, declared once.

The supervisor owns what must happen once per server (loading and unloading replicas, the idle reaper,
billing meters, video jobs, agent runs, batches, imports) and serves no HTTP itself. Its gateway
processes serve HTTP, send inference straight to the replicas (`runtime.replica_protocol`), and use this
protocol, over one Unix socket each, for the rest: to have a deployment loaded and learn where its
replicas are, to read a deployment's live state, to act on a change, to start and stop runs, to wake a
runner, to say which deployments they used lately, and to make every process forget a cache entry
that changed.

Calls carry a number and are answered with `Done` (its `value`) or `Refused` (the error the caller's
client gets). The supervisor also pushes `Replicas` (a deployment's replicas changed) and `Forget`, and
sends a gateway each batch line to run (`RunLine`, answered by `LineAnswered`): a line is a tenant's
request, so the supervisor never parses or runs it itself.
Framing is the replica protocol's: a 4-byte length, then a msgpack array.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from modelhost.agents.store import RunJob
from modelhost.auth.limits import Limits
from modelhost.auth.principal import Principal, PrincipalKind
from modelhost.runtime.replica_protocol import FrameReader

__all__ = ["FrameReader", "decode_from_supervisor", "decode_to_supervisor", "encode"]


class Hello(msgspec.Struct, tag="hello", array_like=True):
    """A gateway process has started (answered with `Done(value=Welcome)`)."""

    call: int
    pid: int


class Welcome(msgspec.Struct, array_like=True):
    agent_runner: str  # the name runs are claimed by (`claimed_by`): the supervisor's runner
    replicas: dict[str, list[str]]  # every loaded deployment's replica addresses, now


class Acquire(msgspec.Struct, tag="acquire", array_like=True):
    """Load the deployment if it is not loaded; answered with its replicas' addresses."""

    call: int
    deployment_id: str


class GetStatus(msgspec.Struct, tag="status", array_like=True):
    """A deployment's live state, answered as the `LiveStatus` the supervisor's runtime reports."""

    call: int
    deployment_id: str


class GetCapacity(msgspec.Struct, tag="capacity", array_like=True):
    """The memory budget and who holds it (the supervisor's placement: one budget for the server)."""

    call: int


class Apply(msgspec.Struct, tag="apply", array_like=True):
    """The deployment was created or changed (or deleted: then it is unloaded)."""

    call: int
    deployment_id: str


class Remove(msgspec.Struct, tag="remove", array_like=True):
    call: int
    deployment_id: str


class ResumeAccount(msgspec.Struct, tag="resume", array_like=True):
    call: int
    account_id: str


class StartRun(msgspec.Struct, tag="start_run", array_like=True):
    """An agent run was stored as queued: the supervisor's runner executes it."""

    call: int
    job: RunJob


class StopRuns(msgspec.Struct, tag="stop_runs", array_like=True):
    """Stop these runs and answer once they have stopped (deletion, cancellation)."""

    call: int
    run_ids: list[str]


class CancelVideo(msgspec.Struct, tag="cancel_video", array_like=True):
    call: int
    video_id: str


class Touch(msgspec.Struct, tag="touch", array_like=True):
    """These deployments were used (or are still in use) since the last `Touch`: not idle. By deployment,
    how many seconds before this message each was last used (0: in use), so that the supervisor orders
    them as they were used (eviction takes the least recently used), not as one message names them."""

    ages: dict[str, float]


class Forget(msgspec.Struct, tag="forget", array_like=True):
    """A cache entry changed (a key revoked, a deployment changed, a balance topped up): every process
    forgets it. `key` None: the whole cache."""

    cache: str
    key: str | None


class Wake(msgspec.Struct, tag="wake", array_like=True):
    """Work was queued through a gateway: its runner claims it now rather than at its next poll."""

    runner: Literal["batches", "imports", "videos", "evals", "fine_tuning"]


class LineCaller(msgspec.Struct, array_like=True):
    """The key a batch line runs as (`auth.principal.Principal`, which is not a msgspec type)."""

    kind: str
    account_id: str | None
    key_id: str | None
    deployment_ids: list[str] | None
    limits: Limits | None
    account_limits: Limits | None
    expires_ms: int | None

    @classmethod
    def of(cls, principal: Principal) -> LineCaller:
        ids = sorted(principal.deployment_ids) if principal.deployment_ids is not None else None
        return cls(
            principal.kind.value,
            principal.account_id,
            principal.key_id,
            ids,
            principal.limits,
            principal.account_limits,
            principal.expires_ms,
        )

    def principal(self) -> Principal:
        ids = frozenset(self.deployment_ids) if self.deployment_ids is not None else None
        return Principal(
            PrincipalKind(self.kind),
            self.account_id,
            self.key_id,
            ids,
            self.limits,
            self.account_limits,
            self.expires_ms,
        )


class RunLine(msgspec.Struct, tag="run_line", array_like=True):
    """Supervisor → gateway: run a batch line (`body`, its JSON) through the gateway's own app, as the
    batch's key, and answer with `LineAnswered` of the same `line` number."""

    line: int
    caller: LineCaller
    endpoint: str
    body: bytes
    traceparent: str
    pinned: str = ""  # the version (artifact) it runs on, whatever the split ("": the split's choice)


class LineAnswered(msgspec.Struct, tag="line_answered", array_like=True):
    """Gateway → supervisor: what the gateway's app answered to `RunLine` number `line`."""

    line: int
    status: int
    request_id: str
    body: bytes


class Done(msgspec.Struct, tag="done", array_like=True):
    call: int
    value: Any = None


class Refused(msgspec.Struct, tag="refused", array_like=True):
    """The call failed with the error its HTTP caller gets (a `ModelhostError`, rebuilt by class name)."""

    call: int
    error: str  # the class name in `modelhost.errors`
    message: str
    param: str | None
    code: str | None
    headers: dict[str, str]


class Replicas(msgspec.Struct, tag="replicas", array_like=True):
    """Where a deployment's live replicas are now (none: unloaded)."""

    deployment_id: str
    addresses: list[str]


ToSupervisor = (
    Hello
    | Acquire
    | GetStatus
    | GetCapacity
    | Apply
    | Remove
    | ResumeAccount
    | StartRun
    | StopRuns
    | CancelVideo
    | Touch
    | Forget
    | Wake
    | LineAnswered
)
FromSupervisor = Done | Refused | Replicas | Forget | RunLine

_encoder = msgspec.msgpack.Encoder()
_to_supervisor = msgspec.msgpack.Decoder(ToSupervisor)
_from_supervisor = msgspec.msgpack.Decoder(FromSupervisor)


def encode(message: msgspec.Struct) -> bytes:
    body = _encoder.encode(message)
    return len(body).to_bytes(4, "big") + body


def decode_to_supervisor(body: bytes) -> ToSupervisor:
    message: ToSupervisor = _to_supervisor.decode(body)
    return message


def decode_from_supervisor(body: bytes) -> FromSupervisor:
    message: FromSupervisor = _from_supervisor.decode(body)
    return message
