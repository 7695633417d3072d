"""Builds every service of one gateway process from its settings, in dependency order.

The supervisor (`build`) owns the runtime, the meters and the runners; the server's other gateway
processes (`build` with the supervisor's stand-ins, from `modelhost.server.remote`) share everything
else, reach the replicas directly and ask the supervisor for the rest.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sqlalchemy.orm import Session

from modelhost.agents.runner import AgentRunner, Runs
from modelhost.agents.store import AgentStore
from modelhost.artifacts.blobstore import BlobStore
from modelhost.artifacts.s3 import S3BlobStore, blob_store_of
from modelhost.artifacts.service import ArtifactService
from modelhost.audit import AuditLog
from modelhost.auth.anonymous import AnonymousThrottle
from modelhost.auth.authenticator import Authenticator
from modelhost.auth.failures import FailedKeys
from modelhost.auth.limits import RateLimiter
from modelhost.auth.oidc import OidcClient, OidcConfig
from modelhost.auth.principal import Principal
from modelhost.auth.quotas import PersonQuotas
from modelhost.auth.shared_limits import SharedLimits
from modelhost.batches.files import Files
from modelhost.batches.input import shown
from modelhost.batches.runner import BatchRunner, LineCall
from modelhost.batches.store import Batches
from modelhost.billing.ledger import Ledger
from modelhost.billing.meter import ComputeMeter, count
from modelhost.billing.rates import Rates
from modelhost.billing.service import Billing
from modelhost.cache import TTLCache
from modelhost.clock import Clock, SystemClock
from modelhost.config import Settings
from modelhost.errors import ModelhostError
from modelhost.evals.runner import EvalRunner
from modelhost.evals.service import EvalService
from modelhost.evals.store import EvalStore
from modelhost.fine_tuning.runner import FineTuningRunner
from modelhost.fine_tuning.service import FineTuning
from modelhost.fine_tuning.store import FineTuningJobs
from modelhost.frontend import Generation
from modelhost.generation.compile_sandbox import GrammarChecker
from modelhost.imports.runner import ImportRunner
from modelhost.imports.sealing import Sealer
from modelhost.imports.service import Imports
from modelhost.jobs.runner import VideoCancel, VideoRunner
from modelhost.jobs.store import VideoJobs
from modelhost.mcp.allowlist import McpAllowList
from modelhost.mcp.tools import McpTools
from modelhost.media.sources import MediaPolicy
from modelhost.outbound import parse_networks
from modelhost.routing import DeploymentRef, resolve_deployment
from modelhost.runtime.engine_choice import device_kind
from modelhost.runtime.gateway.adapters import AdapterRouting
from modelhost.runtime.gateway.interface import Runtime
from modelhost.runtime.supervisor.manager import ReplicaManager
from modelhost.services.accounts import AccountService
from modelhost.services.deployments import DeploymentService
from modelhost.services.files import FileService, FileStore, file_secret
from modelhost.services.gate_runner import GateRunner
from modelhost.services.gated import RolloutGates
from modelhost.services.keys import KeyService
from modelhost.services.sessions import SessionRules, SessionService
from modelhost.services.users import UserService
from modelhost.serving.realtime.seats import Seats
from modelhost.serving.responses.conversations import ConversationStore
from modelhost.serving.responses.service import Responses
from modelhost.serving.responses.store import ResponseStore
from modelhost.store import migrate
from modelhost.store.db import Database
from modelhost.store.models import ModelArtifact
from modelhost.store.types import new_id

log = logging.getLogger("modelhost")
# the runners that claim work queued in the database
Runner = Literal["batches", "imports", "videos", "evals", "fine_tuning"]


@dataclass
class Services:
    settings: Settings
    database: Database
    authenticator: Authenticator
    keys: KeyService
    users: UserService
    sessions: SessionService
    accounts: AccountService
    deployments: DeploymentService
    blobs: BlobStore
    artifacts: ArtifactService
    runtime: Runtime
    media: MediaPolicy  # parsed once: a bad MODELHOST_MEDIA_ALLOW_NETWORKS stops the start
    # The one generation pipeline of every front-end (chat, completions, Messages, Responses, agents)
    generation: Generation
    files: FileService
    file_store: FileStore  # what `/v1/files/{id}/content` serves: `uploads` and `files` by ID
    videos: VideoJobs
    video_runner: VideoCancel
    agents: AgentStore
    agent_runner: Runs
    billing: Billing
    responses: Responses
    mcp: McpTools  # hosted MCP tools: the accounts' allow-lists, the vetted client, each call audited
    uploads: Files  # the Files API's files (`files` is the generated ones behind signed links)
    batches: Batches
    evals: EvalService  # OpenAI's Evals API: evals, runs (graded by the supervisor's eval runner)
    fine_tuning: FineTuning  # fine-tuning jobs (run by the supervisor's runner)
    imports: Imports  # imports filling artifacts from S3, HTTPS, a Hub (run by the supervisor's runner)
    audit: AuditLog
    # Quotas per person (auth/quotas.py): what each person used this day and month, counted here and
    # added to the database once a second
    quotas: PersonQuotas
    # Tenants' grammars and schemas checked, then compiled in child processes started on first use
    grammars: GrammarChecker
    # Rate limits (auth/limits.py): counted in a table every gateway process of the server shares
    limits: RateLimiter = field(default_factory=RateLimiter)
    # Wrong keys per client address (auth/failures.py): off (0) unless `build` reads the setting
    failed_keys: FailedKeys = field(default_factory=lambda: FailedKeys(0))
    # Requests without a key per client address (auth/anonymous.py): off (0) unless `build` reads the settings
    anonymous: AnonymousThrottle = field(default_factory=lambda: AnonymousThrottle(0, 1))
    # Realtime sessions open per key in this process (`MODELHOST_REALTIME_MAX_SESSIONS_PER_KEY`)
    realtime: Seats = field(default_factory=Seats)
    # The supervisor's own runtime and runners; None in the server's other gateway processes.
    supervisor: Supervision | None = None
    # Caches whose entries every process must forget together (by name: keys, deployments, balances).
    caches: dict[str, TTLCache[Any]] = field(default_factory=dict)
    # Work was queued for a runner (a batch, an import): it claims it now, not at its next poll. The
    # runner itself where it runs in this process; a gateway process tells the supervisor
    # (`modelhost.server`, which sets this).
    wake: Callable[[Runner], None] = field(default=lambda _runner: None)

    @classmethod
    def build(
        cls,
        settings: Settings,
        clock: Clock | None = None,
        *,
        stand_ins: tuple[Runtime, VideoCancel, Runs] | None = None,
        limits: RateLimiter | None = None,
    ) -> Services:
        """The supervisor's services, or (with `stand_ins` for its runtime and runners) another gateway
        process's. `clock` is for tests that move time (billing, idle unloading); `limits`, the rate
        limiter on the table a server's gateway processes share (`modelhost.server`; else a table of
        this process's own)."""
        clock = clock or SystemClock()
        database = Database(settings.database_url)
        if stand_ins is None:
            database.wait_until_reachable(settings.database_wait_seconds)
        if settings.apply_migrations_on_start and stand_ins is None:
            migrate.upgrade(database)
        cache: TTLCache[Principal] = TTLCache(settings.key_cache_seconds, settings.key_cache_entries)
        authenticator = Authenticator(
            database, settings.admin_key_value, cache, clock, sign_in_key_seconds=settings.sign_in_key_seconds
        )
        keys = KeyService(database, authenticator, clock)
        users = UserService(database, authenticator, trust_email=settings.oidc_trust_email)
        secret = settings.file_url_secret.get_secret_value() if settings.file_url_secret else None
        signing_secret = file_secret(settings.data_dir, secret)
        networks = parse_networks(settings.media_allow_networks)
        mcp_tools = McpTools(McpAllowList(database), networks, database, signing_secret)
        sealer = Sealer.from_settings(settings)
        sessions = SessionService(
            database,
            authenticator,
            oidc_client_of(settings),
            sealer,
            users,
            SessionRules(
                idle_seconds=settings.session_idle_seconds,
                max_seconds=settings.session_max_seconds,
                renew_seconds=settings.session_renew_seconds,
                group_prefix=settings.oidc_group_prefix,
                operator_group=settings.oidc_operator_group,
            ),
        )
        blobs = blob_store_of(settings)
        if stand_ins is None and isinstance(blobs, S3BlobStore):
            blobs.wait_for_bucket(settings.database_wait_seconds, settings.s3_create_bucket)
        ledger = Ledger(database, rates_of(settings))

        def storage_changed(session: Session, artifact_id: str) -> None:
            count(ledger.sync_storage_in(session, artifact_id, clock.now_ms()))

        artifacts = ArtifactService(
            database, blobs, settings, storage_changed, devices=device_kinds(settings)
        )

        def artifact_dir(artifact: ModelArtifact) -> Path | None:
            prefix = artifacts.files_dir(artifact)
            return blobs.local_dir(prefix) if prefix else None

        refs_cache: TTLCache[list[DeploymentRef]] = TTLCache(
            settings.key_cache_seconds, settings.key_cache_entries
        )
        deployments = DeploymentService(database, artifact_dir, refs_cache)
        balance_cache: TTLCache[int] = TTLCache(
            settings.billing_balance_cache_seconds, settings.key_cache_entries
        )
        billing = Billing(
            ledger,
            ComputeMeter(ledger, clock, owner=new_id("gw")),
            clock,
            enforce=settings.billing_enforce,
            tick_seconds=settings.billing_tick_seconds,
            balance_cache=balance_cache,
        )
        videos = VideoJobs(database, blobs, settings.video_retention_seconds)
        uploads = Files(database, blobs, settings, storage_changed)
        batches = Batches(database, blobs, uploads, settings, storage_changed)
        fine_tuning = FineTuning(
            database,
            blobs,
            uploads,
            deployments,
            FineTuningJobs(database, settings.fine_tuning_max_active_per_account, storage_changed),
            settings.fine_tuning_max_file_bytes,
        )
        files = FileService(database, blobs, signing_secret, settings.generated_file_ttl_seconds)

        async def check_model(principal: Principal, endpoint: str, model: str) -> str | None:
            """Why a batch line's model cannot serve the batch's endpoint for its key (None: it can)."""
            assert principal.account_id is not None
            refs = await asyncio.to_thread(deployments.refs, principal.account_id)
            try:
                resolve_deployment(principal, endpoint, model, refs)
            except ModelhostError as exc:
                if exc.code == "model_not_found":
                    # a line's model, echoed in the batch's errors: no more of it than `shown` quotes
                    return f"The model {shown(model)} does not exist or you do not have access to it."
                return exc.message
            return None

        async def check_version(principal: Principal, model: str, artifact_id: str) -> str | None:
            """Why an eval run cannot run on that version of the deployment (None: it can)."""
            assert principal.account_id is not None
            refs = await asyncio.to_thread(deployments.refs, principal.account_id)
            return resolve_deployment(principal, "/v1/chat/completions", model, refs).version_refused(
                artifact_id
            )

        agents = AgentStore(database)
        eval_store = EvalStore(database, storage_changed)
        grammars = GrammarChecker.from_settings(settings)
        evals = EvalService(eval_store, uploads, check_model, check_version, grammars, grammars.bounds)
        media = MediaPolicy.from_settings(settings)  # parsed once: a bad allow-list stops the start
        imports = Imports(database, artifacts, Sealer.from_settings(settings), settings)
        limits = limits if limits is not None else RateLimiter()
        quotas = PersonQuotas(database, clock)
        supervision: Supervision | None = None
        runtime: Runtime
        generation: Generation  # the one pipeline of every front-end, over this process's runtime
        video_runner: VideoCancel
        agent_runner: Runs
        if stand_ins is None:
            manager = ReplicaManager(
                settings,
                deployments.runtime_spec,
                deployments.hot_specs,
                clock=clock,
                meter=billing.meter,
                load_guard=billing.check_can_load,
            )
            manager.engine_fell_back = deployments.fall_back
            manager.engine_measured = deployments.engine_measured
            manager.footprint_measured = deployments.remember_footprint
            manager.version_changed = deployments.version_changed  # a rollout moves on
            manager.rolling = deployments.rolling
            adapted = AdapterRouting(manager, deployments.adapter_target)
            generation = Generation(adapted, grammars, media)
            eval_runner = EvalRunner(eval_store, settings, authenticator.of_key)
            gate_store = RolloutGates(database, refs_cache)
            gate_runner = GateRunner(
                gate_store, evals, settings, authenticator.of_key, adapted.apply, eval_runner.wake
            )
            supervision = Supervision(
                manager,
                adapted,
                VideoRunner(videos, manager, settings),
                AgentRunner(agents, generation, settings, limits, quotas),
                SharedLimits(database, limits, settings.limits_sync_seconds),
                BatchRunner(batches, settings, authenticator.of_key, check_model),
                ImportRunner(imports, artifacts, settings),
                eval_runner,
                gate_runner,
                FineTuningRunner(
                    fine_tuning.jobs,
                    artifacts,
                    blobs,
                    deployments,
                    manager.placement,
                    billing,
                    settings,
                ),
            )
            runtime, video_runner, agent_runner = supervision.adapted, supervision.videos, supervision.agents
        else:
            runtime, video_runner, agent_runner = stand_ins
            runtime = AdapterRouting(runtime, deployments.adapter_target)
            generation = Generation(runtime, grammars, media)
        return cls(
            settings=settings,
            database=database,
            authenticator=authenticator,
            failed_keys=FailedKeys(settings.auth_failures_per_minute),
            anonymous=AnonymousThrottle(settings.anonymous_requests_per_minute, settings.anonymous_burst),
            keys=keys,
            users=users,
            sessions=sessions,
            accounts=AccountService(database, keys, ledger, settings.billing_initial_credits),
            deployments=deployments,
            blobs=blobs,
            artifacts=artifacts,
            runtime=runtime,
            media=media,
            generation=generation,
            files=files,
            file_store=FileStore(files, uploads),
            videos=videos,
            video_runner=video_runner,
            agents=agents,
            agent_runner=agent_runner,
            billing=billing,
            responses=Responses(
                ResponseStore(database, settings.response_stale_seconds),
                ConversationStore(
                    database, settings.conversation_max_items, settings.conversation_max_item_bytes
                ),
                generation,
                settings.response_stale_seconds,
                mcp_tools,
            ),
            mcp=mcp_tools,
            uploads=uploads,
            batches=batches,
            evals=evals,
            fine_tuning=fine_tuning,
            imports=imports,
            audit=AuditLog(database, settings.audit_retention_days),
            quotas=quotas,
            grammars=grammars,
            limits=limits,
            supervisor=supervision,
            caches={"keys": cache, "deployments": refs_cache, "balances": balance_cache},
            wake=supervision.wake if supervision is not None else lambda _runner: None,
        )

    @property
    def manager(self) -> ReplicaManager:
        """The supervisor's replica manager (what starts, stops and meters replicas), beneath `runtime`;
        the supervisor alone has one."""
        assert self.supervisor is not None, "only the supervisor manages replicas"
        return self.supervisor.runtime

    def close(self) -> None:
        self.grammars.close()
        self.database.dispose()


