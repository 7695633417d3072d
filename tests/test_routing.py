"""The endpoint → pipeline table and deployment choice, as pure logic."""

from __future__ import annotations

import pytest

from modelhost.auth.principal import ADMIN, Principal, PrincipalKind
from modelhost.errors import EndpointNotSupported, InvalidAPIKey, InvalidRequest, ModelNotFound
from modelhost.pipelines import BY_NAME, ENDPOINT_TASKS
from modelhost.routing import DeploymentRef, Version, choose_version, resolve_deployment, serving_weights
from modelhost.services import rollouts

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
    assert ENDPOINT_TASKS["/v1/realtime"] == ("text-generation", "image-text-to-text")
    assert (
        ENDPOINT_TASKS["/v1/messages"]
        == ENDPOINT_TASKS["/v1/messages/count_tokens"]
        == ("text-generation", "image-text-to-text")
    )
    assert ENDPOINT_TASKS["/v1/text/translation"] == ("translation",)
    assert (
        ENDPOINT_TASKS["/tokenize"]
        == ENDPOINT_TASKS["/detokenize"]
        == ENDPOINT_TASKS["/tokenizer_info"]
        == ("text-generation", "image-text-to-text")
    )
    assert len(ENDPOINT_TASKS) == 38
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


# ---------------------------------------------------------------- versions: the split and a rollout's steps

NOW = "2026-11-27T03:00:00Z"


def test_the_version_draw_gives_a_ten_percent_canary_ten_percent_of_a_thousand_requests() -> None:
    versions = (Version("art_old", 90), Version("art_new", 10))
    drawn = [choose_version(versions) for _ in range(1000)]
    assert 70 <= drawn.count("art_new") <= 130
    assert set(drawn) == {"art_old", "art_new"}


def test_a_sticky_caller_stays_on_one_version_and_callers_split_by_the_percentages() -> None:
    versions = (Version("art_old", 90), Version("art_new", 10))
    assert len({choose_version(versions, "user-7") for _ in range(50)}) == 1
    callers = [choose_version(versions, f"user-{n}") for n in range(1000)]
    assert 70 <= callers.count("art_new") <= 130


def test_a_rollout_serves_the_old_version_until_the_new_one_is_ready_then_drains_it() -> None:
    table = rollouts.plan([Version("a", 100)], {"b": 100}, NOW, loaded=True, replacing=False)
    assert [(v.artifact_id, v.state, v.traffic) for v in table] == [("a", "active", 0), ("b", "loading", 100)]
    assert serving_weights(table) == [("a", 100)]  # the new one takes nothing while it loads
    table = rollouts.loaded(table, "b", NOW)
    assert [(v.artifact_id, v.state) for v in table] == [("a", "draining"), ("b", "active")]
    assert serving_weights(table) == [("b", 100)]
    assert [v.artifact_id for v in rollouts.drained(table, "a")] == ["b"]


def test_a_failed_load_leaves_the_old_version_serving_and_says_why() -> None:
    table = rollouts.plan([Version("a", 100)], {"b": 100}, NOW, loaded=True, replacing=False)
    table = rollouts.failed(table, "b", "out of memory", NOW)
    assert serving_weights(table) == [("a", 100)]
    assert [(v.state, v.reason) for v in table] == [("active", None), ("failed", "out of memory")]


def test_a_rollback_takes_back_a_version_still_loaded_at_once() -> None:
    rolling = rollouts.plan([Version("a", 100)], {"b": 100}, NOW, loaded=True, replacing=False)
    back = rollouts.plan(rolling, {"a": 100}, NOW, loaded=True, replacing=False)
    assert [(v.artifact_id, v.state) for v in back] == [("a", "active")]  # the load of b stops
    done = rollouts.loaded(rolling, "b", NOW)  # a is draining now
    back = rollouts.plan(done, {"a": 100}, NOW, loaded=True, replacing=False)
    assert [(v.artifact_id, v.state, v.traffic) for v in back] == [("a", "active", 100), ("b", "draining", 0)]


def test_replace_drains_the_old_version_first_and_requests_wait_for_the_new_one() -> None:
    table = rollouts.plan([Version("a", 100)], {"b": 100}, NOW, loaded=True, replacing=True)
    assert [(v.artifact_id, v.state) for v in table] == [("a", "draining"), ("b", "loading")]
    assert serving_weights(table) == [("b", 100)]  # they wait for its load


def test_a_deployment_not_loaded_just_switches() -> None:
    table = rollouts.plan([Version("a", 100)], {"b": 90, "c": 10}, NOW, loaded=False, replacing=False)
    assert [(v.artifact_id, v.state, v.traffic) for v in table] == [("b", "active", 90), ("c", "active", 10)]
