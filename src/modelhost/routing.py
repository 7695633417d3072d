"""The choice of a request's deployment, and whether its pipeline task serves the endpoint (DESIGN.md).

This module is the one place that decides whether a deployment supports an endpoint (which endpoints a
task answers is declared in `modelhost.pipelines`). It is pure:
callers hand it the caller's principal and deployments; it raises the documented errors.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from modelhost.auth.principal import Principal, PrincipalKind
from modelhost.errors import (
    BaseNotShared,
    Conflict,
    EndpointNotSupported,
    InvalidAPIKey,
    InvalidRequest,
    ModelNotFound,
)
from modelhost.pipelines import ENDPOINT_TASKS


@dataclass(frozen=True, slots=True)
class DeploymentRef:
    """What routing needs to know of a deployment."""

    id: str
    model: str
    pipeline: str
    # Why it serves nothing now (an adapter deployment detached from a base no longer shared with its
    # account): its requests are 409 `base_not_shared` with this message
    unavailable: str | None = None
    # Sampling defaults of its requests (`GenerationDefaults`' fields that are set), sent with each
    # generation request: the replica puts them before the model's own (`generation.requests`)
    generation_defaults: dict[str, int | float] | None = None
    # Its versions (artifacts) and how requests split between them (docs/deploy.md, "Rollouts"); empty:
    # one version, its artifact, whose runtime key is the deployment ID (an adapter deployment's too)
    versions: tuple[Version, ...] = ()
    sticky: str | None = None  # `user` or `key`: the same caller stays on one version of a canary
    # What the runtime is asked to run the request on (`runtime_key`) and the artifact that serves it
    # (the `x-modelhost-artifact` header), once `with_version` chose; the deployment ID and None before
    runtime_key: str = ""
    serving_artifact: str | None = None

    def with_version(self, subject: str | None) -> DeploymentRef:
        """This deployment with the version a request runs on chosen (`subject`: the sticky caller)."""
        if not self.versions:  # the one artifact: the same answer every time, kept (issue 71)
            return self if self.runtime_key == self.id else replace(self, runtime_key=self.id)
        if len(self.versions) == 1 and self.serving_artifact == self.versions[0].artifact_id:
            return self  # one version is every request's (`choose_version`): chosen once, kept
        artifact_id = choose_version(self.versions, subject if self.sticky else None)
        return replace(self, runtime_key=version_key(self.id, artifact_id), serving_artifact=artifact_id)

    def on_version(self, artifact_id: str) -> DeploymentRef:
        """This deployment on the version of `artifact_id`, whatever the split (an eval run of one
        version: `modelhost.evals`); 409 `version_not_serving` unless that version is active or
        loading."""
        if why := self.version_refused(artifact_id):
            raise Conflict(why, code="version_not_serving", param="artifact_id")
        return replace(self, runtime_key=version_key(self.id, artifact_id), serving_artifact=artifact_id)

    def version_refused(self, artifact_id: str) -> str | None:
        """Why this deployment cannot run a request on the version of `artifact_id` (None: it can)."""
        if any(v.artifact_id == artifact_id and v.state in ("active", "loading") for v in self.versions):
            return None
        return f"Deployment {self.model} has no version of artifact {artifact_id[:64]} active or loading."


@dataclass(frozen=True, slots=True)
class Version:
    """One artifact a deployment serves (docs/deploy.md): `traffic` is the percent of requests it is to
    take once it is `active`; `loading` beside the others (no requests yet), `draining` (its requests in
    flight finish, none new), `failed` (its load failed: `reason`; no requests)."""

    artifact_id: str
    traffic: int
    state: str = "active"
    since: str = ""  # ISO time of its last state change
    reason: str | None = None


def version_key(deployment_id: str, artifact_id: str) -> str:
    """The runtime's name for one version of a deployment: each runs as replicas of their own."""
    return f"{deployment_id}@{artifact_id}"


