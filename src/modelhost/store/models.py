"""ORM tables. Every change to them goes with an Alembic migration in `migrations/versions`."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.sql import text
from sqlalchemy.sql.expression import false as sa_false

from modelhost.store.types import UTCDateTime, utcnow

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Account(Base):
    __tablename__ = "accounts"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    # Integer micro-credits (1 credit = 1_000_000): money is never a float.
    credits_granted_micro: Mapped[int] = mapped_column(BigInteger, default=0)
    # Rate limits set by the operator (auth/limits.py: requests and tokens per minute, requests at
    # once); None: unlimited. Every key of the account counts against them.
    limits: Mapped[dict[str, float | None] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    # Its share of a shared model against other accounts (`generation.fairness`) and of the memory budget
    # (`runtime.capacity`), set by the operator: an account of weight 2 is served twice what one of 1 is
    weight: Mapped[float] = mapped_column(Float, default=1.0, server_default="1")
    # The default quota of each role's people (`auth.quotas`: {role: quota}), set by the account's admins;
    # a person's own quota (`Membership.quota`) replaces it. None, or a role not named: no quota
    role_quotas: Mapped[dict[str, dict[str, int | None]] | None] = mapped_column(
        JSON(none_as_null=True), nullable=True
    )
    # The weight of each role inside the account (`auth.weights`: {role: weight}), set by its admins: a
    # key's share against the account's other keys is its own weight times its role's. None, or a role
    # not named: 1
    role_weights: Mapped[dict[str, float] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class User(Base):
    """A person, a member of accounts through `Membership`, with a role in each (`auth.roles`). Two kinds:
    a person who signs in (`subject` set: found again by the OpenID provider's `sub`, never by email;
    made at their first sign-in), and a person without sign-in, made by an account's admin by email
    (`POST /v1/users`: the holder of keys that admin makes; one row per email, shared by the accounts
    that add it). A sign-in never becomes a person an admin made: emails an admin typed are believed by
    nobody but that admin (docs/access.md, "People")."""

    __tablename__ = "users"
    __table_args__ = (
        # a person without sign-in is found by their email, so there is one per email; people who sign
        # in may share an email with them, and with each other (the provider's word, not a key)
        Index(
            "uq_users_email_without_sign_in",
            "email",
            unique=True,
            sqlite_where=text("subject IS NULL"),
            postgresql_where=text("subject IS NULL"),
        ),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    email: Mapped[str] = mapped_column(String(320), index=True)
    name: Mapped[str | None] = mapped_column(String(200), nullable=True)
    # The OpenID provider's `sub` for them (None: a person without sign-in)
    subject: Mapped[str | None] = mapped_column(String(255), nullable=True, unique=True)
    # whether the provider said, at their last sign-in, that `email` is verified (invitations for it are
    # offered to them only then, unless MODELHOST_OIDC_TRUST_EMAIL)
    email_verified: Mapped[bool] = mapped_column(Boolean, default=False, server_default=sa_false())
    # when the provider last confirmed them (a sign-in, or a session renewed with its refresh token): their
    # keys stop `MODELHOST_SIGN_IN_KEY_SECONDS` after it (`auth.authenticator`)
    signed_in_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Membership(Base):
    """A person's role in one account; `disabled_at` set: their keys are refused there (401). A person's
    key works only under the membership it was made in: one made before `created_at` (they were removed
    and added again since) is refused (`auth.authenticator`)."""

    __tablename__ = "memberships"

    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), primary_key=True)
    account_id: Mapped[str] = mapped_column(
        ForeignKey("accounts.id", ondelete="CASCADE"), primary_key=True, index=True
    )
    role: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    disabled_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # `invite` (added by an admin, or an invitation accepted: kept until removed) or `sso` (from the
    # person's groups at sign-in: updated at each sign-in, removed when the group is gone)
    source: Mapped[str] = mapped_column(String(8), default="invite")
    # An admin signed the person out of this account everywhere then (`sign_out_everywhere`): a sign-in
    # session opened before it never acts in this account again (one opened after it does)
    signed_out_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # The person's own quota here (`auth.quotas`: tokens and requests per day and month), set by an admin;
    # None: their role's default (`Account.role_quotas`)
    quota: Mapped[dict[str, int | None] | None] = mapped_column(JSON(none_as_null=True), nullable=True)


class RemovedMembership(Base):
    """An admin removed this person from this account: their groups do not make them a member again
    until the person accepts a new invitation there (or an admin adds a person without sign-in back)."""

    __tablename__ = "removed_memberships"

    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"), primary_key=True)
    removed_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Invitation(Base):
    """An account's invitation of an email to a role, kept apart from people: offered to a person who
    signs in with that (verified) email, a membership only once they accept it (docs/access.md)."""

    __tablename__ = "invitations"
    __table_args__ = (UniqueConstraint("account_id", "email"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"))
    email: Mapped[str] = mapped_column(String(320), index=True)
    role: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)


class SsoHandoff(Base):
    """A browser sign-in's session on its way to the CLI's loopback: its one-time code (hashed)."""

    __tablename__ = "sso_handoffs"

    code_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    session_id: Mapped[str] = mapped_column(String(40))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class SsoSession(Base):
    """A signed-in person's session, held by a cookie whose secret is stored hashed (`id` is public)."""

    __tablename__ = "sso_sessions"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    # the account it acts in (one of the person's); None: the operator's session, or no account yet
    account_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    operator: Mapped[bool] = mapped_column(Boolean, default=False)
    csrf_token: Mapped[str] = mapped_column(String(64))
    id_token: Mapped[str] = mapped_column(Text)  # the provider's, for its logout (`id_token_hint`)
    # the provider's refresh token (sealed, `imports.sealing`): what the session is renewed with; None:
    # the provider gave none, and the session ends when it is due for renewal
    refresh_token: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # when the provider last said who the person is and what their groups are (sign-in or renewal);
    # None: at `created_at`
    renewed_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"), index=True)
    name: Mapped[str | None] = mapped_column(String(200), nullable=True)
    # SHA-256 hex of the secret; the secret itself is never stored.
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True)
    # First characters of the secret, so a person can tell keys apart in listings.
    secret_prefix: Mapped[str] = mapped_column(String(16))
    # None: an account key. A list: a deployment key covering exactly these deployment IDs.
    deployment_ids: Mapped[list[str] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    # The key's own rate limits, set by its account, never above the account's; None: unlimited.
    limits: Mapped[dict[str, float | None] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # After this the key is refused (401 `expired_api_key`); None: it never expires. Rotation sets the
    # old key's to the end of its grace period.
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # The person who owns the key (its actions bounded by their role in the account at each call);
    # None: a service key, owned by no one
    user_id: Mapped[str | None] = mapped_column(String(40), nullable=True, index=True)
    # The key's own role (`auth.roles.Role`); None: `owner`, what every key could do before roles
    role: Mapped[str | None] = mapped_column(String(16), nullable=True)
    # Its requests' prefix-cache salt: a deployment's engine reuses a cached prompt prefix only for a
    # request of the same salt (docs/access.md, "Cache salts"); None: the cache its deployment's
    # unsalted keys share
    cache_salt: Mapped[str | None] = mapped_column(String(256), nullable=True)
    # Its share of what its account is served by a shared model, against the account's other keys
    # (`generation.fairness`), set by the account's admins
    weight: Mapped[float] = mapped_column(Float, default=1.0, server_default="1")
    # A person's key: the `created_at` of the owner's membership it was made under. It works only while
    # that membership lasts: removed and added again, they are a member anew, and the key stays refused
    member_since: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class ModelArtifact(Base):
    __tablename__ = "model_artifacts"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"), index=True)
    display_name: Mapped[str] = mapped_column(String(200))
    pipeline: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), default="created")
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    error_code: Mapped[str | None] = mapped_column(String(64), nullable=True)
    error_message: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Which published file set is served; replaced atomically when a re-upload becomes ready.
    published_version: Mapped[str | None] = mapped_column(String(40), nullable=True)
    # Deployments using this artifact, kept in the same transactions that create and delete them, so
    # "start upload only when not in use" is one guarded single-row UPDATE.
    deployment_count: Mapped[int] = mapped_column(Integer, default=0)
    # What inspection found: `model` (a full model) or `adapter` (a LoRA adapter, PEFT's format), and
    # for an adapter what it is (`artifacts.adapters.AdapterInfo`: type, rank, alpha, target modules,
    # the base it was trained on, its bytes)
    kind: Mapped[str] = mapped_column(String(8), default="model", server_default="model")
    adapter: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    # A quantized model's {method, bits, group_size, scheme} (`artifacts.quantization`; null: full
    # precision), where each engine and device kind here can serve it ({engine: {device: null or why
    # not}}), and a GGUF model's files and header facts (`artifacts.inspection.gguf_facts`)
    quantization: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    serving: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    gguf: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class UploadSession(Base):
    __tablename__ = "upload_sessions"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    artifact_id: Mapped[str] = mapped_column(ForeignKey("model_artifacts.id", ondelete="CASCADE"), index=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"))
    status: Mapped[str] = mapped_column(String(16), default="open")
    # The artifact status to return to when the session is aborted or expires.
    previous_status: Mapped[str] = mapped_column(String(16))
    error_code: Mapped[str | None] = mapped_column(String(64), nullable=True)
    error_message: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)


