"""Builds every service of one gateway process from its settings, in dependency order."""

from __future__ import annotations

from dataclasses import dataclass, field

from modelhost.artifacts.blobstore import BlobStore, LocalBlobStore
from modelhost.artifacts.service import ArtifactService
from modelhost.auth.authenticator import Authenticator
from modelhost.auth.cache import TTLCache
from modelhost.auth.principal import Principal
from modelhost.config import Settings
from modelhost.services.accounts import AccountService
from modelhost.services.deployments import DeploymentService, NothingLoaded, RuntimeStatus
from modelhost.services.keys import KeyService
from modelhost.store import migrate
from modelhost.store.db import Database


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
    runtime: RuntimeStatus = field(default_factory=NothingLoaded)

    @classmethod
    def build(cls, settings: Settings) -> Services:
        database = Database(settings.database_url)
        if settings.apply_migrations_on_start:
            migrate.upgrade(database)
        cache: TTLCache[Principal] = TTLCache(settings.key_cache_seconds, settings.key_cache_entries)
        authenticator = Authenticator(database, settings.admin_key_value, cache)
        keys = KeyService(database, authenticator)
        blobs = LocalBlobStore(settings.data_dir / "blobs")
        return cls(
            settings=settings,
            database=database,
            authenticator=authenticator,
            keys=keys,
            accounts=AccountService(database, keys),
            deployments=DeploymentService(database),
            blobs=blobs,
            artifacts=ArtifactService(database, blobs, settings),
        )

    def close(self) -> None:
        self.database.dispose()