@dataclass
class Supervision:
    """What the supervisor alone runs: the replicas (and their readiness, idle reaper and meters), video
    jobs, agent runs, batches, imports, and sharing the rate-limit counts with other servers."""

    runtime: ReplicaManager
    adapted: AdapterRouting  # the runtime as callers see it: adapter deployments run on their bases
    videos: VideoRunner
    agents: AgentRunner
    shared_limits: SharedLimits
    batches: BatchRunner
    imports: ImportRunner
    evals: EvalRunner
    gates: GateRunner  # gated rollouts (`services.gate_runner`)
    fine_tuning: FineTuningRunner

    def wake(self, runner: Runner) -> None:
        runners: dict[str, VideoRunner | BatchRunner | ImportRunner | EvalRunner | FineTuningRunner] = {
            "videos": self.videos, "batches": self.batches, "imports": self.imports, "evals": self.evals,
            "fine_tuning": self.fine_tuning,
        }  # fmt: skip
        runners[runner].wake()

    @asynccontextmanager
    async def duties(self, services: Services, line_call: LineCall) -> AsyncIterator[None]:
        """The supervisor's duties while the server runs: housekeeping, metering, hot loads and the idle
        reaper, video jobs, agent runs, batches (each line sent through `line_call`: a gateway's app,
        never the supervisor's own), imports, sharing rate-limit counts and storing people's use
        (`auth.quotas`: its agent runs' tokens; in the embedded server, every request's). At the end
        it bills every replica up to its unload. The batch runner stops first: its lines run in
        gateways, which stop next (`modelhost.server`)."""
        sweeper = asyncio.create_task(_sweep_forever(services))
        billing = services.billing
        await asyncio.to_thread(billing.close_stale)
        metering = asyncio.create_task(billing.run_forever(self.runtime.unload_account))
        sharing = asyncio.create_task(self.shared_limits.run_forever())
        quotas = asyncio.create_task(services.quotas.run_forever())  # its agent runs' tokens
        await self.runtime.start()
        self.videos.start_claiming()
        self.agents.start()
        self.batches.start(line_call)
        self.evals.start(line_call)
        self.gates.start_claiming()
        self.imports.start_claiming()
        self.fine_tuning.start_claiming()
        try:
            yield
        finally:
            sweeper.cancel()
            metering.cancel()
            sharing.cancel()
            quotas.cancel()
            await self.batches.stop()
            await self.gates.stop()
            await self.evals.stop()
            await self.imports.stop()
            await self.fine_tuning.stop()
            await self.videos.stop()
            await self.agents.stop()
            await self.runtime.shutdown()
            await self.shared_limits.stop()
            await services.quotas.stop()