class UploadFile(Base):
    __tablename__ = "upload_files"

    session_id: Mapped[str] = mapped_column(
        ForeignKey("upload_sessions.id", ondelete="CASCADE"), primary_key=True
    )
    path: Mapped[str] = mapped_column(String(512), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))


class ArtifactImport(Base):
    """An import filling an artifact's upload session from a remote source (`modelhost.imports`). The
    table is the queue, as for batches: the supervisor's runner claims a row with a guarded UPDATE and
    beats `updated_at` while it runs it; a stale claim (its server died) is taken over and resumed."""

    __tablename__ = "artifact_imports"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    artifact_id: Mapped[str] = mapped_column(ForeignKey("model_artifacts.id", ondelete="CASCADE"), index=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"))
    # the server-side upload session it fills (closed with it)
    upload_id: Mapped[str] = mapped_column(String(40))
    # the source as shown (`s3://bucket/prefix`): never a secret
    source: Mapped[str] = mapped_column(Text)
    include: Mapped[list[str] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    exclude: Mapped[list[str] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    # Fernet token (`imports.sealing`) of the source as given and its credentials: what a resumed import
    # needs, encrypted at rest; null once the import ends
    sealed: Mapped[str | None] = mapped_column(Text, nullable=True)
    status: Mapped[str] = mapped_column(String(16), index=True)
    bytes_done: Mapped[int] = mapped_column(BigInteger, default=0)
    bytes_total: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # [{path, size, status: pending | fetching | done}], as last recorded
    files: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    error_code: Mapped[str | None] = mapped_column(String(64), nullable=True)
    error_message: Mapped[str | None] = mapped_column(Text, nullable=True)
    claimed_by: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class Deployment(Base):
    __tablename__ = "deployments"
    __table_args__ = (UniqueConstraint("account_id", "model", name="uq_deployments_account_model"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"))
    model: Mapped[str] = mapped_column(String(200))
    artifact_id: Mapped[str] = mapped_column(ForeignKey("model_artifacts.id"), index=True)
    pipeline: Mapped[str] = mapped_column(String(64))
    readiness: Mapped[str] = mapped_column(String(8), default="cold")
    min_replicas: Mapped[int] = mapped_column(Integer, default=1)
    max_replicas: Mapped[int] = mapped_column(Integer, default=1)
    # The engine asked for (`auto`, `vllm`, `onnxruntime`, `transformers`) and the one in use: vLLM's
    # chosen when the deployment was created or its engine changed, an encoder's runtime when a replica
    # measured it (`runtime.engine_choice`): stored, so every gateway and restart shows the same.
    engine: Mapped[str] = mapped_column(String(16), default="auto", server_default="auto")
    engine_in_use: Mapped[str] = mapped_column(
        String(16), default="transformers", server_default="transformers"
    )
    engine_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    # `int8`: an encoder on ONNX Runtime, quantized, kept only where its quality probe held (the
    # figures, measured by the replica at its first load)
    precision: Mapped[str] = mapped_column(String(8), default="float32", server_default="float32")
    precision_quality: Mapped[str | None] = mapped_column(Text, nullable=True)
    # An adapter deployment: the deployment whose replicas serve it (its base); None for a full model
    base_deployment_id: Mapped[str | None] = mapped_column(
        ForeignKey("deployments.id"), nullable=True, index=True
    )
    # A base the operator shares with every account: they attach adapters to it (never see each other's)
    shared: Mapped[bool] = mapped_column(Boolean, default=False, server_default=sa_false())
    # An adapter deployment of another account whose shared base stopped being shared: detached from it
    # (`base_deployment_id` None, so that the base's owner may delete it), it serves nothing, and this
    # says why to its owner (its `state_reason`, and its requests' 409 `base_not_shared`)
    detached_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Sampling defaults of its requests, before the model's generation_config.json (`GenerationDefaults`
    # fields that are set); None: none
    generation_defaults: Mapped[dict[str, int | float] | None] = mapped_column(
        JSON(none_as_null=True), nullable=True
    )
    # Its generation settings (`generation.deployment_settings`: max_model_len, chat_template,
    # chat_template_kwargs, tool_parser, reasoning_parser), the fields set; None: none. Its replicas load
    # with them
    generation_settings: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    # The model family its files and chat template show (`generation.families.artifact_family`), which
    # names the parsers its replicas use unless its settings name others; None: not a generation deployment
    family: Mapped[str | None] = mapped_column(String(32), nullable=True)
    # Its versions while it serves more than its `artifact_id` or rolls out (`services.rollouts`: artifact,
    # traffic, state, since, reason); None: one version, its artifact. Stored so that every gateway routes
    # by the same split and a restart serves the same versions
    versions: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    # `user` or `key`: a canary's caller stays on one version (hashed, so every gateway agrees); None: drawn
    sticky: Mapped[str | None] = mapped_column(String(8), nullable=True)
    # Its last artifact switches (time, who, from, to, strategy), newest last (`rollouts.HISTORY_LENGTH`)
    history: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    # Its last gated rollout (`services.gates`: the gate, its candidate, state, step and decisions); None:
    # none. The server whose gate runner drives it, and when it last said so (silent: taken over)
    rollout: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    rollout_claimed_by: Mapped[str | None] = mapped_column(String(64), nullable=True)
    rollout_beat_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


Index("ix_deployments_account", Deployment.account_id)


class MeasuredFootprint(Base):
    """The most memory one replica of an artifact was measured at, per engine, precision and device kind
    (`cpu`, `cuda`): the next load of that artifact reserves it (runtime/footprint.py). Kept across
    restarts and shared by the servers of one database."""

    __tablename__ = "footprints"

    artifact_id: Mapped[str] = mapped_column(
        ForeignKey("model_artifacts.id", ondelete="CASCADE"), primary_key=True
    )
    engine: Mapped[str] = mapped_column(String(16), primary_key=True)
    precision: Mapped[str] = mapped_column(String(8), primary_key=True)
    device: Mapped[str] = mapped_column(String(8), primary_key=True)
    host_bytes: Mapped[int] = mapped_column(BigInteger)
    gpu_bytes: Mapped[int] = mapped_column(BigInteger)
    measured_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class GeneratedFile(Base):
    """A generated image (or other output) kept for a while behind an unguessable, expiring link."""

    __tablename__ = "generated_files"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"), index=True)
    blob_key: Mapped[str] = mapped_column(String(200))
    content_type: Mapped[str] = mapped_column(String(100))
    size: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)


class VideoJob(Base):
    """A video generation job. The table is the queue: workers claim rows by a guarded UPDATE."""

    __tablename__ = "video_jobs"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"), index=True)
    deployment_id: Mapped[str] = mapped_column(String(40))
    model: Mapped[str] = mapped_column(String(200))
    prompt: Mapped[str] = mapped_column(Text, default="")
    # The request's generation options (seconds, size, fps, steps, guidance, input reference).
    options: Mapped[dict[str, object]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), default="queued", index=True)
    progress: Mapped[int] = mapped_column(Integer, default=0)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    claimed_by: Mapped[str | None] = mapped_column(String(64), nullable=True)
    error_code: Mapped[str | None] = mapped_column(String(64), nullable=True)
    error_message: Mapped[str | None] = mapped_column(Text, nullable=True)
    content_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # The W3C traceparent of the request that created it: its spans, whenever it runs, link to that.
    traceparent: Mapped[str | None] = mapped_column(Text, nullable=True)


class Agent(Base):
    """An agent: a model of the account (routed by name when a run starts), instructions and tools."""

    __tablename__ = "agents"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    model: Mapped[str] = mapped_column(String(200))
    instructions: Mapped[str] = mapped_column(Text, default="")
    tools: Mapped[list[dict[str, object]] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)


class AgentRun(Base):
    """One run of an agent. Every move is a guarded UPDATE; `deleting` hides it while it is stopped."""

    __tablename__ = "agent_runs"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    agent_id: Mapped[str] = mapped_column(ForeignKey("agents.id", ondelete="CASCADE"), index=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"), index=True)
    deployment_id: Mapped[str] = mapped_column(String(40))
    # The run request: input messages and generation options.
    request: Mapped[dict[str, object]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), default="queued", index=True)
    claimed_by: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # Sequence number of the last event written; the next event takes last_seq + 1 under the row lock.
    last_seq: Mapped[int] = mapped_column(Integer, default=0)
    output: Mapped[dict[str, object] | None] = mapped_column(JSON, nullable=True)
    error_code: Mapped[str | None] = mapped_column(String(64), nullable=True)
    error_message: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # The W3C traceparent of the request that created it: its spans, whenever it runs, link to that.
    traceparent: Mapped[str | None] = mapped_column(Text, nullable=True)


class AgentRunEvent(Base):
    """A stored event of a run, in order of `seq` (1, 2, ...)."""

    __tablename__ = "agent_run_events"

    run_id: Mapped[str] = mapped_column(ForeignKey("agent_runs.id", ondelete="CASCADE"), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    type: Mapped[str] = mapped_column(String(32))
    data: Mapped[dict[str, object]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Meter(Base):
    """Something that costs credits while it exists: a loaded replica (`compute`, owned by the gateway
    that loaded it) or an artifact's stored files (`storage`). Ticks bill `[billed_until, now]` and
    advance `billed_until` in the same transaction as the ledger entry, by a guarded UPDATE."""

    __tablename__ = "meters"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    account_id: Mapped[str] = mapped_column(String(40), index=True)
    deployment_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    model: Mapped[str | None] = mapped_column(String(200), nullable=True)
    artifact_id: Mapped[str] = mapped_column(String(40), index=True)
    # The gateway process that bills a compute meter (None for storage: any gateway may tick it).
    owner: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # Bytes billed per second: replica memory (last measured) or the artifact's size.
    bytes: Mapped[int] = mapped_column(BigInteger)
    started_ms: Mapped[int] = mapped_column(BigInteger)
    billed_until_ms: Mapped[int] = mapped_column(BigInteger)
    ended_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True, index=True)
    # The exact fraction of a micro-credit not billed yet ("n/d"): rounding never loses or makes money.
    carry: Mapped[str] = mapped_column(String(200), default="0")


class LedgerEntry(Base):
    """One metering tick. Append-only; the key `{meter}:{period start}` makes a repeated tick a no-op."""

    __tablename__ = "ledger_entries"
    __table_args__ = (Index("ix_ledger_entries_account_period", "account_id", "period_end_ms"),)

    tick_key: Mapped[str] = mapped_column(String(80), primary_key=True)
    meter_id: Mapped[str] = mapped_column(String(40))
    account_id: Mapped[str] = mapped_column(String(40))
    kind: Mapped[str] = mapped_column(String(16))
    deployment_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    model: Mapped[str | None] = mapped_column(String(200), nullable=True)
    artifact_id: Mapped[str] = mapped_column(String(40))
    bytes: Mapped[int] = mapped_column(BigInteger)
    period_start_ms: Mapped[int] = mapped_column(BigInteger)
    period_end_ms: Mapped[int] = mapped_column(BigInteger)
    # UTC date of the period's end, for the by-day report on any database.
    day: Mapped[str] = mapped_column(String(10))
    amount_micro: Mapped[int] = mapped_column(BigInteger)


class RateLimitUse(Base):
    """What one server counted for one rate-limited subject (a key or an account): the requests and
    tokens it took since it started, and its requests in flight. Each server writes only its own rows
    and reads the others' (auth/shared_limits.py), so several servers on one database share their
    counts."""

    __tablename__ = "rate_limit_use"

    server: Mapped[str] = mapped_column(String(80), primary_key=True)
    subject: Mapped[str] = mapped_column(String(80), primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger)
    tokens: Mapped[int] = mapped_column(BigInteger)
    in_flight: Mapped[int] = mapped_column(Integer)
    updated_ms: Mapped[int] = mapped_column(BigInteger, index=True)


class PersonUsage(Base):
    """What a person used in an account in one UTC day (`period` 2026-11-29) or month (2026-11): their
    requests and tokens over every key they own and their sign-in sessions, added to by every gateway
    process once a second (`auth.quotas`), read to enforce their quota."""

    __tablename__ = "person_usage"

    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    period: Mapped[str] = mapped_column(String(10), primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger)
    tokens: Mapped[int] = mapped_column(BigInteger)
    updated_ms: Mapped[int] = mapped_column(BigInteger, index=True)


class StoredResponse(Base):
    """A response of the Responses API (`store: true`), kept so that later requests chain from it
    (`previous_response_id`) and clients read it back. A background one moves
    queued → in_progress → completed | incomplete | failed | cancelled by guarded UPDATEs."""

    __tablename__ = "responses"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"), index=True)
    deployment_id: Mapped[str] = mapped_column(String(40))
    model: Mapped[str] = mapped_column(String(200))
    # indexed: takeovers look for the active background ones among every stored response
    status: Mapped[str] = mapped_column(String(16), index=True)
    background: Mapped[bool] = mapped_column(default=False)
    previous_response_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    # The response's echoed settings (instructions, tools, tool_choice, text, temperature, metadata...).
    settings: Mapped[dict[str, object]] = mapped_column(JSON)
    # What the model saw before this request's input (the chain so far), and this request's input items.
    context: Mapped[list[object]] = mapped_column(JSON)
    input_items: Mapped[list[object]] = mapped_column(JSON)
    output: Mapped[list[object]] = mapped_column(JSON)
    usage: Mapped[dict[str, object] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    error: Mapped[dict[str, object] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    incomplete_reason: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    # A background response's runner beats here; one silent past the stale window is taken over by
    # another gateway process (`serving.responses.takeover`), or was interrupted.
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # A background response while it runs: the gateway process running it (None: handed back, for the
    # next to take), how often it was taken from a dead one, and what a taker needs to go on with it
    # (`serving.responses.resume.Job`, msgpack: its engine request and how its output is parsed; cleared
    # once it has finished). Deferred: read only by a taker and a stale response's reader.
    owner: Mapped[str | None] = mapped_column(String(64), nullable=True)
    takeovers: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    job: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True, deferred=True)


class ResponseEvent(Base):
    """One stream event of a background response (`sequence_number` from 0, as streamed), written in
    small batches by the task generating it, so that `GET /v1/responses/{id}?stream=true` replays and
    follows it from any gateway process or server. Deleted with its response."""

    __tablename__ = "response_events"

    response_id: Mapped[str] = mapped_column(ForeignKey("responses.id", ondelete="CASCADE"), primary_key=True)
    sequence_number: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    event: Mapped[dict[str, object]] = mapped_column(JSON)
    # The engine's events its runner read since the event before, up to the one that made this one
    # (msgpack): what a taker replays to stand where the written events stand (`serving.responses.resume`)
    engine: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)


class Conversation(Base):
    """A conversation of OpenAI's Conversations API: items that responses created with `conversation`
    read as their context and append their turns to. `next_position` and `item_count` move together in
    one guarded UPDATE per append, so concurrent appends get distinct positions and the item limit
    holds across gateway processes."""

    __tablename__ = "conversations"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"), index=True)
    # The deployments of the key that created it (sorted); None: an account key's, seen by account keys.
    scope: Mapped[list[str] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    metadata_: Mapped[dict[str, str]] = mapped_column("metadata", JSON)
    next_position: Mapped[int] = mapped_column(BigInteger, default=0)
    item_count: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ConversationItem(Base):
    """One item of a conversation (a Responses item: message, function_call, its output, reasoning),
    in the conversation's order (`position`). An item's id is unique within its conversation."""

    __tablename__ = "conversation_items"
    __table_args__ = (UniqueConstraint("conversation_id", "item_id", name="uq_conversation_items_item"),)

    conversation_id: Mapped[str] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"), primary_key=True
    )
    position: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    item_id: Mapped[str] = mapped_column(String(64))
    item: Mapped[dict[str, Any]] = mapped_column(JSON)


class UploadedFile(Base):
    """A file of the Files API (`POST /v1/files`): batch input, or the output and error files a batch
    writes (purpose `batch_output`). The bytes live in the blob store under `blob_key`."""

    __tablename__ = "files"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"), index=True)
    key_id: Mapped[str] = mapped_column(String(40))  # who uploaded it (a batch's output: the batch's key)
    filename: Mapped[str] = mapped_column(String(255))
    purpose: Mapped[str] = mapped_column(String(32), index=True)
    bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    blob_key: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True, index=True)


class Batch(Base):
    """A batch of the Batch API. The table is the queue, as for video jobs: a runner claims a row with a
    guarded UPDATE and beats `updated_at` while it runs it; a stale claim is taken over."""

    __tablename__ = "batches"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"), index=True)
    key_id: Mapped[str] = mapped_column(String(40))  # the creator's key: every line runs as it
    endpoint: Mapped[str] = mapped_column(String(64))
    input_file_id: Mapped[str] = mapped_column(String(40))
    input_key: Mapped[str] = mapped_column(String(200))  # the input's own copy (the file may be deleted)
    completion_window: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16), index=True)
    model: Mapped[str | None] = mapped_column(String(200), nullable=True)
    batch_metadata: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSON, nullable=True)
    output_expires_seconds: Mapped[int | None] = mapped_column(Integer, nullable=True)
    errors: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, nullable=True)
    total: Mapped[int] = mapped_column(Integer, default=0)
    completed: Mapped[int] = mapped_column(Integer, default=0)
    failed: Mapped[int] = mapped_column(Integer, default=0)
    input_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    output_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    # The answers recorded so far (against MODELHOST_BATCH_MAX_OUTPUT_BYTES), and what the batch holds
    # outside the Files API (its input copy and those answers), billed as storage while it holds it.
    output_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    stored_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    output_file_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    error_file_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    claimed_by: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    in_progress_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    finalizing_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    failed_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    expired_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    cancelling_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    cancelled_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # The W3C traceparent of the request that created it: each line's span links to that.
    traceparent: Mapped[str | None] = mapped_column(Text, nullable=True)


