"""The choice of a request's deployment, and whether its pipeline task serves the endpoint (DESIGN.md).

This module is the one place that decides whether a deployment supports an endpoint (which endpoints a
task answers is declared in `modelhost.pipelines`). It is pure:
callers hand it the caller's principal and deployments; it raises the documented errors.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from modelhost.auth.principal import Principal, PrincipalKind
from modelhost.errors import BaseNotShared, EndpointNotSupported, InvalidAPIKey, InvalidRequest, ModelNotFound
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