async def _sweep_forever(services: Services) -> None:
    """Background housekeeping: expire upload sessions and generated files, recover stale completions,
    prune audit rows past their retention."""
    await asyncio.to_thread(services.artifacts.recover)
    while True:
        await asyncio.sleep(services.settings.sweep_interval_seconds)
        for sweep in (
            services.artifacts.sweep,
            services.files.sweep,
            services.uploads.sweep,
            services.audit.prune,
        ):
            try:
                await asyncio.to_thread(sweep)
            except Exception:
                log.exception("sweep failed")


def rates_of(settings: Settings) -> Rates:
    return Rates.per_gb(
        settings.billing_compute_credits_per_gb_second,
        settings.billing_storage_credits_per_gb_hour if settings.billing_storage else None,
        settings.billing_min_memory_gb,
    )


def device_kinds(settings: Settings) -> tuple[str, ...]:
    """The device kinds this server's replicas run on, as a quantized artifact's `serving` names them: the
    CPU always, CUDA where the device setting allows and a GPU is visible (`nvidia-smi`, as placement
    reads it: `runtime.engine_choice.device_kind`)."""
    return ("cpu", "cuda") if device_kind(settings) == "cuda" else ("cpu",)


def oidc_client_of(settings: Settings) -> OidcClient | None:
    """The OpenID provider's client where single sign-on is configured (docs/access.md)."""
    if not settings.oidc_issuer or not settings.oidc_client_id or not settings.oidc_client_secret:
        return None
    public = (settings.public_url or "").rstrip("/")
    return OidcClient(
        OidcConfig(
            issuer=settings.oidc_issuer,
            client_id=settings.oidc_client_id,
            client_secret=settings.oidc_client_secret.get_secret_value(),
            redirect_uri=f"{public}/v1/auth/callback",
            scopes=settings.oidc_scopes,
            groups_claim=settings.oidc_groups_claim,
            algorithms=frozenset(settings.oidc_algorithm_list),
        )
    )
