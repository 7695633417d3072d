"""Accounts, keys and deployments (shared/spec/management.md)."""

from __future__ import annotations

import itertools
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, Field, model_validator

from modelhost.protocol.chat import MinP, RepetitionPenalty, Temperature, TemplateKwargs, TopK
from modelhost.protocol.common import PageOf, StrictModel

Readiness = Literal["cold", "warm", "hot"]
Engine = Literal[
    "auto", "vllm", "llamacpp", "onnxruntime", "openvino", "transformers"
]  # runtime.engine_choice.ENGINES
EngineInUse = Literal["vllm", "llamacpp", "onnxruntime", "openvino", "transformers"]
Precision = Literal["float32", "int8"]
PRECISION_DESCRIPTION = (
    "`int8`: an encoder task (the tasks `onnxruntime` serves) runs on ONNX Runtime with int8 weights "
    "(dynamic quantization), accepted only if a quality probe holds: embeddings at cosine >= 0.99 to "
    "float32 on every probe sentence, classifiers the same top label on >= 98 % of the probe inputs. "
    "The probe runs when the deployment is created (its first load); a 400 gives the figures otherwise. "
    "Set at creation only."
)
ENGINE_DESCRIPTION = (
    "The engine asked for: `auto` (for text generation and chat with images, vLLM where it is installed "
    "and can run the model's architecture, else transformers; for feature extraction, text "
    "classification, reranking, question answering, fill-mask, token and zero-shot classification and "
    "the image encoders, the faster of ONNX Runtime and OpenVINO where a replica measures it equal to "
    "torch and faster, else transformers; for a GGUF artifact, llamacpp), `vllm` (generation only), "
    "`llamacpp` (text generation from GGUF files, and the only engine for them), `onnxruntime` or "
    "`openvino` (those encoder tasks only) or `transformers`; "
    "an engine that cannot serve the deployment is 400 `engine_not_supported`. vLLM is chosen when the "
    "deployment is created or its engine is changed; an encoder's runtime when a replica first loads it."
)
DeploymentState = Literal["unloaded", "loading", "ready", "failed"]
ModelId = Annotated[
    str,
    Field(
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$",
        description="The customer's own model ID, unique within the account.",
        examples=["my-embedder"],
    ),
]
Name = Annotated[str, Field(min_length=1, max_length=200)]
RoleName = Literal["owner", "admin", "developer", "viewer", "billing"]  # `auth.roles.Role`
Credits = Annotated[float, Field(ge=-1e12, le=1e12, allow_inf_nan=False)]


PerMinute = Annotated[int, Field(ge=1, le=10**12)]


class RateLimits(StrictModel):
    """Rate limits of an account or a key (docs/limits.md). Each is optional: absent or null means
    unlimited. A request over one is a 429 `rate_limit_exceeded` with `Retry-After`."""

    requests_per_minute: PerMinute | None = Field(
        default=None, description="Requests admitted per minute (a bucket refilled continuously)."
    )
    tokens_per_minute: PerMinute | None = Field(
        default=None,
        description="Tokens per minute: prompt plus completion tokens for generation, input tokens for "
        "embeddings and the other text tasks; media tasks count requests only.",
    )
    concurrent_requests: Annotated[int, Field(ge=1, le=10**6)] | None = Field(
        default=None, description="Requests in flight at once."
    )
    credits_per_day: Annotated[float, Field(gt=0, le=1e12, allow_inf_nan=False)] | None = Field(
        default=None,
        description="Accounts only: a spend cap, credits billed per UTC day; reached, inference is a 429 "
        "`insufficient_quota` until the next day.",
    )
    credits_per_month: Annotated[float, Field(gt=0, le=1e12, allow_inf_nan=False)] | None = Field(
        default=None, description="Accounts only: a spend cap, credits billed per UTC month."
    )


LIMITS_DESCRIPTION = (
    "Rate limits (docs/limits.md); null or absent: unlimited. A key's limits may not exceed its "
    "account's (400 `limit_above_account`)."
)


Weight = Annotated[float, Field(ge=0.01, le=1000, allow_inf_nan=False)]
ACCOUNT_WEIGHT = (
    'The account\'s share of a shared model against other accounts (docs/limits.md, "Fair shares"), and of '
    "the memory budget when accounts compete for it: an account of weight 2 is served twice the tokens of "
    "an account of weight 1 while both wait. Set by the operator; 1 by default."
)
KEY_WEIGHT = (
    "The key's share of what its account is served by a shared model, against the account's other keys "
    '(docs/limits.md, "Fair shares"); 1 by default. Setting or changing it needs `keys:manage`.'
)


class AccountCreate(StrictModel):
    name: Name
    credits: Annotated[float, Field(ge=0, le=1e12, allow_inf_nan=False)] | None = Field(
        default=None, description="Credits granted at creation; omitted: the operator's initial grant."
    )
    limits: RateLimits | None = Field(default=None, description=LIMITS_DESCRIPTION)
    weight: Weight = Field(default=1.0, description=ACCOUNT_WEIGHT)


class AccountPatch(StrictModel):
    name: Name | None = None
    limits: RateLimits | None = Field(
        default=None, description=LIMITS_DESCRIPTION + " Given, it replaces the account's limits whole."
    )
    weight: Weight | None = Field(default=None, description=ACCOUNT_WEIGHT)