def split_key(key: str) -> tuple[str, str | None]:
    """A runtime key's deployment and artifact (None: the deployment's own choice of version)."""
    deployment_id, _, artifact_id = key.partition("@")
    return deployment_id, artifact_id or None


def serving_weights(versions: Sequence[Version]) -> list[tuple[str, int]]:
    """How requests split between the versions now: the `active` ones by their traffic. The share of a
    version not active yet (loading, or failed) stays with the active versions that are leaving (traffic
    0: the old one of a rollout, until the new one is ready), else with the other active ones. Nothing
    active (a cold deployment, or `replace` while the new version loads): the versions that take traffic,
    loading ones included (their requests wait for the load)."""
    active = [v for v in versions if v.state == "active"]
    taking = [(v.artifact_id, v.traffic) for v in active if v.traffic > 0]
    pending = sum(v.traffic for v in versions if v.state != "active")
    leaving = [v for v in active if v.traffic == 0]
    if pending and leaving:
        share, extra = divmod(pending, len(leaving))
        taking += [(v.artifact_id, share + (i < extra)) for i, v in enumerate(leaving)]
    if taking:
        return taking
    waiting = [(v.artifact_id, v.traffic) for v in versions if v.state == "loading" and v.traffic > 0]
    return waiting or [(v.artifact_id, 1) for v in versions if v.state in ("active", "loading")]


def choose_version(versions: Sequence[Version], subject: str | None = None) -> str:
    """The artifact one request runs on, drawn by `serving_weights`; with a `subject` (a sticky canary's
    user or key) drawn from its hash instead, so every gateway process puts the same caller on the same
    version while the split holds."""
    weights = serving_weights(versions) or [(versions[0].artifact_id, 1)]
    total = sum(w for _, w in weights)
    if subject is not None:
        digest = hashlib.sha256(subject.encode()).digest()
        point = int.from_bytes(digest[:8], "big") % total
    else:
        point = random.randrange(total)
    for artifact_id, weight in weights:
        if point < weight:
            return artifact_id
        point -= weight
    return weights[-1][0]


def resolve_deployment(
    principal: Principal,
    endpoint: str,
    requested_model: str | None,
    account_deployments: Iterable[DeploymentRef],
) -> DeploymentRef:
    """Pick the deployment a request runs on, or raise the error api.md prescribes.

    1. `model` given: it must name one of the account's deployments (else 404 Model not found,
       vendor names included) that the key covers (else 401).
    2. No `model`: a deployment key scoped to exactly one deployment uses it; anyone else must say.
    Then the deployment's pipeline must serve the endpoint (else 400 Endpoint not supported), and the
    deployment must serve at all (an adapter detached from a base no longer shared: 409 `base_not_shared`).
    """
    if principal.kind is PrincipalKind.ADMIN or principal.account_id is None:
        raise InvalidAPIKey(
            "The admin key cannot call inference endpoints; use an account or deployment key."
        )
    deployments = list(account_deployments)
    if requested_model is not None:
        chosen = next((d for d in deployments if d.model == requested_model), None)
        if chosen is None:
            raise ModelNotFound(requested_model)
        if not principal.covers(chosen.id):
            raise InvalidAPIKey("This API key is not scoped to the requested model.")
    else:
        covered = [
            d for d in deployments if principal.kind is PrincipalKind.DEPLOYMENT and principal.covers(d.id)
        ]
        if len(covered) != 1:
            raise InvalidRequest(
                "'model' is required unless the key is scoped to a single deployment.", param="model"
            )
        chosen = covered[0]
    if chosen.pipeline not in ENDPOINT_TASKS[endpoint]:
        raise EndpointNotSupported(
            f"Endpoint not supported: {endpoint} needs a {' or '.join(ENDPOINT_TASKS[endpoint])} deployment, "
            f"and '{chosen.model}' is {chosen.pipeline}.",
            param="model",
        )
    if chosen.unavailable is not None:
        raise BaseNotShared(chosen.unavailable, param="model")
    return chosen