class BatchLine(Base):
    """The answer to one line of a batch, recorded once: the primary key refuses a second, so a line
    run again after a crash cannot appear twice in the output."""

    __tablename__ = "batch_lines"

    batch_id: Mapped[str] = mapped_column(ForeignKey("batches.id", ondelete="CASCADE"), primary_key=True)
    line: Mapped[int] = mapped_column(Integer, primary_key=True)  # 1-based, as in the input file
    ok: Mapped[bool] = mapped_column(Boolean)  # a 2xx answer: the output file; else the error file
    record: Mapped[str] = mapped_column(Text)  # the output or error file's line, as JSON


class Eval(Base):
    """An evaluation of OpenAI's Evals API (docs/evals.md): what its items look like and how a sample of
    a model is graded; its runs run it against a deployment."""

    __tablename__ = "evals"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"), index=True)
    key_id: Mapped[str] = mapped_column(String(40))  # its creator's key (a deployment key sees its own)
    name: Mapped[str | None] = mapped_column(String(256), nullable=True)
    data_source_config: Mapped[dict[str, Any]] = mapped_column(JSON)
    testing_criteria: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    eval_metadata: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSON, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)


class EvalRun(Base):
    """One run of an eval against a deployment. The table is the queue, as for batches: a runner claims
    a row with a guarded UPDATE and beats `updated_at` while it runs it; a stale claim is taken over."""

    __tablename__ = "eval_runs"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    eval_id: Mapped[str] = mapped_column(ForeignKey("evals.id", ondelete="CASCADE"), index=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"), index=True)
    key_id: Mapped[str] = mapped_column(String(40))  # every generation and grader call runs as this key
    name: Mapped[str | None] = mapped_column(String(256), nullable=True)
    status: Mapped[str] = mapped_column(String(16), index=True)
    model: Mapped[str | None] = mapped_column(String(200), nullable=True)
    data_source: Mapped[dict[str, Any]] = mapped_column(JSON)  # as given, its file's items read in
    items: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    run_metadata: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSON, nullable=True)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    passed: Mapped[int] = mapped_column(Integer, default=0)
    failed: Mapped[int] = mapped_column(Integer, default=0)
    errored: Mapped[int] = mapped_column(Integer, default=0)
    per_criteria: Mapped[list[dict[str, Any]]] = mapped_column(JSON)  # [{testing_criteria, passed, failed}]
    usage: Mapped[dict[str, Any]] = mapped_column(JSON)  # model → its calls' token counts
    # Its copy of its items and its recorded output items (as JSON), billed as storage until deleted
    stored_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    claimed_by: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class EvalRunItem(Base):
    """The result of one item of a run, recorded once: (run, item) is unique, so an item run again after
    a crash cannot be counted twice."""

    __tablename__ = "eval_run_items"
    __table_args__ = (UniqueConstraint("run_id", "item_index"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("eval_runs.id", ondelete="CASCADE"), index=True)
    item_index: Mapped[int] = mapped_column(Integer)  # 0-based, in the data source's order
    status: Mapped[str] = mapped_column(String(16))  # pass, fail, error
    item: Mapped[dict[str, Any]] = mapped_column(JSON)
    results: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    sample: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)