class CreditsTopUp(StrictModel):
    credits: Credits = Field(description="Credits to add; negative for corrections.")


class Account(BaseModel):
    id: str
    name: str
    credits: float = Field(description="The balance: credits granted minus credits used.")
    credits_granted: float = Field(
        description="All credits granted so far (top-ups and corrections included)."
    )
    credits_used: float = Field(description="All credits billed so far (the sum of the ledger).")
    limits: RateLimits | None = Field(default=None, description=LIMITS_DESCRIPTION)
    weight: float = Field(default=1.0, description=ACCOUNT_WEIGHT)
    created_at: datetime


class AccountCreated(Account):
    api_key: str = Field(description="The account key's secret. Shown once.")


GraceSeconds = Annotated[int, Field(ge=0, le=366 * 86400)]
CacheSalt = Annotated[str, Field(min_length=1, max_length=256)]
CACHE_SALT = (
    'The key\'s prefix-cache salt (docs/access.md, "Cache salts"): its requests reuse only prompt prefixes '
    "cached by requests of keys with the same salt, and report only those in `cached_tokens`; null: the "
    "cache the deployment's unsalted keys share. Setting or changing it needs `keys:manage`."
)


class KeyCreate(StrictModel):
    name: Name | None = None
    deployments: Annotated[list[str], Field(min_length=1, max_length=100)] | None = Field(
        default=None, description="Deployment IDs this key may call; omitted for an account key."
    )
    limits: RateLimits | None = Field(default=None, description=LIMITS_DESCRIPTION)
    # strict=False: JSON carries times as ISO 8601 strings
    expires_at: Annotated[AwareDatetime, Field(strict=False)] | None = Field(
        default=None,
        description="When the key stops working (ISO 8601 with a time zone, in the future); after it, "
        "401 `expired_api_key`. Omitted (with `expires_in`): never.",
    )
    expires_in: Annotated[int, Field(ge=1, le=10 * 366 * 86400)] | None = Field(
        default=None, description="Or: seconds from now until the key stops working. Not with `expires_at`."
    )
    role: RoleName | None = Field(
        default=None,
        description="What the key may do (docs/access.md), at most what its creator may; omitted: the "
        "creator's. A person's key never does more than their role in the account at the time of a call.",
    )
    user_id: str | None = Field(
        default=None,
        max_length=64,
        description="The person the key belongs to (`keys:manage` for anyone but yourself); omitted: the "
        "caller, where a person calls, else a service key.",
    )
    service: bool = Field(
        default=False, description="A service key, owned by no one (`keys:manage`); not with `user_id`."
    )
    cache_salt: CacheSalt | None = Field(default=None, description=CACHE_SALT)
    weight: Weight = Field(default=1.0, description=KEY_WEIGHT)


class KeyRotate(StrictModel):
    grace_seconds: GraceSeconds = Field(
        default=0,
        description="How long the old key keeps working beside the new one (0: it stops at once); then it "
        "expires (401 `expired_api_key`). An earlier expiry of its own stays.",
    )


class KeyUse(BaseModel):
    """What a limited key has left now (docs/limits.md): its buckets and its requests in flight."""

    in_flight: int
    requests_remaining: int | None = Field(default=None, description="Null: no requests limit.")
    tokens_remaining: int | None = Field(default=None, description="Null: no tokens limit.")


class KeyPatch(StrictModel):
    name: Name | None = None
    limits: RateLimits | None = Field(
        default=None,
        description=LIMITS_DESCRIPTION + " Given, it replaces the key's limits whole (null: none); "
        "it takes effect on the key's next request.",
    )
    cache_salt: CacheSalt | None = Field(
        default=None, description=CACHE_SALT + " Given, it replaces the key's salt (null: none)."
    )
    weight: Weight | None = Field(default=None, description=KEY_WEIGHT)


class Key(BaseModel):
    id: str
    name: str | None
    kind: Literal["account", "deployment"]
    deployments: list[str] | None
    prefix: str = Field(description="First characters of the secret, to tell keys apart.")
    limits: RateLimits | None = Field(default=None, description=LIMITS_DESCRIPTION)
    use: KeyUse | None = Field(
        default=None, description="A key with rate limits: what it has left now (listing only)."
    )
    created_at: datetime
    revoked_at: datetime | None = None
    expires_at: datetime | None = Field(
        default=None, description="When the key stops working (401 `expired_api_key`); null: never."
    )
    role: RoleName = Field(description="The key's own role; a person's key does no more than their role.")
    user_id: str | None = Field(default=None, description="The person who owns it; null: a service key.")
    cache_salt: str | None = Field(default=None, description=CACHE_SALT)
    weight: float = Field(default=1.0, description=KEY_WEIGHT)


class KeyCreated(Key):
    api_key: str = Field(description="The secret. Shown once.")


class GenerationDefaults(StrictModel):
    """A text-generation deployment's sampling defaults: what its requests that leave a field unset get,
    before the model's own generation_config.json (docs/generation.md, "The model's defaults")."""

    temperature: Temperature | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    repetition_penalty: RepetitionPenalty | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="Chat's `max_completion_tokens` and Responses' `max_output_tokens`."
    )


