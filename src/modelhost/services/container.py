"""Builds every service of one gateway process from its settings, in dependency order."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session

from modelhost.agents.runner import AgentRunner
from modelhost.agents.store import AgentStore
from modelhost.artifacts.blobstore import BlobStore
from modelhost.artifacts.s3 import blob_store_of
from modelhost.artifacts.service import ArtifactService
from modelhost.auth.authenticator import Authenticator
from modelhost.auth.principal import Principal
from modelhost.billing.ledger import Ledger
from modelhost.billing.meter import ComputeMeter, count
from modelhost.billing.rates import Rates
from modelhost.billing.service import Billing
from modelhost.cache import TTLCache
from modelhost.clock import Clock, SystemClock
from modelhost.config import Settings
from modelhost.jobs.runner import VideoRunner
from modelhost.jobs.videos import VideoJobs
from modelhost.media.sources import MediaPolicy
from modelhost.routing import DeploymentRef
from modelhost.runtime.manager import ReplicaManager
from modelhost.services.accounts import AccountService
from modelhost.services.deployments import DeploymentService
from modelhost.services.files import FileService, file_secret
from modelhost.services.keys import KeyService
from modelhost.store import migrate
from modelhost.store.db import Database
from modelhost.store.models import ModelArtifact
from modelhost.store.types import new_id


@dataclass
class Services:
    settings: Settings
    database: Database
    authenticator: Authenticator
    keys: KeyService
    accounts: AccountService
    deployments: DeploymentService
    blobs: BlobStore
    artifacts: ArtifactService
    runtime: ReplicaManager
    media: MediaPolicy  # parsed once: a bad MODELHOST_MEDIA_ALLOW_NETWORKS stops the start
    files: FileService
    videos: VideoJobs
    video_runner: VideoRunner
    agents: AgentStore
    agent_runner: AgentRunner
    billing: Billing

    @classmethod
    def build(cls, settings: Settings, clock: Clock | None = None) -> Services:
        """`clock` is for tests that move time (billing, idle unloading); the system clock otherwise."""
        clock = clock or SystemClock()
        database = Database(settings.database_url)
        if settings.apply_migrations_on_start:
            migrate.upgrade(database)
        cache: TTLCache[Principal] = TTLCache(settings.key_cache_seconds, settings.key_cache_entries)
        authenticator = Authenticator(database, settings.admin_key_value, cache)
        keys = KeyService(database, authenticator)
        blobs = blob_store_of(settings)
        ledger = Ledger(database, rates_of(settings))

        def storage_changed(session: Session, artifact_id: str) -> None:
            count(ledger.sync_storage_in(session, artifact_id, clock.now_ms()))

        artifacts = ArtifactService(database, blobs, settings, storage_changed)

        def artifact_dir(artifact: ModelArtifact) -> Path | None:
            prefix = artifacts.files_dir(artifact)
            return blobs.local_dir(prefix) if prefix else None

        refs_cache: TTLCache[list[DeploymentRef]] = TTLCache(
            settings.key_cache_seconds, settings.key_cache_entries
        )
        deployments = DeploymentService(database, artifact_dir, refs_cache)
        billing = Billing(
            ledger,
            ComputeMeter(ledger, clock, owner=new_id("gw")),
            clock,
            enforce=settings.billing_enforce,
            tick_seconds=settings.billing_tick_seconds,
            balance_cache=TTLCache(settings.billing_balance_cache_seconds, settings.key_cache_entries),
        )
        runtime = ReplicaManager(
            settings,
            deployments.runtime_spec,
            deployments.hot_specs,
            clock=clock,
            meter=billing.meter,
            load_guard=billing.check_can_load,
        )
        videos = VideoJobs(database, blobs, settings.video_retention_seconds)
        agents = AgentStore(database)
        return cls(
            settings=settings,
            database=database,
            authenticator=authenticator,
            keys=keys,
            accounts=AccountService(database, keys, ledger, settings.billing_initial_credits),
            deployments=deployments,
            blobs=blobs,
            artifacts=artifacts,
            runtime=runtime,
            media=MediaPolicy.from_settings(settings),
            files=FileService(
                database,
                blobs,
                file_secret(
                    settings.data_dir,
                    settings.file_url_secret.get_secret_value() if settings.file_url_secret else None,
                ),
                settings.generated_file_ttl_seconds,
            ),
            videos=videos,
            video_runner=VideoRunner(videos, runtime, settings),
            agents=agents,
            agent_runner=AgentRunner(agents, runtime, settings),
            billing=billing,
        )

    def close(self) -> None:
        self.database.dispose()


def rates_of(settings: Settings) -> Rates:
    return Rates.per_gb(
        settings.billing_compute_credits_per_gb_second,
        settings.billing_storage_credits_per_gb_hour if settings.billing_storage else None,
        settings.billing_min_memory_gb,
    )
