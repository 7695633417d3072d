"""Adapter deployments: a LoRA adapter artifact served on the replicas of a base deployment (issue 40).

The rules a create must pass, apart from the store's bookkeeping (`services.deployments`): the base is
the account's own deployment or one the operator shares, is itself a full model of a task that serves
adapters, runs on vLLM, and has every module the adapter adapts, at the adapter's sizes
(`artifacts.adapters.check_fits_base`: headers only, nothing loaded). docs/adapters.md says why each.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from modelhost.artifacts.adapters import AdapterMismatch, check_fits_base
from modelhost.artifacts.inspection import ADAPTER_TASKS
from modelhost.engine_table import engines_where, sole_reader, spec
from modelhost.errors import Conflict, InvalidRequest, NotFound
from modelhost.store.models import Deployment, ModelArtifact

# the engine an adapter deployment runs on, on its base's replicas: the first whose row `serves_adapters`
ADAPTER_ENGINE = engines_where("serves_adapters")[0]


def find_base(session: Session, account_id: str, name: str) -> Deployment:
    """The base an adapter deployment names (`base_deployment`): by ID or model name, the account's own
    deployment first, else one the operator shares with every account."""
    own = session.scalars(
        select(Deployment).where(
            Deployment.account_id == account_id, or_(Deployment.id == name, Deployment.model == name)
        )
    ).first()
    if own is not None:
        return own
    shared = session.scalars(
        select(Deployment).where(
            Deployment.shared.is_(True), or_(Deployment.id == name, Deployment.model == name)
        )
    ).all()
    if len(shared) == 1:
        return shared[0]
    raise NotFound(
        f"No deployment '{name}' of this account, nor one shared with it, to serve the adapter on.",
        param="base_deployment",
        code="base_not_found",
    )


def check_base(base: Deployment) -> None:
    """400 unless the base can serve adapters: a full model, of a task that serves them, on vLLM. A GGUF
    base (llama.cpp) is told it takes none, not to switch engines: only llama.cpp serves a GGUF."""
    if base.base_deployment_id is not None:
        raise InvalidRequest(
            f"'{base.model}' is itself an adapter deployment; an adapter needs a full model as its base.",
            param="base_deployment",
            code="adapter_base_unsupported",
        )
    if base.pipeline not in ADAPTER_TASKS:
        raise InvalidRequest(
            f"'{base.model}' is {base.pipeline}; adapters are served on {' or '.join(ADAPTER_TASKS)} "
            "deployments.",
            param="base_deployment",
            code="adapter_base_unsupported",
        )
    engine = spec(base.engine_in_use)
    if sole_reader(base.engine_in_use):  # a GGUF: no other engine serves it, so no engine to patch to
        raise InvalidRequest(
            f"'{base.model}' is a GGUF model on the {base.engine_in_use} engine, which serves no adapters "
            "here: a PEFT adapter would have to be converted to a GGUF LoRA adapter, which modelhost does "
            "not do yet (docs/adapters.md).",
            param="base_deployment",
            code="adapter_base_unsupported",
        )
    if not engine.serves_adapters:
        raise InvalidRequest(
            f"'{base.model}' runs on the {base.engine_in_use} engine, which does not serve adapters (its "
            f"batches run one set of weights); create or patch the base with engine: {ADAPTER_ENGINE}, "
            "which applies many adapters in one batch.",
            param="base_deployment",
            code="adapter_base_unsupported",
        )


def check_fits(adapter_dir: Path | None, base_dir: Path | None, adapter: ModelArtifact) -> None:
    """400 `adapter_base_mismatch` naming the first target module the base lacks or tensor that does
    not fit it."""
    if adapter_dir is None or base_dir is None:
        raise Conflict("The artifact's files are not available.", code="artifact_not_ready")
    targets = (adapter.adapter or {}).get("target_modules", [])
    try:
        check_fits_base(adapter_dir, base_dir, targets)
    except AdapterMismatch as exc:
        raise InvalidRequest(
            f"The adapter does not fit the base: {exc}", param="base_deployment", code="adapter_base_mismatch"
        ) from exc


def not_an_adapter(artifact: ModelArtifact) -> InvalidRequest:
    return InvalidRequest(
        f"Artifact {artifact.id} is a full model, not an adapter: deploy it without base_deployment.",
        param="base_deployment",
        code="not_an_adapter",
    )


def base_required(artifact: ModelArtifact) -> InvalidRequest:
    return InvalidRequest(
        f"Artifact {artifact.id} is a LoRA adapter: name the deployment that serves it in base_deployment.",
        param="base_deployment",
        code="base_required",
    )


def detach_others(session: Session, base: Deployment) -> list[Deployment]:
    """The operator stopped sharing `base`: the adapter deployments other accounts attached to it are
    detached (docs/adapters.md, "Unsharing a base"). Each stays its account's (name, keys, usage), serves
    nothing, and says why to its owner; none runs on the base or costs its owner anything from now on,
    and the base's owner may delete the base once its own adapters are gone."""
    others = [a for a in attached(session, base.id) if a.account_id != base.account_id]
    when = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for adapter in others:
        adapter.base_deployment_id = None
        adapter.readiness = "cold"  # nothing loads it: it has no base
        adapter.detached_reason = (
            f"Its base '{base.model}' ({base.id}) is no longer shared with this account (the operator "
            f"stopped sharing it at {when}), so this adapter deployment serves nothing: delete it, and "
            "deploy the adapter on a base of your own or one shared with you."
        )
    return others


def attached(session: Session, base_id: str) -> Sequence[Deployment]:
    return session.scalars(
        select(Deployment).where(Deployment.base_deployment_id == base_id).order_by(Deployment.created_at)
    ).all()


def still_attached(base: Deployment, adapters: Sequence[Deployment], change: str = "") -> Conflict:
    """Deleting a base with adapters attached (or moving it off vLLM: `change`): the account's own are
    named; another account's adapters on a shared base are counted, never named."""
    own = [a.model for a in adapters if a.account_id == base.account_id]
    others = len(adapters) - len(own)
    named = ", ".join(f"'{m}'" for m in own[:10]) + (" and more" if len(own) > 10 else "")
    parts = ([f"adapter deployments {named}"] if own else []) + (
        [f"{others} adapter deployment{'s' if others != 1 else ''} of other accounts"] if others else []
    )
    what = f"'{base.model}' {change} and serves" if change else f"'{base.model}' serves"
    return Conflict(
        f"{what} {' and '.join(parts)}: delete them first.",
        param="deployment_id",
        code="base_in_use",
    )
