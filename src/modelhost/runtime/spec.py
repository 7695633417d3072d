"""The runtime's own view of a deployment: what it needs to load and serve one (`DeploymentSpec`),
and what it reports of one right now (`LiveStatus`). `services.deployments` builds the specs from the
store; the runtime, billing's meters and the server's stand-ins read them."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from modelhost.generation.deployment_settings import GenerationSettings
from modelhost.routing import Version, version_key
from modelhost.runtime.capacity import Footprint

# vLLM sizes its LoRA slots for one rank among these (`max_lora_rank`)
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass(frozen=True, slots=True)
class ScalingEvent:
    """The autoscaler's last step for a deployment (`to` equal to `from`: a step it could not take, such
    as a replica the memory budget had no room for, with why)."""

    at: float  # unix time
    before: int  # replicas before ("from")
    after: int  # replicas after ("to")
    reason: str


@dataclass(frozen=True, slots=True)
class LiveStatus:
    """What the runtime reports of a deployment right now."""

    state: str = "unloaded"
    reason: str | None = None
    replicas: int = 0
    memory_gb: float = 0.0
    last_cold_start_seconds: float | None = None
    desired_replicas: int = 0  # what the autoscaler wants (`replicas` while it is not scaling)
    last_scaling: ScalingEvent | None = None


@dataclass(frozen=True, slots=True)
class DeploymentSpec:
    """What the runtime needs to load and serve a deployment."""

    id: str
    pipeline: str
    readiness: str
    min_replicas: int
    max_replicas: int
    model_dir: Path
    # Who pays for its replicas, and what the bill names.
    account_id: str
    model: str
    artifact_id: str
    # its account's weight: its share of the memory budget against other accounts' (`runtime.capacity`)
    account_weight: float = 1.0
    # the engine its replicas run (`runtime.engine_choice`): `transformers` or `vllm`
    engine: str = "transformers"
    # `auto` chose vLLM: if vLLM cannot load the model, the runtime runs it on `transformers` instead
    falls_back: bool = False
    precision: str = "float32"  # `int8`: an encoder's runtime quantized (`engines.encoders`)
    # What one replica of its artifact measured last time on this engine and precision, by device kind
    # (`cpu`, `cuda`): the next load reserves it (`runtime.footprint`)
    remembered: dict[str, Footprint] = field(default_factory=dict)
    # Where the manager placed its replicas (`cuda:1`); None: the server's `device` setting
    device: str | None = None
    # The KV cache the manager gives each replica of a generation task (its footprint counts it)
    kv_cache_mb: int | None = None
    # One replica's footprint as its load reserved it (Ray Serve: the actor's `memory` and `num_gpus`)
    footprint: Footprint | None = None
    # A base's adapter deployments, each billed for its bytes while the base's replicas hold it
    adapters: tuple[AttachedAdapter, ...] = ()
    # A generation task's own settings (max_model_len, chat template, parsers): its replicas load with
    # them, and a change reloads them (`runtime.supervisor.manager.apply`)
    generation: GenerationSettings = field(default_factory=GenerationSettings)
    # Every version of the deployment (`routing.Version`): this spec is the one of `artifact_id`'s
    versions: tuple[Version, ...] = ()

    @property
    def key(self) -> str:
        """Its name in the runtime: each version of a deployment runs as replicas of its own."""
        return version_key(self.id, self.artifact_id)

    @property
    def viewers(self) -> frozenset[str]:
        """The accounts that see this deployment's state and its errors: its owner, and the accounts of
        the adapters it serves (a shared base's). What is said of it names no deployment that one of
        them may not see (docs/api-decisions.md, "What one tenant can see of another: nothing")."""
        return frozenset((self.account_id, *(adapter.account_id for adapter in self.adapters)))

    def may_name(self, other: DeploymentSpec) -> bool:
        """Whether what is said of this deployment may name `other`: itself, or a deployment of the one
        account that sees it."""
        return other.id == self.id or self.viewers == {other.account_id}

    @property
    def lora_rank(self) -> int | None:
        """The rank a base's vLLM replicas size their LoRA slots for: its adapters' highest, rounded up to
        one vLLM supports; None where no adapter is attached (LoRA stays off: it costs a base speed; the
        first adapter attached reloads the base with it on)."""
        if not self.adapters:
            return None
        highest = max(adapter.rank for adapter in self.adapters)
        return next((r for r in VLLM_LORA_RANKS if r >= highest), VLLM_LORA_RANKS[-1])


@dataclass(frozen=True, slots=True)
class AttachedAdapter:
    """An adapter deployment as its base's replicas hold it: what its bill names, and its size."""

    id: str
    account_id: str
    model: str
    artifact_id: str
    bytes: int
    rank: int


def adapter_spec(base: DeploymentSpec, adapter: AttachedAdapter) -> DeploymentSpec:
    """The adapter as billing's meters see it: a deployment of its own account and artifact."""
    return replace(
        base,
        id=adapter.id,
        account_id=adapter.account_id,
        model=adapter.model,
        artifact_id=adapter.artifact_id,
    )


@dataclass(frozen=True, slots=True)
class AdapterTarget:
    """Where an adapter deployment's requests run: its base's replicas, which load its files (an
    adapter has no replicas of its own; `runtime.gateway.adapters`)."""

    adapter_name: str  # its name on the base: the version's key (`deployment@artifact`)
    base_id: str
    adapter_dir: Path
    bytes: int = 0  # its weights, which each replica of the base holds once loaded
