"""Builds every service of one gateway process from its settings, in dependency order."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from modelhost.agents.runner import AgentRunner
from modelhost.agents.store import AgentStore
from modelhost.artifacts.blobstore import BlobStore, LocalBlobStore
from modelhost.artifacts.service import ArtifactService
from modelhost.auth.authenticator import Authenticator
from modelhost.auth.principal import Principal
from modelhost.cache import TTLCache
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

    @classmethod
    def build(cls, settings: Settings) -> Services:
        database = Database(settings.database_url)
        if settings.apply_migrations_on_start:
            migrate.upgrade(database)
        cache: TTLCache[Principal] = TTLCache(settings.key_cache_seconds, settings.key_cache_entries)
        authenticator = Authenticator(database, settings.admin_key_value, cache)
        keys = KeyService(database, authenticator)
        blobs = LocalBlobStore(settings.data_dir / "blobs")
        artifacts = ArtifactService(database, blobs, settings)

        def artifact_dir(artifact: ModelArtifact) -> Path | None:
            prefix = artifacts.files_dir(artifact)
            return blobs.local_dir(prefix) if prefix else None

        refs_cache: TTLCache[list[DeploymentRef]] = TTLCache(
            settings.key_cache_seconds, settings.key_cache_entries
        )
        deployments = DeploymentService(database, artifact_dir, refs_cache)
        runtime = ReplicaManager(settings, deployments.runtime_spec, deployments.hot_specs)
        videos = VideoJobs(database, blobs, settings.video_retention_seconds)
        agents = AgentStore(database)
        return cls(
            settings=settings,
            database=database,
            authenticator=authenticator,
            keys=keys,
            accounts=AccountService(database, keys),
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
        )

    def close(self) -> None:
        self.database.dispose()