# `generation.deployment_settings.MAX_CHAT_TEMPLATE` (the protocol imports nothing of ours)
MAX_CHAT_TEMPLATE = 32_768


TokenWeight = Annotated[float, Field(ge=0, le=1000, allow_inf_nan=False)]


class FairTokenWeights(StrictModel):
    prompt: TokenWeight = 1.0
    output: TokenWeight = 2.0


class GenerationSettingsFields(StrictModel):
    """A generation deployment's own settings (docs/generation.md, "Per-deployment settings"). Unset:
    the artifact's own (its context, its chat template) or what the replica detects (its parsers)."""

    max_model_len: Annotated[int, Field(ge=16)] | None = Field(
        default=None,
        description="The context length the deployment runs with, at most the model's own "
        "(`max_position_embeddings`; more → 400): its KV cache and its memory footprint follow it, and a "
        "longer prompt (with its max_tokens) is a 400 naming it.",
    )
    chat_template: Annotated[str, Field(min_length=1, max_length=MAX_CHAT_TEMPLATE)] | None = Field(
        default=None,
        description="Jinja chat template that replaces the artifact's (or gives a base model one), up to "
        "32,768 characters; rendered as transformers renders templates, in jinja2's immutable sandbox "
        "(no file or network access). A syntax error → 400.",
    )
    chat_template_kwargs: TemplateKwargs | None = Field(
        default=None,
        description="Default variables of the chat template (such as Qwen3's `enable_thinking`); a "
        "request's own `chat_template_kwargs` win per key.",
    )
    tool_parser: Annotated[str, Field(min_length=1, max_length=64)] | None = Field(
        default=None,
        description="The tool-call parser of the deployment's chat answers, in place of the one detected "
        'from the chat template (docs/generation.md, "Model families"); an unknown name → 400 listing '
        "them.",
    )
    reasoning_parser: Annotated[str, Field(min_length=1, max_length=64)] | None = Field(
        default=None,
        description="The reasoning parser, in place of the one detected; `none`: reasoning is not split "
        "from the answer. An unknown name → 400 listing them.",
    )
    fair_token_weights: FairTokenWeights | None = Field(
        default=None,
        description='What a token served costs in its tenants\' fair shares (docs/limits.md, "Fair shares"): '
        "a prompt token computed (`prompt`, 1 by default) and an output token (`output`, 2); prompt "
        "tokens from the prefix cache cost nothing.",
    )


GENERATION_DEFAULTS_DESCRIPTION = (
    "Sampling defaults of the deployment's chat completions, completions and responses (and their batch "
    "lines): a request's own value wins, these come before the model's generation_config.json."
)


class DeploymentCreate(GenerationSettingsFields):
    """The generation settings' fields (`GenerationSettingsFields`) are set at creation; unset, the
    artifact's own."""

    model: ModelId
    artifact_id: str = Field(min_length=1, max_length=64)
    readiness: Readiness = "cold"
    min_replicas: Annotated[int, Field(ge=0, le=64)] = 1
    max_replicas: Annotated[int, Field(ge=1, le=64)] = 1
    engine: Engine = Field(default="auto", description=ENGINE_DESCRIPTION)
    precision: Precision = Field(default="float32", description=PRECISION_DESCRIPTION)
    base_deployment: Annotated[str, Field(min_length=1, max_length=200)] | None = Field(
        default=None,
        description="For a LoRA adapter artifact: the deployment (ID or model name) whose replicas serve it, "
        "the account's own or one the operator shares; a text-generation or image-text-to-text deployment "
        "on vLLM whose modules the adapter fits (docs/adapters.md). Readiness, replicas and engine are the "
        "base's.",
    )
    generation_defaults: GenerationDefaults | None = Field(
        default=None, description=GENERATION_DEFAULTS_DESCRIPTION
    )

    @model_validator(mode="after")
    def _replica_bounds(self) -> DeploymentCreate:
        if self.min_replicas > self.max_replicas:
            raise ValueError("min_replicas must not exceed max_replicas")
        return self


class RolloutGate(StrictModel):
    """A gated rollout's rule (docs/deploy.md, "Gated rollouts")."""

    eval_id: str = Field(
        max_length=64,
        description="The eval both versions run (its latest `completions` run's data source, each run "
        "pinned to its version), as the key that sends the PATCH.",
    )
    margin: Annotated[float, Field(ge=0, le=1)] = Field(
        default=0.0,
        description="The candidate passes when its score (the mean of the criteria's pass rates) is at least "
        "the current version's less this.",
    )
    steps: list[Annotated[int, Field(ge=1, le=100)]] = Field(
        default_factory=lambda: [10, 50, 100],
        min_length=1,
        max_length=10,
        description="The candidate's percents of traffic, rising, ending at 100 (promoted).",
    )
    step_seconds: Annotated[float, Field(gt=0, le=86400)] = Field(
        default=60.0, description="How long each step runs before its metrics are judged."
    )
    min_requests: Annotated[int, Field(ge=0, le=1_000_000)] = Field(
        default=0,
        description="Requests the candidate must serve in a step before it is judged (the step waits for "
        "them, up to 10 times its length, then rolls back).",
    )
    max_error_rate: Annotated[float, Field(ge=0, le=1)] | None = Field(
        default=0.05, description="The candidate's 5xx share of its requests over a step; null: not judged."
    )
    max_ttft_p50_ms: Annotated[float, Field(gt=0)] | None = Field(
        default=None,
        description="The candidate's median time to first token over a step (ms); null: not judged.",
    )

    @model_validator(mode="after")
    def _rising(self) -> RolloutGate:
        if self.steps[-1] != 100 or any(b <= a for a, b in itertools.pairwise(self.steps)):
            raise ValueError("gate.steps must rise strictly and end at 100")
        return self


