"""Where a fine-tuning job trains: its footprint in the server's memory budget, and where it fits now,
as a replica is placed (docs/runtime.md, "Capacity"; docs/fine-tuning.md, "How it trains")."""

from __future__ import annotations

from typing import Literal, Protocol

from modelhost.runtime.capacity import Capacity, Footprint
from modelhost.runtime.footprint import EXECUTED_WORKER_COST, GPU_PROCESS_COST

TRAINING_FACTOR = 3  # a job's footprint where it computes: the base's weights this many times


class Room(Protocol):
    """What a job needs of the supervisor's placement (`runtime.supervisor.placement.Placement`): the
    budget, whether it is enforced here, and a way to tell waiting loads that room appeared."""

    capacity: Capacity
    enforced: bool

    @property
    def on_gpu(self) -> bool: ...

    def changed(self) -> None: ...


def footprint(weights: int, on_gpu: bool) -> Footprint:
    """A job's reservation: the base's weights TRAINING_FACTOR times over (weights, activations and
    their gradients, the optimizer's work) where the trainer computes (a GPU's memory, or the host's),
    plus the cost of a worker process (and of a CUDA context on a GPU)."""
    if on_gpu:
        return Footprint(EXECUTED_WORKER_COST + weights, weights * TRAINING_FACTOR + GPU_PROCESS_COST)
    return Footprint(weights * TRAINING_FACTOR + EXECUTED_WORKER_COST)


def place(capacity: Capacity, need: Footprint, enforced: bool) -> int | Literal[False] | None:
    """Where the job fits now, as a replica is placed: the GPU with the most free budget that holds it
    (None: the host alone); False where it fits nowhere yet."""
    order = capacity.gpu_order(need)
    if not enforced:
        return order[0] if order else None
    return next((gpu for gpu in order if capacity.fits(need, gpu)), False)
