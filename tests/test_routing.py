"""The endpoint → pipeline table and deployment choice, as pure logic."""

from __future__ import annotations

import pytest

from modelhost.auth.principal import ADMIN, Principal, PrincipalKind
from modelhost.errors import EndpointNotSupported, InvalidAPIKey, InvalidRequest, ModelNotFound
from modelhost.pipelines import BY_NAME, ENDPOINT_TASKS
from modelhost.routing import DeploymentRef, resolve_deployment

EMB = DeploymentRef(id="dep_e", model="emb", pipeline="feature-extraction")
CHAT = DeploymentRef(id="dep_c", model="chat", pipeline="text-generation")
INPAINT = DeploymentRef(id="dep_i", model="paint", pipeline="inpainting")
ACCOUNT = Principal(kind=PrincipalKind.ACCOUNT, account_id="acct_1", key_id="key_1")
SCOPED = Principal(
    kind=PrincipalKind.DEPLOYMENT, account_id="acct_1", key_id="key_2", deployment_ids=frozenset({"dep_e"})
)
ALL = [EMB, CHAT, INPAINT]


def test_every_endpoint_of_the_design_table_is_routed() -> None:
    assert (
        ENDPOINT_TASKS["/v1/embeddings"]
        == ENDPOINT_TASKS["/v1/feature-extraction"]
        == ("feature-extraction",)
    )
    assert ENDPOINT_TASKS["/v1/images/edits"] == ("image-to-image", "inpainting")
    assert ENDPOINT_TASKS["/v1/chat/completions"] == ("text-generation", "image-text-to-text")
    assert ENDPOINT_TASKS["/v1/responses"] == ("text-generation", "image-text-to-text")
    assert (
        ENDPOINT_TASKS["/v1/messages"]
        == ENDPOINT_TASKS["/v1/messages/count_tokens"]
        == ("text-generation", "image-text-to-text")
    )
    assert ENDPOINT_TASKS["/v1/text/translation"] == ("translation",)
    assert (
        ENDPOINT_TASKS["/tokenize"]
        == ENDPOINT_TASKS["/detokenize"]
        == ("text-generation", "image-text-to-text")
    )
    assert len(ENDPOINT_TASKS) == 36
    assert "text-ranking" in BY_NAME and len(BY_NAME) == 28


def test_named_model_is_chosen() -> None:
    assert resolve_deployment(ACCOUNT, "/v1/chat/completions", "chat", ALL) == CHAT


def test_one_endpoint_may_serve_several_tasks() -> None:
    assert resolve_deployment(ACCOUNT, "/v1/images/edits", "paint", ALL) == INPAINT


def test_scoped_key_without_model_uses_its_deployment() -> None:
    assert resolve_deployment(SCOPED, "/v1/embeddings", None, ALL) == EMB


def test_account_key_without_model_must_name_it() -> None:
    with pytest.raises(InvalidRequest) as caught:
        resolve_deployment(ACCOUNT, "/v1/embeddings", None, ALL)
    assert caught.value.param == "model"


def test_unknown_model_is_not_found_before_scope_is_considered() -> None:
    with pytest.raises(ModelNotFound):
        resolve_deployment(SCOPED, "/v1/embeddings", "gpt-4o", ALL)


def test_model_outside_scope_is_invalid_key() -> None:
    with pytest.raises(InvalidAPIKey):
        resolve_deployment(SCOPED, "/v1/chat/completions", "chat", ALL)


def test_wrong_pipeline_is_endpoint_not_supported() -> None:
    with pytest.raises(EndpointNotSupported):
        resolve_deployment(ACCOUNT, "/v1/chat/completions", "emb", ALL)


def test_admin_is_not_a_caller() -> None:
    with pytest.raises(InvalidAPIKey):
        resolve_deployment(ADMIN, "/v1/embeddings", "emb", ALL)