class RolloutDecision(BaseModel):
    at: str = Field(description="When (ISO 8601, UTC).")
    step: int | None = Field(description="The index in `gate.steps` it was taken at; null: before the first.")
    decision: Literal["started", "gate_passed", "promoted_step", "promoted", "rolled_back", "canceled"]
    reason: str
    scores: dict[str, Any] | None = Field(
        default=None,
        description="The eval's: each version's score and its criteria's pass rates (`candidate`, `current`, "
        "`candidate_pass_rates`, `current_pass_rates`).",
    )
    metrics: dict[str, Any] | None = Field(
        default=None,
        description="The candidate's over the step: `requests`, `errors`, `error_rate`, `ttft_p50_ms`.",
    )
    traffic: dict[str, int] | None = Field(default=None, description="The split it set: artifact → percent.")
    eval_runs: dict[str, str] | None = Field(
        default=None, description="The eval runs it read: `candidate` and `current` run IDs."
    )


class Rollout(BaseModel):
    gate: RolloutGate
    candidate: str = Field(description="The artifact being rolled out.")
    current: str = Field(description="The artifact serving when it started (what a rollback returns to).")
    state: Literal["evaluating", "promoting", "promoted", "rolled_back", "canceled"] = Field(
        description="`evaluating`: the candidate loads at 0 % and the eval runs on both versions; "
        "`promoting`: it takes `gate.steps[step]` percent; `promoted`: it takes every request; "
        "`rolled_back`: the rule failed (the last decision says why); `canceled`: a new rollout replaced it."
    )
    step: int | None = Field(default=None, description="The index of the step under way in `gate.steps`.")
    step_started_at: str | None = None
    started_at: str
    ended_at: str | None = None
    eval_runs: dict[str, str] = Field(
        default_factory=dict, description="The eval runs of the candidate and the current version."
    )
    decisions: list[RolloutDecision] = Field(
        default_factory=list, description="Every decision, oldest first."
    )


class DeploymentPatch(GenerationSettingsFields):
    """Each generation setting given replaces the deployment's (`null`: back to the artifact's own or
    what is detected)."""

    readiness: Readiness | None = None
    min_replicas: Annotated[int, Field(ge=0, le=64)] | None = None
    max_replicas: Annotated[int, Field(ge=1, le=64)] | None = None
    engine: Engine | None = Field(
        default=None,
        description=ENGINE_DESCRIPTION + " Given (even unchanged), the engine is chosen again: `auto` "
        "after installing vLLM moves a deployment onto it; a loaded deployment reloads on the new engine.",
    )
    generation_defaults: GenerationDefaults | None = Field(
        default=None,
        description=GENERATION_DEFAULTS_DESCRIPTION + " Given, it replaces the whole set (`{}`: none); it "
        "applies to the next request, without a reload.",
    )
    artifact_id: str | None = Field(
        default=None,
        max_length=64,
        description="Roll the deployment to this ready artifact of the same pipeline (docs/deploy.md, "
        '"Rollouts"): a loaded deployment loads it beside the serving version, moves requests to it once it '
        "is ready, and the old version drains and unloads; a deployment not loaded just switches. The "
        "previous artifact again is a rollback (at once while it is still loaded). Keys, model ID, usage "
        "and billing stay the deployment's.",
    )
    traffic: dict[Annotated[str, Field(max_length=64)], Annotated[int, Field(ge=0, le=100)]] | None = Field(
        default=None,
        min_length=1,
        max_length=8,
        description="A canary: artifact → percent of requests (summing to 100); each artifact named runs as "
        "a version, one left out drains and unloads. Not with `artifact_id`.",
    )
    strategy: Literal["rolling", "replace"] = Field(
        default="rolling",
        description="`rolling`: the new version loads beside the old (409 `insufficient_capacity` when both "
        "cannot fit, nothing changed). `replace`: the old version finishes its requests and stops first; "
        "requests arriving meanwhile wait for the new one.",
    )
    sticky: Literal["user", "key"] | None = Field(
        default=None,
        description="During a canary, keep each caller on one version: by the request's `user` field (the "
        "key where it has none) or by the API key; null: each request drawn by the split.",
    )
    gate: RolloutGate | None = Field(
        default=None,
        description='With `artifact_id`: a gated rollout (docs/deploy.md, "Gated rollouts"): the new '
        "artifact loads beside the serving one at 0 %, both run the gate's eval, and it is promoted step by "
        "step while the rule holds, else rolled back; `rollout` on the deployment shows its decisions.",
    )

    @model_validator(mode="after")
    def _one_target(self) -> DeploymentPatch:
        if self.artifact_id is not None and self.traffic is not None:
            raise ValueError("give either artifact_id or traffic, not both")
        if self.gate is not None and (self.artifact_id is None or self.strategy == "replace"):
            raise ValueError("a gate comes with artifact_id, and a rolling strategy")
        if self.traffic is not None and sum(self.traffic.values()) != 100:
            raise ValueError("traffic percents must sum to 100")
        return self


