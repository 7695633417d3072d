"""Deployments: a customer's model ID bound to a `ready` artifact, with a readiness level and an engine."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from modelhost import audit
from modelhost.artifacts.gguf_check import InvalidGguf, read_gguf_set
from modelhost.cache import SingleFlight, TTLCache
from modelhost.engine_table import AUTO, FALLBACK, sole_reader
from modelhost.engine_table import spec as engine_spec
from modelhost.errors import BaseNotShared, Conflict, InvalidRequest, ModelhostError, NotFound
from modelhost.generation import deployment_settings
from modelhost.generation.deployment_settings import GenerationSettings
from modelhost.generation.families import artifact_family
from modelhost.routing import DeploymentRef, Version, split_key, version_key
from modelhost.runtime import engine_choice
from modelhost.runtime.capacity import Footprint
from modelhost.runtime.engine_choice import EngineChoice, reads_artifact, replica_engine
from modelhost.runtime.footprint import generates, model_context
from modelhost.runtime.spec import AdapterTarget, AttachedAdapter, DeploymentSpec
from modelhost.services import adapters, gated, rollouts
from modelhost.services.gates import Gate
from modelhost.store.db import Database
from modelhost.store.models import Account, Deployment, MeasuredFootprint, ModelArtifact
from modelhost.store.types import new_id


def _not_found() -> NotFound:
    return NotFound("Deployment not found", param="deployment_id", code="deployment_not_found")


def _artifact_not_found() -> NotFound:
    return NotFound("Model artifact not found", param="artifact_id", code="artifact_not_found")


def _artifact_not_ready(artifact: ModelArtifact) -> Conflict:
    return Conflict(
        f"Model artifact is {artifact.status}; only a ready artifact can be deployed.",
        param="artifact_id",
        code="artifact_not_ready",
    )


def _given(settings: Mapping[str, Any] | None) -> list[str]:
    """The generation settings that `settings` sets (a null or an empty object unsets)."""
    return [name for name, value in (settings or {}).items() if value not in (None, {})]


def _follows_base(settings: Mapping[str, Any] | None) -> None:
    """An adapter deployment's settings are its base's: setting one is a 400 naming it."""
    given = _given(settings)
    if given:
        raise InvalidRequest(
            "An adapter deployment is served by its base's replicas: set generation settings on the base.",
            param=given[0],
            code="adapter_follows_base",
        )


def _iso(when: datetime | None) -> str:
    return (when or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def audited(deployment: Deployment) -> dict[str, object]:
    """What an audit row says of a deployment: what its owner or the operator set."""
    return {
        "model": deployment.model,
        "artifact_id": deployment.artifact_id,
        "readiness": deployment.readiness,
        "min_replicas": deployment.min_replicas,
        "max_replicas": deployment.max_replicas,
        "engine": deployment.engine,
        "precision": deployment.precision,
        "base_deployment": deployment.base_deployment_id,
        "shared": bool(deployment.shared),
        "generation_defaults": deployment.generation_defaults,
        "generation_settings": deployment.generation_settings,
    }


def switch(
    session: Session,
    deployment: Deployment,
    traffic: Mapping[str, int],
    now: str,
    *,
    loaded: bool,
    replacing: bool = False,
    keep: tuple[str, ...] = (),
    record: bool = True,
) -> None:
    """In the caller's transaction (the row locked): the deployment's versions as `traffic` asks
    (`rollouts.plan`), its artifacts' uses counted, and a switch of its split recorded in its history and
    the audit log (unless `record`: the gate runner writes its own decision's row)."""
    before = DeploymentService._versions_of(deployment)
    # an adapter deployment's versions are adapters its base's replicas load on their first request:
    # nothing loads beside the others or drains, so they are simply switched
    loaded = loaded and deployment.base_deployment_id is None
    after = rollouts.plan(before, traffic, now, loaded=loaded, replacing=replacing, keep=keep)
    DeploymentService._count_uses(session, rollouts.held(before), rollouts.held(after))
    deployment.versions = rollouts.stored(after)
    deployment.artifact_id = rollouts.primary(after)
    if rollouts.split(before) == rollouts.split(after):
        return
    actor = audit.current_actor()
    entry = {
        "at": now,
        "by": actor.kind if actor.key_id is None else f"{actor.kind} {actor.key_id}",
        "from": rollouts.split(before),
        "to": rollouts.split(after),
        "strategy": "replace" if replacing else "rolling",
    }
    deployment.history = [*(deployment.history or []), entry][-rollouts.HISTORY_LENGTH :]
    if record:
        back = any(v.artifact_id in traffic and v.traffic == 0 for v in before)
        action = "deployment.rolled_back" if back else "deployment.rollout_started"
        changes = {"traffic": {"before": entry["from"], "after": entry["to"]}}
        audit.record(session, action, "deployment", deployment.id, deployment.account_id, changes)


class DeploymentService:
    def __init__(
        self,
        database: Database,
        artifact_dir: Callable[[ModelArtifact], Path | None],
        refs_cache: TTLCache[list[DeploymentRef]],
    ) -> None:
        self._database = database
        self._artifact_dir = artifact_dir
        # Routing reads an account's deployments on every inference request: cache them briefly,
        # and forget them whenever this gateway changes a deployment.
        self._refs_cache = refs_cache
        self.ref_loads: SingleFlight[list[DeploymentRef]] = SingleFlight(lambda: refs_cache.generation)

    def runtime_spec(self, key: str) -> DeploymentSpec | None:
        """The runtime's view of a deployment (None once deleted): of the version `key` names
        (`deployment@artifact`), or of its own artifact (a plain ID, or a version no longer listed)."""
        deployment_id, artifact_id = split_key(key)
        with self._database.transaction() as session:
            deployment = session.get(Deployment, deployment_id)
            if deployment is None:
                return None
            artifact = self._artifact_of(session, deployment)
            if (
                artifact_id is not None
                and artifact_id != artifact.id
                and artifact_id in self._listed(deployment)
            ):
                artifact = session.get(ModelArtifact, artifact_id) or artifact
            pairs = [(deployment, artifact)]
            remembered = self._remembered(session, pairs)
            attached = self._attached(session, pairs)
            weights = self._weights(session, pairs)
        return self._specs(pairs, remembered, attached, weights)[0]

    def hot_specs(self) -> list[DeploymentSpec]:
        with self._database.transaction() as session:
            hot = session.scalars(
                select(Deployment)
                .where(
                    Deployment.readiness == "hot",
                    Deployment.base_deployment_id.is_(None),
                    Deployment.detached_reason.is_(None),
                )
                .order_by(Deployment.id)
            ).all()
            pairs = [
                (d, artifact)
                for d in hot
                for v in self._versions_of(d)
                if v.state == "active" and (artifact := session.get(ModelArtifact, v.artifact_id)) is not None
            ]
            remembered = self._remembered(session, pairs)
            attached = self._attached(session, pairs)
            weights = self._weights(session, pairs)
        return self._specs(pairs, remembered, attached, weights)

    def adapter_target(self, key: str) -> AdapterTarget | None:
        """Where an adapter deployment's requests go (its base, with the files of the version `key` names,
        `deployment@artifact`, or of its own artifact for a plain ID); None for any other deployment, or
        one deleted; 409 `base_not_shared` for one detached from its base. A version's target is fixed
        while it is attached: callers may keep it (routing refuses a detached one's requests first). Its
        name on the base is the version's key, so that two versions of a canary are two adapters there."""
        deployment_id, artifact_id = split_key(key)
        with self._database.transaction() as session:
            deployment = session.get(Deployment, deployment_id)
            if deployment is not None and deployment.detached_reason is not None:
                raise BaseNotShared(deployment.detached_reason, param="model")
            if deployment is None or deployment.base_deployment_id is None:
                return None
            artifact = self._artifact_of(session, deployment)
            if (
                artifact_id is not None
                and artifact_id != artifact.id
                and artifact_id in self._listed(deployment)
            ):
                artifact = session.get(ModelArtifact, artifact_id) or artifact
        adapter_dir = self._artifact_dir(artifact) or Path(f"/missing-artifact-files/{artifact.id}")
        size = int((artifact.adapter or {}).get("bytes", 0))
        name = version_key(deployment_id, artifact.id)
        return AdapterTarget(name, deployment.base_deployment_id, adapter_dir, size)

    @staticmethod
    def _attached(
        session: Session, pairs: list[tuple[Deployment, ModelArtifact]]
    ) -> dict[str, list[AttachedAdapter]]:
        """The adapters attached to each of these deployments, by base: each adapter deployment once,
        with every version it holds (a canary's two adapters are both in the base's replicas: their
        bytes together, the highest rank, which the base's LoRA slots must fit)."""
        ids = [deployment.id for deployment, _ in pairs]
        adapters = session.scalars(
            select(Deployment)
            .where(Deployment.base_deployment_id.in_(ids))
            .order_by(Deployment.created_at, Deployment.id)
        ).all()
        held = {a.id: rollouts.held(DeploymentService._versions_of(a)) for a in adapters}
        wanted = {artifact_id for artifacts in held.values() for artifact_id in artifacts}
        rows = session.execute(
            select(ModelArtifact.id, ModelArtifact.adapter).where(ModelArtifact.id.in_(wanted))
        )
        infos: dict[str, dict[str, Any] | None] = {artifact_id: info for artifact_id, info in rows}
        found: dict[str, list[AttachedAdapter]] = {}
        for adapter in adapters:
            versions = [infos.get(artifact_id) or {} for artifact_id in sorted(held[adapter.id])]
            attached = AttachedAdapter(
                adapter.id,
                adapter.account_id,
                adapter.model,
                adapter.artifact_id,
                sum(int(info.get("bytes", 0)) for info in versions),
                max((int(info.get("rank", 1)) for info in versions), default=1),
            )
            found.setdefault(str(adapter.base_deployment_id), []).append(attached)
        return found

    @staticmethod
    def _weights(session: Session, pairs: list[tuple[Deployment, ModelArtifact]]) -> dict[str, float]:
        """The weights of these deployments' accounts (their shares of the memory budget), by account."""
        ids = {deployment.account_id for deployment, _ in pairs}
        rows = session.execute(select(Account.id, Account.weight).where(Account.id.in_(ids)))
        return {account_id: weight for account_id, weight in rows}

    @staticmethod
    def _remembered(
        session: Session, pairs: list[tuple[Deployment, ModelArtifact]]
    ) -> dict[str, list[MeasuredFootprint]]:
        """The footprints measured for these deployments' artifacts, by artifact."""
        ids = {artifact.id for _, artifact in pairs}
        rows = session.scalars(select(MeasuredFootprint).where(MeasuredFootprint.artifact_id.in_(ids)))
        found: dict[str, list[MeasuredFootprint]] = {}
        for row in rows:
            found.setdefault(row.artifact_id, []).append(row)
        return found

    def remember_footprint(self, spec: DeploymentSpec, device: str, footprint: Footprint) -> None:
        """A replica of the deployment was measured at `footprint` (one replica's) on `device` (`cpu`,
        `cuda`): the next load of its artifact on the same engine and precision reserves that much. Not
        where the deployment sets its own context (`max_model_len`): its KV cache is not the artifact's."""
        if spec.generation.max_model_len:
            return
        artifact_id = spec.artifact_id
        key = {"artifact_id": artifact_id, "engine": spec.engine, "precision": spec.precision}
        key["device"] = device
        for attempt in range(2):  # another server may insert the same row between our read and write
            try:
                with self._database.transaction() as session:
                    row = session.get(MeasuredFootprint, key, with_for_update=True)
                    if row is None:
                        if session.get(ModelArtifact, artifact_id) is None:
                            return  # deleted meanwhile
                        row = MeasuredFootprint(**key)
                        session.add(row)
                    row.host_bytes, row.gpu_bytes = footprint.host, footprint.gpu
                return
            except IntegrityError:
                if attempt:
                    raise

    @staticmethod
    def _artifact_of(session: Session, deployment: Deployment) -> ModelArtifact:
        artifact = session.get(ModelArtifact, deployment.artifact_id)
        assert artifact is not None
        return artifact

    def _settings(
        self,
        artifact: ModelArtifact,
        pipeline: str,
        stored: Mapping[str, Any] | None,
        changes: Mapping[str, Any],
    ) -> dict[str, Any] | None:
        """The deployment's generation settings after `changes` (each field given replaces it; None:
        unset), checked (`deployment_settings.check`: the model's own context is read from its files only
        when a `max_model_len` is given), as stored. Outside any transaction."""
        given = _given(changes)
        if not given and not stored:
            return None  # nothing set, before or after
        if not generates(pipeline):
            raise InvalidRequest(
                f"{given[0]} is a setting of text-generation and image-text-to-text deployments, "
                f"not of {pipeline}.",
                param=given[0],
            )
        settings = GenerationSettings.of({**(stored or {}), **changes})
        context = None
        if changes.get("max_model_len") is not None:
            model_dir = self._artifact_dir(artifact)
            context = model_context(model_dir) if model_dir is not None else None
        deployment_settings.check(settings, context)
        return settings.stored()

    def _family(self, artifact: ModelArtifact, settings: Mapping[str, Any] | None) -> str | None:
        """The family a generation artifact's files show, with the deployment's own chat template where
        it has one (as its replicas will recognise it); None for other tasks or files not at hand."""
        if not generates(artifact.pipeline):
            return None
        model_dir = self._artifact_dir(artifact)
        if model_dir is None:
            return None
        template = (settings or {}).get("chat_template")
        if template is None and engine_choice.is_gguf_artifact(model_dir):  # a GGUF carries its template
            with contextlib.suppress(InvalidGguf):
                template = read_gguf_set(model_dir)[1].chat_template
        return artifact_family(model_dir, template).name

    def _specs(
        self,
        pairs: list[tuple[Deployment, ModelArtifact]],
        remembered: dict[str, list[MeasuredFootprint]],
        attached: dict[str, list[AttachedAdapter]],
        weights: dict[str, float],
    ) -> list[DeploymentSpec]:
        """Outside the transaction: with a remote blob store, finding the model's folder may mean
        downloading it first."""

        def footprints(deployment: Deployment, artifact: ModelArtifact) -> dict[str, Footprint]:
            engine = replica_engines[deployment.id]
            return {
                row.device: Footprint(row.host_bytes, row.gpu_bytes)
                for row in remembered.get(artifact.id, [])
                if row.engine == engine and row.precision == deployment.precision
            }

        replica_engines = {
            deployment.id: replica_engine(deployment.engine, deployment.engine_in_use, deployment.pipeline)
            for deployment, _ in pairs
        }
        own = {d.id: GenerationSettings.of(d.generation_settings) for d, _ in pairs}
        # No published files (never the case for a ready artifact made by an upload): the runtime sees a
        # missing folder and fails the load with that reason.
        folders = {
            artifact.id: self._artifact_dir(artifact) or Path(f"/missing-artifact-files/{artifact.id}")
            for _, artifact in pairs
        }
        return [
            DeploymentSpec(
                id=deployment.id,
                pipeline=deployment.pipeline,
                readiness=deployment.readiness,
                min_replicas=deployment.min_replicas,
                max_replicas=deployment.max_replicas,
                model_dir=folders[artifact.id],
                account_id=deployment.account_id,
                model=deployment.model,
                artifact_id=artifact.id,
                account_weight=weights.get(deployment.account_id, 1.0),
                engine=replica_engines[deployment.id],
                falls_back=engine_choice.falls_back(
                    deployment.engine, deployment.engine_in_use, folders[artifact.id]
                ),
                precision=deployment.precision,
                # a context of its own changes its KV cache: the artifact's measurement is not its own
                remembered={} if own[deployment.id].max_model_len else footprints(deployment, artifact),
                adapters=tuple(attached.get(deployment.id, [])),
                generation=own[deployment.id],
                versions=tuple(self._versions_of(deployment)),
            )
            for deployment, artifact in pairs
        ]

    @staticmethod
    def _versions_of(deployment: Deployment) -> list[Version]:
        """Its versions: full models, or an adapter deployment's adapters (all run on its base's
        replicas)."""
        return rollouts.read(deployment.versions, deployment.artifact_id, _iso(deployment.updated_at))

    def _listed(self, deployment: Deployment) -> set[str]:
        return rollouts.held(self._versions_of(deployment))

    def _choose_engine(self, asked: str, artifact: ModelArtifact) -> EngineChoice:
        """Outside any transaction: the choice may read the artifact's config.json, and finding its folder
        means downloading the model with a remote blob store, so the folder is found only where the choice
        can read it: a GGUF artifact (as inspection recorded it, whichever engine is asked for: only
        llamacpp serves one), or a task vLLM serves (`transformers` asked for is refused for a quantized
        checkpoint)."""
        reads_files = artifact.gguf is not None or reads_artifact(artifact.pipeline)
        model_dir = self._artifact_dir(artifact) if reads_files else None
        return engine_choice.choose(asked, artifact.pipeline, model_dir)

    def create(
        self,
        account_id: str,
        model: str,
        artifact_id: str,
        readiness: str,
        min_replicas: int,
        max_replicas: int,
        engine: str = "auto",
        precision: str = "float32",
        base_deployment: str | None = None,
        generation_defaults: dict[str, int | float] | None = None,
        generation_settings: Mapping[str, Any] | None = None,
    ) -> Deployment:
        """A deployment of a ready artifact; an adapter artifact's is served on `base_deployment`'s
        replicas (`services.adapters` says what the base must be). `generation_defaults`: the sampling
        defaults of its requests (the fields set; empty: none). `generation_settings`: its own context,
        chat template and parsers (`generation.deployment_settings`; the fields set)."""
        with self._database.transaction() as session:
            artifact = session.get(ModelArtifact, artifact_id)
            if artifact is None or artifact.account_id != account_id:
                raise _artifact_not_found()
            if artifact.status != "ready":
                raise _artifact_not_ready(artifact)
            base = base_artifact = None
            if artifact.kind == "adapter":
                if base_deployment is None:
                    raise adapters.base_required(artifact)
                base = adapters.find_base(session, account_id, base_deployment)
                adapters.check_base(base)
                base_artifact = self._artifact_of(session, base)
            elif base_deployment is not None:
                raise adapters.not_an_adapter(artifact)
        if base is not None:
            _follows_base(generation_settings)
        settings = self._settings(artifact, artifact.pipeline, None, generation_settings or {})
        family = self._family(artifact, settings) if base is None else None
        if base is not None and base_artifact is not None:
            adapters.check_fits(self._artifact_dir(artifact), self._artifact_dir(base_artifact), artifact)
            choice = EngineChoice(
                adapters.ADAPTER_ENGINE, f"served on the replicas of its base '{base.model}'"
            )
            readiness, engine = base.readiness, adapters.ADAPTER_ENGINE
        else:
            choice = self._choose_engine(engine, artifact)
            gguf = sole_reader(choice.engine)  # whatever was asked: only llama.cpp reads it
            engine_choice.check_precision(precision, choice.engine if gguf else engine, artifact.pipeline)
        try:
            with self._database.transaction() as session:
                artifact = session.get(ModelArtifact, artifact_id)
                if artifact is None:  # deleted meanwhile
                    raise _artifact_not_found()
                self._count_uses(session, set(), {artifact_id})
                deployment = Deployment(
                    id=new_id("dep"),
                    account_id=account_id,
                    model=model,
                    artifact_id=artifact_id,
                    pipeline=base.pipeline if base is not None else artifact.pipeline,
                    readiness=readiness,
                    min_replicas=min_replicas,
                    max_replicas=max_replicas,
                    engine=engine,
                    engine_in_use=choice.engine,
                    engine_reason=choice.reason,
                    precision=precision,
                    base_deployment_id=base.id if base is not None else None,
                    generation_defaults=generation_defaults or None,
                    generation_settings=settings,
                    family=family,
                )
                session.add(deployment)
                session.flush()
                fields = audit.created(audited(deployment))
                audit.record(session, "deployment.created", "deployment", deployment.id, account_id, fields)
            self._refs_cache.clear()
            return deployment
        except IntegrityError as exc:
            raise Conflict(
                f"Model ID '{model}' is already deployed in this account.", param="model", code="model_exists"
            ) from exc

    def list_deployments(self, account_id: str) -> list[Deployment]:
        with self._database.transaction() as session:
            query = select(Deployment).where(Deployment.account_id == account_id)
            return list(session.scalars(query.order_by(Deployment.created_at, Deployment.id)))

    def refs(self, account_id: str) -> list[DeploymentRef]:
        """The lightweight view routing needs, for every deployment of the account (the last one read
        while the database is unavailable)."""
        found, cached = self._refs_cache.get(account_id)
        if found and cached is not None:
            return cached
        refs = self._refs_cache.fresh_or_stale(account_id, lambda: self._load_refs(account_id))
        assert refs is not None  # `_load_refs` reads a list
        return refs

    def cached_refs(self, account_id: str) -> list[DeploymentRef] | None:
        found, cached = self._refs_cache.get(account_id)
        return cached if found else None

    def _load_refs(self, account_id: str) -> list[DeploymentRef]:
        with self._database.transaction() as session:
            rows = session.execute(
                select(
                    Deployment.id,
                    Deployment.model,
                    Deployment.pipeline,
                    Deployment.detached_reason,
                    Deployment.generation_defaults,
                    Deployment.artifact_id,
                    Deployment.base_deployment_id,
                    Deployment.versions,
                    Deployment.sticky,
                ).where(Deployment.account_id == account_id)
            )
            refs = [
                DeploymentRef(
                    id=r.id,
                    model=r.model,
                    pipeline=r.pipeline,
                    unavailable=r.detached_reason,
                    generation_defaults=r.generation_defaults,
                    # an adapter deployment's versions are adapters, which its base's replicas run
                    versions=tuple(rollouts.read(r.versions, r.artifact_id, "")),
                    sticky=r.sticky,
                )
                for r in rows
            ]
            # one artifact or one version: what the runtime runs it on is known now, not chosen per request
            return [ref.with_version(None) if len(ref.versions) <= 1 else ref for ref in refs]

    def get(self, account_id: str, deployment_id: str) -> Deployment:
        with self._database.transaction() as session:
            deployment = session.get(Deployment, deployment_id)
            if deployment is None or deployment.account_id != account_id:
                raise _not_found()
            return deployment

    def update(
        self,
        account_id: str,
        deployment_id: str,
        readiness: str | None,
        min_replicas: int | None,
        max_replicas: int | None,
        engine: str | None = None,
        generation_defaults: dict[str, int | float] | None = None,
        generation_settings: Mapping[str, Any] | None = None,
    ) -> Deployment:
        """With `engine` (even the same one): the engine is chosen again, so `auto` sees a vLLM installed
        since; the runtime reloads a loaded deployment whose engine in use changed (`runtime.apply`).
        `generation_defaults` given replaces the set (empty: none); its next requests carry it. Each field
        of `generation_settings` given replaces that setting (None: unset); the runtime reloads the
        deployment's replicas with them."""
        choice = settings = family = None
        if engine is not None or generation_settings:
            artifact = self._artifact_of_deployment(account_id, deployment_id)
            if engine is not None:
                choice = self._choose_engine(engine, artifact)
            if generation_settings:
                current = self.get(account_id, deployment_id)
                if current.base_deployment_id is not None:
                    _follows_base(generation_settings)
                stored = current.generation_settings
                settings = self._settings(artifact, current.pipeline, stored, generation_settings)
                if "chat_template" in generation_settings and current.base_deployment_id is None:
                    family = self._family(artifact, settings)
        with self._database.transaction() as session:
            deployment = session.get(Deployment, deployment_id, with_for_update=True)
            if deployment is None or deployment.account_id != account_id:
                raise _not_found()
            if deployment.detached_reason is not None:
                raise BaseNotShared(deployment.detached_reason, param="deployment_id")
            before = audited(deployment)
            new_min = deployment.min_replicas if min_replicas is None else min_replicas
            new_max = deployment.max_replicas if max_replicas is None else max_replicas
            if new_min > new_max:
                raise InvalidRequest("min_replicas must not exceed max_replicas", param="min_replicas")
            if deployment.base_deployment_id is not None and (
                readiness is not None or min_replicas is not None or max_replicas is not None or engine
            ):
                raise InvalidRequest(
                    "An adapter deployment is served by its base's replicas: change the base's readiness, "
                    "replicas or engine instead.",
                    param="base_deployment",
                    code="adapter_follows_base",
                )
            if readiness is not None:
                deployment.readiness = readiness
                for adapter in adapters.attached(session, deployment.id):
                    adapter.readiness = readiness  # an adapter is as ready as its base
            deployment.min_replicas, deployment.max_replicas = new_min, new_max
            if generation_defaults is not None:
                deployment.generation_defaults = generation_defaults or None
            if generation_settings:
                deployment.generation_settings = settings
            if family is not None:
                deployment.family = family
            if engine is not None and choice is not None:
                attached = adapters.attached(session, deployment.id)
                if attached and not engine_spec(choice.engine).serves_adapters:
                    raise adapters.still_attached(deployment, attached, f"would run on {choice.engine}")
                deployment.engine, deployment.engine_in_use = engine, choice.engine
                deployment.engine_reason = choice.reason
            changes = audit.diff(before, audited(deployment))
            audit.record(session, "deployment.updated", "deployment", deployment.id, account_id, changes)
        self._refs_cache.clear()
        return deployment

    def roll(
        self,
        account_id: str,
        deployment_id: str,
        traffic: Mapping[str, int] | None,
        *,
        loaded: bool,
        replacing: bool = False,
        sticky: str | None = None,
        sticky_given: bool = False,
        gate: Gate | None = None,
    ) -> Deployment:
        """Move the deployment to the versions `traffic` asks for (artifact → percent; one artifact at
        100: a rollout, or a rollback to one still listed; several: a canary). Each artifact must be the
        account's, ready and of the deployment's pipeline, and fit the adapters attached to it. `loaded`
        (its replicas run now): a new version loads beside the others (`rollouts.plan`); else the versions
        are simply switched. Its artifacts' `deployment_count` counts every version it holds. With a
        `gate` (`traffic` names the candidate): the candidate loads beside the current version at 0 % and
        the gate runner decides (`services.gates`). A new split ends a gate still running (`canceled`)."""
        with self._database.transaction() as session:
            deployment = session.get(Deployment, deployment_id)
            if deployment is None or deployment.account_id != account_id:
                raise _not_found()
            asked = traffic is not None
            if traffic is None:  # `sticky` alone: the split stays
                traffic = rollouts.split(self._versions_of(deployment))
            wanted = {a: self._rollable(session, account_id, deployment, a) for a in traffic}
            attached = [
                (adapter, artifact)
                for adapter in adapters.attached(session, deployment.id)
                for artifact_id in sorted(self._listed(adapter))
                if (artifact := session.get(ModelArtifact, artifact_id)) is not None
            ]
            base = session.get(Deployment, deployment.base_deployment_id or "")
            base_artifact = None if base is None else self._artifact_of(session, base)
        for artifact in wanted.values():
            self._check_adapters_fit(artifact, attached)
            if base_artifact is not None:  # an adapter deployment's new version fits its base
                try:
                    adapters.check_fits(
                        self._artifact_dir(artifact), self._artifact_dir(base_artifact), artifact
                    )
                except ModelhostError as exc:
                    exc.param = "artifact_id"
                    raise
        now = _iso(None)
        with self._database.transaction() as session:
            deployment = session.get(Deployment, deployment_id, with_for_update=True)
            if deployment is None or deployment.account_id != account_id:
                raise _not_found()
            keep: tuple[str, ...] = ()
            if asked and gated.running(deployment):
                gated.end(session, deployment, now, "canceled", "A new rollout replaced the gated one.")
            if gate is not None:
                candidate = next(iter(traffic))
                current = rollouts.primary(self._versions_of(deployment))
                gated.check_start(candidate, current, loaded)
                traffic, keep = {current: 100, candidate: 0}, (candidate,)
            switch(session, deployment, traffic, now, loaded=loaded, replacing=replacing, keep=keep)
            if gate is not None:
                gated.start(session, deployment, gate, keep[0], now)
            if sticky_given:
                deployment.sticky = sticky
        self._refs_cache.clear()
        return deployment

    def _rollable(
        self, session: Session, account_id: str, deployment: Deployment, artifact_id: str
    ) -> ModelArtifact:
        """An artifact a deployment may roll to: the account's (else 404), ready (409), of the deployment's
        pipeline and kind (400): a full model, or an adapter for an adapter deployment."""
        artifact = session.get(ModelArtifact, artifact_id)
        if artifact is None or artifact.account_id != account_id:
            raise _artifact_not_found()
        if artifact.status != "ready" and artifact.id not in self._listed(deployment):
            raise _artifact_not_ready(artifact)
        adapter = deployment.base_deployment_id is not None
        if (artifact.kind == "adapter") != adapter or artifact.pipeline != deployment.pipeline:
            what = "a LoRA adapter" if artifact.kind == "adapter" else "a full model"
            wanted = "an adapter for its base's" if adapter else "a full model of the same"
            raise InvalidRequest(
                f"Artifact {artifact.id} is {what} of {artifact.pipeline}; deployment '{deployment.model}' "
                f"serves {deployment.pipeline}{' as an adapter' if adapter else ''}: a new version must be "
                f"{wanted} pipeline.",
                param="artifact_id",
                code="pipeline_mismatch",
            )
        return artifact

    def _check_adapters_fit(
        self, artifact: ModelArtifact, attached: list[tuple[Deployment, ModelArtifact]]
    ) -> None:
        """409 `adapter_base_mismatch` when an adapter attached to the deployment does not fit the new
        version (its modules or sizes): it would stop working. Another account's adapter is not named."""
        for adapter, adapter_artifact in attached:
            try:
                adapters.check_fits(
                    self._artifact_dir(adapter_artifact), self._artifact_dir(artifact), adapter_artifact
                )
            except (InvalidRequest, Conflict) as exc:
                named = (
                    f"'{adapter.model}'"
                    if adapter.account_id == artifact.account_id
                    else "of another account"
                )
                raise Conflict(
                    f"The adapter deployment {named} attached to this deployment does not fit artifact "
                    f"{artifact.id}: {exc.message} Delete it, or roll to an artifact it fits.",
                    param="artifact_id",
                    code="adapter_base_mismatch",
                ) from None

    @staticmethod
    def _count_uses(session: Session, before: set[str], after: set[str]) -> None:
        """Each artifact a deployment holds counts one use (guarded: a new one only while ready, so that
        a concurrent re-upload, which needs no use, and this cannot both succeed)."""
        for artifact_id in sorted(after - before):
            claimed = session.execute(
                update(ModelArtifact)
                .where(ModelArtifact.id == artifact_id, ModelArtifact.status == "ready")
                .values(deployment_count=ModelArtifact.deployment_count + 1)
                .execution_options(synchronize_session=False)
            )
            if claimed.rowcount != 1:  # type: ignore[attr-defined]
                artifact = session.get(ModelArtifact, artifact_id)
                assert artifact is not None
                session.refresh(artifact)
                raise _artifact_not_ready(artifact)
        for artifact_id in sorted(before - after):
            session.execute(
                update(ModelArtifact)
                .where(ModelArtifact.id == artifact_id)
                .values(deployment_count=ModelArtifact.deployment_count - 1)
                .execution_options(synchronize_session=False)
            )

    def restore(self, deployment_id: str, before: Deployment) -> None:
        """Put back the versions a refused rollout changed (the runtime found no room for both), as the
        row of its start says, with a row of its own."""
        with self._database.transaction() as session:
            deployment = session.get(Deployment, deployment_id, with_for_update=True)
            if deployment is None:
                return
            refused = rollouts.split(self._versions_of(deployment))
            self._count_uses(session, self._listed(deployment), self._listed(before))
            deployment.versions, deployment.artifact_id = before.versions, before.artifact_id
            deployment.sticky, deployment.history = before.sticky, before.history
            # its start was recorded with it: the refusal that undid it is recorded too
            changes = {"traffic": {"before": refused, "after": rollouts.split(self._versions_of(deployment))}}
            audit.record(
                session, "deployment.rollout_refused", "deployment", deployment.id, before.account_id, changes
            )
        self._refs_cache.clear()

    def version_changed(self, deployment_id: str, artifact_id: str, event: str, reason: str | None) -> None:
        """The runtime says a version of a rollout `loaded` (it takes its traffic; the leaving ones
        drain), `failed` (the others keep serving; it says why) or `drained` (it leaves the table)."""
        now = _iso(None)
        with self._database.transaction() as session:
            deployment = session.get(Deployment, deployment_id, with_for_update=True)
            if deployment is None:
                return
            before = self._versions_of(deployment)
            if event == "loaded":
                after = rollouts.loaded(before, artifact_id, now, gated.kept(deployment))
            elif event == "failed":
                after = rollouts.failed(before, artifact_id, reason or "its load failed", now)
            else:
                after = rollouts.drained(before, artifact_id)
            if after == before:
                return
            self._count_uses(session, rollouts.held(before), rollouts.held(after))
            deployment.versions = rollouts.stored(after)
            if event != "drained":
                action = "deployment.rollout_finished" if event == "loaded" else "deployment.rollout_failed"
                changes: audit.Changes = {"version": {"before": artifact_id, "after": event}}
                if reason:
                    changes["reason"] = {"before": None, "after": reason}
                audit.record(session, action, "deployment", deployment.id, deployment.account_id, changes)
        self._refs_cache.clear()

    def rolling(self) -> list[str]:
        """The deployments in the middle of a rollout (a version loading or draining): after a restart
        the runtime carries on with them."""
        with self._database.transaction() as session:
            rows = session.scalars(select(Deployment).where(Deployment.versions.is_not(None))).all()
            return [
                d.id for d in rows if any(v.state in ("loading", "draining") for v in self._versions_of(d))
            ]

    def share(self, deployment_id: str, shared: bool) -> tuple[Deployment, list[str]]:
        """The operator shares a deployment with every account as a base for their adapters, or stops:
        then the adapter deployments of other accounts are detached from it (`adapters.detach_others`).
        The deployment, and the IDs of the adapter deployments detached."""
        with self._database.transaction() as session:
            deployment = session.get(Deployment, deployment_id, with_for_update=True)
            if deployment is None:
                raise _not_found()
            if shared:
                adapters.check_base(deployment)
            changes: audit.Changes = {"shared": {"before": bool(deployment.shared), "after": shared}}
            deployment.shared = shared
            others = [] if shared else adapters.detach_others(session, deployment)
            detached = [a.id for a in others]
            if detached:  # counted in the base's row, named only in each adapter's owner's own row
                changes["detached_adapters"] = {"before": 0, "after": len(detached)}
            action = "deployment.shared" if shared else "deployment.unshared"
            audit.record(session, action, "deployment", deployment.id, deployment.account_id, changes)
            for adapter in others:
                detached_change = {"detached_reason": {"before": None, "after": adapter.detached_reason}}
                audit.record(
                    session,
                    "deployment.detached",
                    "deployment",
                    adapter.id,
                    adapter.account_id,
                    detached_change,
                )
        if detached:
            self._refs_cache.clear()  # every gateway routes their requests to the 409 at once
        return deployment, detached

    def base_models(self, deployments: list[Deployment]) -> dict[str, str]:
        """The model names of these adapter deployments' bases, by base ID (a shared base's included)."""
        ids = {d.base_deployment_id for d in deployments if d.base_deployment_id is not None}
        if not ids:
            return {}
        with self._database.transaction() as session:
            rows = session.execute(select(Deployment.id, Deployment.model).where(Deployment.id.in_(ids)))
            return {row.id: row.model for row in rows}

    def _artifact_of_deployment(self, account_id: str, deployment_id: str) -> ModelArtifact:
        with self._database.transaction() as session:
            deployment = session.get(Deployment, deployment_id)
            if deployment is None or deployment.account_id != account_id:
                raise _not_found()
            return self._artifact_of(session, deployment)

    def fall_back(self, deployment_id: str, reason: str) -> None:
        """`auto` chose vLLM and vLLM could not load the model: the deployment runs on `transformers` from
        now on, saying why (until its engine is patched, which chooses again)."""
        with self._database.transaction() as session:
            deployment = session.get(Deployment, deployment_id, with_for_update=True)
            if (
                deployment is None
                or deployment.engine != AUTO
                or not engine_spec(deployment.engine_in_use).lists_architectures
            ):
                return  # deleted, or its engine changed meanwhile
            deployment.engine_in_use = FALLBACK
            deployment.engine_reason = f"auto fell back to {FALLBACK}: {reason}"
        self._refs_cache.clear()

    def engine_measured(
        self, deployment_id: str, engine: str, reason: str, quality: str | None = None
    ) -> None:
        """A replica chose the engine at load (an encoder's runtime: `auto` measured ONNX Runtime
        against torch, or read that decision from its cache), and int8's quality: the deployment shows
        them."""
        with self._database.transaction() as session:
            deployment = session.get(Deployment, deployment_id, with_for_update=True)
            if deployment is None or not engine_spec(deployment.engine).measured_at_load:
                return  # deleted, or its engine changed meanwhile
            deployment.engine_in_use, deployment.engine_reason = engine, reason
            if deployment.precision == "int8":
                deployment.precision_quality = quality
        self._refs_cache.clear()

    def delete(self, account_id: str, deployment_id: str) -> None:
        with self._database.transaction() as session:
            deployment = session.get(Deployment, deployment_id, with_for_update=True)
            if deployment is None or deployment.account_id != account_id:
                raise _not_found()
            attached = adapters.attached(session, deployment.id)
            if attached:
                raise adapters.still_attached(deployment, attached)
            self._count_uses(session, self._listed(deployment), set())
            session.delete(deployment)
            removed = audit.removed(audited(deployment))
            audit.record(session, "deployment.deleted", "deployment", deployment.id, account_id, removed)
        self._refs_cache.clear()