class AuditRow(Base):
    """One change to accounts, keys, deployments, artifacts, shares, limits, credits or files: who (the
    key's kind and ID, the client's address, the request's ID), what (action, target, each changed field
    before and after; never a secret) and when. Append-only, chained by hash (`modelhost.audit`)."""

    __tablename__ = "audit_log"
    __table_args__ = (Index("ix_audit_log_account_created", "account_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    # The row's place in the chain: 1, 2, ... without gaps (the head's counter, under its lock)
    seq: Mapped[int] = mapped_column(BigInteger, unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    actor_kind: Mapped[str] = mapped_column(String(16))  # admin, account, deployment, system
    actor_key_id: Mapped[str | None] = mapped_column(String(40), nullable=True, index=True)
    actor_account_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    # The person behind the key (None: a service key, the admin key, the server)
    actor_user_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    actor_email: Mapped[str | None] = mapped_column(String(320), nullable=True)
    actor_subject: Mapped[str | None] = mapped_column(String(255), nullable=True)
    client_address: Mapped[str | None] = mapped_column(String(64), nullable=True)
    request_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    action: Mapped[str] = mapped_column(String(64))
    target_type: Mapped[str] = mapped_column(String(32))
    target_id: Mapped[str] = mapped_column(String(64))
    # The account the target belongs to: whose account key may read the row (None: the server's own)
    account_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    changes: Mapped[dict[str, Any]] = mapped_column(JSON)
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64))


class AuditHead(Base):
    """The audit chain's one head row (id 1): the last row's seq and hash, updated in the transaction
    that appends (its lock serializes appends), and the last pruned row's, where the chain now starts."""

    __tablename__ = "audit_head"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger)
    hash: Mapped[str] = mapped_column(String(64))
    pruned_seq: Mapped[int] = mapped_column(BigInteger)
    pruned_hash: Mapped[str] = mapped_column(String(64))