class DeploymentVersion(BaseModel):
    artifact_id: str
    state: Literal["loading", "active", "draining", "failed"] = Field(
        description="`loading` beside the others (no requests yet), `active` (takes its share), `draining` "
        "(its requests in flight finish, none new, then it unloads), `failed` (its load failed: `reason`)."
    )
    traffic: int = Field(description="Percent of requests it is to take once active (0: leaving).")
    since: str = Field(description="When it entered its state (ISO 8601, UTC).")
    reason: str | None = None


class DeploymentSwitch(BaseModel):
    at: str = Field(description="When (ISO 8601, UTC).")
    by: str = Field(
        description="Who: the kind of key that asked and its ID (`account key_...`), or `system`."
    )
    from_: dict[str, int] = Field(alias="from", description="The split before: artifact → percent.")
    to: dict[str, int] = Field(description="The split asked for.")
    strategy: str

    model_config = {"populate_by_name": True, "serialize_by_alias": True}


class ScalingStep(BaseModel):
    """The autoscaler's last step (docs/runtime.md, "Autoscaling (local backend)")."""

    at: float = Field(description="When (unix time, seconds).")
    from_: int = Field(alias="from", description="Replicas before.")
    to: int = Field(
        description="Replicas after; equal to `from` for a step not taken (the memory budget had no room "
        "for another replica, or the new one failed to load), `reason` saying why."
    )
    reason: str = Field(description="Why: the load measured over the window, and what stopped it if so.")

    model_config = {"populate_by_name": True, "serialize_by_alias": True}


class Deployment(BaseModel):
    id: str
    model: str
    artifact_id: str
    pipeline: str
    readiness: Readiness
    state: DeploymentState = Field(description="Live state of the deployment's replicas.")
    state_reason: str | None = Field(
        default=None,
        description="Why the deployment is `failed` (an adapter deployment detached from a base no longer "
        "shared with the account included) or `unloaded` (out of credits, evicted, no memory within the "
        "wait); while it is `ready` or `loading`, the last replica the supervisor restarted for exceeding "
        "the memory limit, if any. It names no other account's deployment: those are counted.",
    )
    replicas: int = Field(description="Replicas loaded now.")
    desired_replicas: int = Field(
        default=0,
        description="Replicas the autoscaler wants now, between `min_replicas` (at least 1) and "
        "`max_replicas` while loaded, 0 unloaded: more than `replicas` while one starts or the memory "
        "budget has no room for it.",
    )
    last_scaling: ScalingStep | None = Field(
        default=None, description="The autoscaler's last step, with its reason; null before any."
    )
    min_replicas: int
    max_replicas: int
    engine: Engine = Field(description="The engine asked for.")
    engine_in_use: EngineInUse = Field(description="The engine that runs the deployment's replicas.")
    engine_reason: str | None = Field(
        default=None, description="Why that engine, where `auto` or a fallback chose it; null otherwise."
    )
    precision: Precision = "float32"
    precision_quality: str | None = Field(
        default=None, description="int8: its quality against float32, measured by the first replica to load."
    )
    memory_gb: float = Field(description="Measured resident memory of the loaded replicas.")
    last_cold_start_seconds: float | None = None
    base_deployment: str | None = Field(
        default=None,
        description="An adapter deployment's base: the deployment whose replicas serve it (its state is "
        "theirs). Null for a full model.",
    )
    shared: bool = Field(
        default=False, description="The operator shares it with every account as a base for their adapters."
    )
    generation_defaults: dict[str, int | float] = Field(
        default_factory=dict, description="The sampling defaults set on the deployment (the fields set only)."
    )
    max_model_len: int | None = Field(
        default=None, description="The context length set on the deployment; null: the model's own."
    )
    chat_template: str | None = Field(
        default=None, description="The chat template set on the deployment; null: the artifact's own."
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="The chat template's default variables set on the deployment."
    )
    tool_parser: str | None = Field(
        default=None,
        description="The tool-call parser set on the deployment; null: detected from the chat template.",
    )
    reasoning_parser: str | None = Field(
        default=None,
        description="The reasoning parser set on the deployment (`none`: off); null: detected from the "
        "chat template.",
    )
    fair_token_weights: dict[str, float] = Field(
        default_factory=dict,
        description="What a prompt and an output token cost in its tenants' fair shares, set on the "
        "deployment; empty: 1 and 2.",
    )
    family: str | None = Field(
        default=None,
        description="The model family detected from the artifact's chat template (the deployment's own "
        'where it has one) and its tokenizer\'s added tokens (docs/generation.md, "Model families"); '
        "null for other tasks.",
    )
    tool_parser_in_use: str | None = Field(
        default=None, description="The tool-call parser its replicas use: the one set, else the family's."
    )
    reasoning_parser_in_use: str | None = Field(
        default=None,
        description="The reasoning parser its replicas use: the one set, else the family's; null: none.",
    )
    versions: list[DeploymentVersion] = Field(
        default_factory=list, description="The artifacts it serves and how requests split (docs/deploy.md)."
    )
    sticky: Literal["user", "key"] | None = None
    history: list[DeploymentSwitch] = Field(
        default_factory=list, description="Its last artifact switches (20 at most), oldest first."
    )
    rollout: Rollout | None = Field(
        default=None, description="Its last gated rollout, with its steps and decisions; null: none."
    )
    created_at: datetime
    updated_at: datetime


