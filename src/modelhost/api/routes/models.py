"""`GET /v1/models` in OpenAI's shape: only the deployments the key may call."""

from __future__ import annotations

from fastapi import APIRouter, Path

from modelhost.api.deps import CallerPrincipal, ServicesDep, account_id_of
from modelhost.api.errors import error_responses
from modelhost.auth.principal import Principal
from modelhost.container import Services
from modelhost.errors import ModelNotFound
from modelhost.protocol.models import Model, ModelExtensions, ModelList

router = APIRouter(prefix="/v1/models", tags=["openai"], responses=error_responses(401))


def _visible(principal: Principal, services: Services) -> list[Model]:
    """An adapter deployment names its base as `parent` and `root`, as vLLM lists LoRA adapters."""
    account_id = account_id_of(principal)
    deployments = [d for d in services.deployments.list_deployments(account_id) if principal.covers(d.id)]
    bases = services.deployments.base_models(deployments)
    models = []
    for d in deployments:
        base = bases.get(d.base_deployment_id) if d.base_deployment_id else None
        created = int(d.created_at.timestamp())
        extensions = ModelExtensions(task=d.pipeline)
        shown = Model(id=d.model, created=created, owned_by=account_id, modelhost=extensions)
        models.append(shown.model_copy(update={"parent": base, "root": base or d.model}))
    return models


@router.get("", summary="List the models this key may call")
def list_models(principal: CallerPrincipal, services: ServicesDep) -> ModelList:
    return ModelList(data=_visible(principal, services))


@router.get("/{model:path}", summary="Get one model", responses=error_responses(404))
def get_model(principal: CallerPrincipal, services: ServicesDep, model: str = Path(max_length=128)) -> Model:
    found = next((m for m in _visible(principal, services) if m.id == model), None)
    if found is None:
        raise ModelNotFound(model)
    return found