class McpServerEntry(Base):
    """One entry of an account's allow-list of MCP server URLs (`modelhost.mcp.allowlist`): hosted MCP
    tools in the Responses and Messages APIs reach only servers its entries match. None by default."""

    __tablename__ = "mcp_servers"

    account_id: Mapped[str] = mapped_column(
        String(40), ForeignKey("accounts.id", ondelete="CASCADE"), primary_key=True
    )
    url: Mapped[str] = mapped_column(String(2048), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class FineTuningJob(Base):
    """A fine-tuning job (OpenAI's `/v1/fine_tuning/jobs`, docs/fine-tuning.md). The table is the queue,
    as for video jobs: a runner claims a row with a guarded UPDATE and beats `updated_at` while its
    trainer runs; a stale claim is taken over and resumed from the job's last checkpoint."""

    __tablename__ = "fine_tuning_jobs"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"), index=True)
    key_id: Mapped[str] = mapped_column(String(40))
    base_deployment_id: Mapped[str] = mapped_column(String(40))
    model: Mapped[str] = mapped_column(String(200))  # the base as the request named it
    training_file: Mapped[str] = mapped_column(String(40))
    validation_file: Mapped[str | None] = mapped_column(String(40), nullable=True)
    # the dataset's copies (blob keys): the files may be deleted while the job waits or runs
    training_key: Mapped[str] = mapped_column(String(200))
    validation_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    hyperparameters: Mapped[dict[str, Any]] = mapped_column(JSON)  # resolved: no "auto" left
    suffix: Mapped[str | None] = mapped_column(String(64), nullable=True)
    seed: Mapped[int] = mapped_column(Integer)
    job_metadata: Mapped[dict[str, str] | None] = mapped_column("metadata", JSON, nullable=True)
    deploy: Mapped[str | None] = mapped_column(String(200), nullable=True)  # the model name to deploy as
    status: Mapped[str] = mapped_column(String(24), default="queued", index=True)
    waiting_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    step: Mapped[int] = mapped_column(Integer, default=0)  # steps behind the last checkpoint
    total_steps: Mapped[int] = mapped_column(Integer, default=0)
    trained_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    claimed_by: Mapped[str | None] = mapped_column(String(64), nullable=True)
    error_code: Mapped[str | None] = mapped_column(String(64), nullable=True)
    error_message: Mapped[str | None] = mapped_column(Text, nullable=True)
    error_param: Mapped[str | None] = mapped_column(String(64), nullable=True)
    fine_tuned_model: Mapped[str | None] = mapped_column(String(300), nullable=True)
    artifact_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    deployment_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    compute_ms: Mapped[int] = mapped_column(BigInteger, default=0)  # billed trainer time
    # The checkpoints' files it keeps in the blob store, billed as storage until they are deleted (when
    # the job has ended: `FineTuningRunner`'s sweep)
    stored_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class FineTuningEvent(Base):
    """An event of a fine-tuning job: a message, or a step's metrics (`type: "metrics"`)."""

    __tablename__ = "fine_tuning_events"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("fine_tuning_jobs.id", ondelete="CASCADE"), index=True)
    level: Mapped[str] = mapped_column(String(8), default="info")
    message: Mapped[str] = mapped_column(Text)
    type: Mapped[str] = mapped_column(String(16), default="message")
    data: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)


class FineTuningCheckpoint(Base):
    """A checkpoint a job kept: the adapter's weights at a step (safetensors, under `blob_key`), the
    step's metrics. The last one is where a job interrupted by a restart resumes."""

    __tablename__ = "fine_tuning_checkpoints"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("fine_tuning_jobs.id", ondelete="CASCADE"), index=True)
    step: Mapped[int] = mapped_column(Integer)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)
    blob_key: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)


class VersionFigures(Base):
    """A server's live counts of a gated rollout's candidate (its requests, 5xx answers and time-to-first-
    token buckets, as that server's processes counted them), written by every server's gate runner while
    the gate decides, so that the server driving it judges a step on every server's requests, not only its
    own (docs/deploy.md, "Gated rollouts"). Deleted when the gate ends."""

    __tablename__ = "version_figures"

    deployment_id: Mapped[str] = mapped_column(
        ForeignKey("deployments.id", ondelete="CASCADE"), primary_key=True
    )
    artifact_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    server: Mapped[str] = mapped_column(String(64), primary_key=True)
    figures: Mapped[dict[str, Any]] = mapped_column(JSON)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