class DeploymentShare(StrictModel):
    shared: bool = Field(
        description="Share the deployment with every account as a base for their adapters (none sees "
        "another's adapters, requests or usage); false stops sharing it and detaches the adapter "
        'deployments of other accounts (docs/adapters.md, "Unsharing a base").'
    )


class SharedDeployment(Deployment):
    detached_adapters: int = Field(
        default=0,
        description="Adapter deployments of other accounts that this change detached from the base.",
    )


class MemoryCapacity(BaseModel):
    budget_bytes: int = Field(description="Host memory that replicas may take together.")
    reserved_bytes: int = Field(
        description="Held by deployments: measured footprints of loaded replicas, predicted ones of replicas "
        "loading, and those of replicas being stopped until their processes have exited."
    )
    free_bytes: int = Field(
        description="Budget less reserved (negative while measured footprints exceed it)."
    )
    limit_bytes: int | None = Field(
        default=None,
        description="With the default budget: the machine's memory or its cgroup's limit, the smaller.",
    )
    server_bytes: int | None = Field(
        default=None,
        description="With the default budget: what the server's own processes hold (left out of the budget).",
    )
    waiting: int = Field(default=0, description="Loads waiting for memory now.")


class GpuCapacity(BaseModel):
    index: int
    budget_bytes: int = Field(description="`MODELHOST_GPU_MEMORY_FRACTION` of the GPU's memory.")
    reserved_bytes: int
    free_bytes: int


class DeploymentFootprint(BaseModel):
    id: str
    artifact_id: str = Field(
        description="The version it holds memory for: a rollout or a canary holds one entry per version."
    )
    model: str
    account_id: str
    readiness: Readiness
    state: Literal["loading", "ready", "unloading", "unloaded", "failed"]
    device: str = Field(description="`cpu`, or the GPU its replicas run on (`cuda:0`).")
    footprint_bytes: int = Field(description="Host memory it holds (all its replicas).")
    gpu_footprint_bytes: int = Field(default=0, description="GPU memory it holds.")
    footprint_measured: bool = Field(
        description="Measured from its processes; false: predicted (its replicas are still loading)."
    )
    kv_cache_bytes: int = Field(
        default=0,
        description="A generation deployment's KV cache, per replica, as its load reserved it (room for 64 "
        "whole contexts of its `max_model_len`, or the model's, within the budget); 0 for other tasks.",
    )
    in_flight: int = Field(description="Requests and sequences its replicas hold now.")
    last_used_at: datetime


class Capacity(BaseModel):
    memory: MemoryCapacity
    gpus: list[GpuCapacity]
    deployments: list[DeploymentFootprint] = Field(
        description="Every deployment that holds or is taking memory (one entry per load: a deployment "
        "loading again while its old replicas stop has two)."
    )


class AuditActor(BaseModel):
    kind: Literal["admin", "account", "deployment", "system", "session"] = Field(
        description="The kind of key that made the change; `system`: the server itself (expired files "
        "deleted, a batch's output written, an interrupted upload finished); `session`: a person's "
        "sign-in (their memberships following their groups, an invitation accepted)."
    )
    key_id: str | None = Field(default=None, description="The key's ID (null for the admin key and system).")
    address: str | None = Field(default=None, description="The client's IP address.")
    user_id: str | None = Field(default=None, description="The person who owns the key (null: no person).")
    email: str | None = Field(default=None, description="That person's email.")
    subject: str | None = Field(
        default=None, description="Their identity provider's `sub` (null until they have signed in)."
    )


class AuditTarget(BaseModel):
    type: Literal[
        "account",
        "key",
        "deployment",
        "artifact",
        "file",
        "user",
        "invitation",
        "mcp_server",
        "eval",
        "eval_run",
        "realtime_session",
    ]
    id: str


class AuditChange(BaseModel):
    before: Any = None
    after: Any = None


class AuditEntry(BaseModel):
    """One change (docs/operations.md, Audit log). Never holds a secret."""

    id: str
    object: Literal["audit_entry"] = "audit_entry"
    seq: int = Field(description="The row's place in the hash chain: 1, 2, ... without gaps.")
    created_at: datetime
    actor: AuditActor
    request_id: str | None = Field(default=None, description="The request's `x-request-id`.")
    action: str = Field(description="`<target type>.<verb>`: `key.created`, `deployment.updated`, ...")
    target: AuditTarget
    account_id: str | None = Field(default=None, description="The account the target belongs to.")
    changes: dict[str, AuditChange] = Field(description="Each changed field, before and after.")
    hash: str = Field(description="sha256 over the previous row's hash and this row.")


AuditList = PageOf[AuditEntry]


class AuditProblem(BaseModel):
    seq: int
    id: str | None = Field(default=None, description="The row's ID (null: rows missing at the end).")
    reason: str


class AuditVerification(BaseModel):
    ok: bool = Field(description="Every row matches its hash and follows the one before, up to the head.")
    rows: int = Field(description="Rows checked.")
    first_seq: int | None
    last_seq: int = Field(description="The chain head's seq.")
    head_hash: str = Field(description="The chain head's hash: keep it elsewhere to detect a rewrite.")
    pruned_through: int = Field(description="Rows up to this seq were pruned (retention).")
    problems: list[AuditProblem]


class UserCreate(StrictModel):
    """A person without sign-in added to the caller's account (made on first use of their email): the
    holder of keys an admin makes for them. To let someone who signs in through the provider join, invite
    them (`POST /v1/invitations`)."""

    email: Annotated[str, Field(min_length=3, max_length=320, pattern=r"^[^@\s]+@[^@\s]+$")]
    name: Name | None = None
    role: RoleName = Field(description="Their role in this account (docs/access.md).")


PerPeriod = Annotated[int, Field(ge=1, le=10**15)]


class PersonQuota(StrictModel):
    """A person's quota in an account (docs/limits.md, "Quotas per person"): counted over every key they
    own and their sign-in sessions, per UTC day and UTC month. Each is optional: absent or null means
    unlimited. A request over one is a 429 `insufficient_quota` until the day or month ends."""

    requests_per_day: PerPeriod | None = Field(default=None, description="Requests admitted per UTC day.")
    requests_per_month: PerPeriod | None = Field(default=None, description="Requests admitted per UTC month.")
    tokens_per_day: PerPeriod | None = Field(
        default=None,
        description="Tokens per UTC day, counted as `tokens_per_minute` counts them (docs/limits.md): "
        "a request is admitted while some are left, and takes its tokens when it ends.",
    )
    tokens_per_month: PerPeriod | None = Field(default=None, description="Tokens per UTC month.")


QUOTA_DESCRIPTION = (
    "The person's own quota in this account (docs/limits.md, \"Quotas per person\"); null: their role's "
    "default (`GET /v1/role-quotas`), if any."
)


class UserPatch(StrictModel):
    role: RoleName | None = None
    disabled: bool | None = Field(
        default=None, description="True: their keys in this account are refused (401 `user_disabled`)."
    )
    quota: PersonQuota | None = Field(
        default=None,
        description=QUOTA_DESCRIPTION + " Given, it replaces their quota whole; null removes it.",
    )


class User(BaseModel):
    """A person as a member of the caller's account."""

    id: str
    object: Literal["user"] = "user"
    email: str
    name: str | None = None
    role: RoleName
    disabled: bool
    signs_in: bool = Field(
        description="They sign in through the OpenID provider (false: a person without sign-in, made by an "
        "admin by email, whose keys an admin makes)."
    )
    created_at: datetime = Field(description="When they became a member of this account.")
    quota: PersonQuota | None = Field(default=None, description=QUOTA_DESCRIPTION)


class RoleQuotas(BaseModel):
    """The default quota of each role's people in the account (null: none); a person's own quota
    replaces their role's (docs/limits.md, "Quotas per person")."""

    object: Literal["role_quotas"] = "role_quotas"
    owner: PersonQuota | None = None
    admin: PersonQuota | None = None
    developer: PersonQuota | None = None
    viewer: PersonQuota | None = None
    billing: PersonQuota | None = None


class RoleQuotasPatch(StrictModel):
    """The roles' default quotas to change: a role given gets that quota (null: none), the others keep
    theirs. Only for roles that can do no more than the caller (docs/access.md)."""

    owner: PersonQuota | None = None
    admin: PersonQuota | None = None
    developer: PersonQuota | None = None
    viewer: PersonQuota | None = None
    billing: PersonQuota | None = None


ROLE_WEIGHT = (
    "The role's weight inside the account (docs/limits.md, \"Fair shares\"): a key's share of what the "
    "account is served by a shared model is its own `weight` times the weight of the role it acts as; a "
    "sign-in session's is its person's role's. 1 by default."
)


class RoleWeights(BaseModel):
    """The weight of each role inside the account (1: none set)."""

    object: Literal["role_weights"] = "role_weights"
    owner: float = Field(default=1.0, description=ROLE_WEIGHT)
    admin: float = Field(default=1.0, description=ROLE_WEIGHT)
    developer: float = Field(default=1.0, description=ROLE_WEIGHT)
    viewer: float = Field(default=1.0, description=ROLE_WEIGHT)
    billing: float = Field(default=1.0, description=ROLE_WEIGHT)


class RoleWeightsPatch(StrictModel):
    """The roles' weights to change: a role given gets that weight (null: 1 again), the others keep
    theirs. Only for roles that can do no more than the caller (docs/access.md)."""

    owner: Weight | None = None
    admin: Weight | None = None
    developer: Weight | None = None
    viewer: Weight | None = None
    billing: Weight | None = None


class TenantWeights(BaseModel):
    """The weights a caller's requests are counted with by a shared model's fair shares."""

    account: float = Field(description="The account's weight against other accounts (the operator's).")
    key: float = Field(description="Inside the account: the key's own weight times its role's.")


class PeriodUse(BaseModel):
    """What the person used in one UTC day or month, over every key they own and their sessions."""

    period: str = Field(description="The UTC day (`2026-11-29`) or month (`2026-11`).")
    requests: int
    tokens: int
    requests_remaining: int | None = Field(description="Null: no quota of requests for this period.")
    tokens_remaining: int | None = Field(description="Null: no quota of tokens for this period.")
    resets_at: datetime = Field(description="When the period ends (UTC) and its use starts again at 0.")


class QuotaUse(BaseModel):
    """A person's quota in the account and what they used of it (`GET /v1/me`)."""

    limits: PersonQuota | None = Field(description="The quota that applies; null: none (unlimited).")
    source: Literal["person", "role"] | None = Field(
        description="`person`: their own quota; `role`: their role's default; null: no quota."
    )
    day: PeriodUse
    month: PeriodUse


class InvitationCreate(StrictModel):
    """An invitation of an email to a role in the caller's account."""

    email: Annotated[str, Field(min_length=3, max_length=320, pattern=r"^[^@\s]+@[^@\s]+$")]
    role: RoleName = Field(description="Their role once they accept (docs/access.md).")


class Invitation(BaseModel):
    """An account's invitation: offered to whoever signs in with this email, verified by the provider; a
    membership once they accept it."""

    id: str
    object: Literal["invitation"] = "invitation"
    account_id: str
    email: str
    role: RoleName
    created_at: datetime
    expires_at: datetime


class SignedOutEverywhere(BaseModel):
    """A person's sign-in sessions ended and their keys in the account revoked."""

    id: str = Field(description="The person (user ID).")
    object: Literal["user.signed_out_everywhere"] = "user.signed_out_everywhere"
    sessions_ended: int = Field(description="Their sign-in sessions ended (in every account).")
    keys_revoked: int = Field(description="Their keys revoked in this account.")


class Me(BaseModel):
    """Who the calling key acts as (`GET /v1/me`)."""

    object: Literal["principal"] = "principal"
    account_id: str
    key_id: str
    role: RoleName
    actions: list[str] = Field(description="What it may do now (docs/access.md).")
    user: User | None = Field(default=None, description="The person who owns the key; null: a service key.")
    quota: QuotaUse | None = Field(
        default=None,
        description="The person's quota and what they used of it this UTC day and month, over every key "
        "they own and their sign-in sessions; null: a service key (no person, no quota).",
    )
    weights: TenantWeights = Field(
        description="What its requests are counted with by a shared model's fair shares "
        '(docs/limits.md, "Fair shares").'
    )


class SessionAccount(BaseModel):
    """One of a signed-in person's accounts and their role there."""

    id: str | None = Field(max_length=64, description="The account ID (null: act as the operator).")
    role: RoleName | None = None


class SessionInfo(BaseModel):
    """A sign-in session (`GET /v1/auth/session`)."""

    object: Literal["session"] = "session"
    id: str
    user_id: str
    email: str
    name: str | None = None
    operator: bool = Field(description="The person is the operator (their provider group says so).")
    account_id: str | None = Field(description="The account the session acts in now.")
    role: RoleName | None = Field(description="Their role in that account.")
    accounts: list[SessionAccount]
    invitations: list[Invitation] = Field(
        description="Invitations offered to this person (their email, verified by the provider): accept "
        "with `POST /v1/auth/invitations/{id}/accept`."
    )
    csrf_token: str = Field(description="Send it as `x-csrf-token` with every state-changing request.")
    expires_at: datetime = Field(description="When the session ends unless used (idle), or at the latest.")


class SignedOut(BaseModel):
    object: Literal["session.ended"] = "session.ended"
    logout_url: str | None = Field(
        description="The provider's logout for this sign-in (RP-initiated logout): open it to sign out there."
    )


class DeviceStart(StrictModel):
    login_hint: str | None = Field(default=None, max_length=320, description="Passed to the provider.")


class DeviceSignInStarted(BaseModel):
    """RFC 8628's device authorization answer: open `verification_uri` and confirm `user_code`."""

    device_code: str = Field(description="What the CLI polls `POST /v1/auth/device/token` with.")
    user_code: str
    verification_uri: str
    verification_uri_complete: str | None = None
    expires_in: int
    interval: int = Field(description="Seconds between polls.")


class DeviceCode(StrictModel):
    device_code: str = Field(min_length=1, max_length=2000)


class HandoffCode(StrictModel):
    code: str = Field(min_length=1, max_length=200, description="The code the loopback received.")


class SessionToken(BaseModel):
    """A signed-in CLI's session: send it as `Authorization: Bearer <session_token>`."""

    object: Literal["session.token"] = "session.token"
    session_token: str = Field(description="The session's secret (`mhs-...`). Shown once.")
    email: str
    expires_at: datetime


class SignInConfig(BaseModel):
    sso: bool = Field(description="Single sign-on through an OpenID provider is configured.")


class McpServers(StrictModel):
    """An account's allow-list of MCP server URLs (hosted MCP tools in the Responses and Messages APIs
    reach only servers it matches: same scheme, host and port, the path equal or below; none by
    default). `PUT` replaces the whole list."""

    urls: Annotated[list[Annotated[str, Field(max_length=2048)]], Field(max_length=100)] = Field(
        examples=[["https://mcp.example.com/mcp"]]
    )
