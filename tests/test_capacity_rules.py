"""Capacity's rules without processes: which deployments eviction picks, where a GPU deployment goes,
what the default budget reads from a cgroup, what a footprint is predicted and measured at, and the
order in which waiting loads get room (runtime/capacity.py, runtime/footprint.py,
runtime/supervisor/placement.py, runtime/memory.py). tests/test_capacity.py drives the same through HTTP with
real worker processes."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from modelhost.clock import SystemClock
from modelhost.config import Settings
from modelhost.errors import CapacityConflict, InsufficientCapacity
from modelhost.runtime.capacity import MB, Candidate, Capacity, Footprint, Load, evictions, memory_limit
from modelhost.runtime.footprint import BASE_COSTS, kv_cache_bytes, predict
from modelhost.runtime.memory import _footprint_of
from modelhost.runtime.spec import AttachedAdapter, DeploymentSpec
from modelhost.runtime.supervisor.placement import Placement

GiB = 1 << 30


def candidate(
    name: str,
    readiness: str = "cold",
    *,
    used: float = 0.0,
    idle: bool = True,
    loaded: float = 0.0,
    size: int = 100,
    gpu: int | None = None,
    gpu_size: int = 0,
    account: str = "acct",
) -> Candidate:
    return Candidate(name, readiness, idle, used, loaded, Footprint(size, gpu_size), gpu, account)


# ---------------------------------------------------------------- eviction


def test_eviction_takes_cold_before_warm_least_recently_used_first() -> None:
    loaded = [
        candidate("warm-old", "warm", used=1),
        candidate("cold-new", "cold", used=9),
        candidate("cold-old", "cold", used=5),
        candidate("warm-new", "warm", used=8),
    ]
    order = evictions(Footprint(400), None, loaded, now=100, min_residency=30)
    assert [c.deployment_id for c in order or []] == ["cold-old", "cold-new", "warm-old", "warm-new"]
    fewest = evictions(Footprint(150), None, loaded, now=100, min_residency=30)
    assert [c.deployment_id for c in fewest or []] == ["cold-old", "cold-new"]


def test_eviction_never_takes_hot_busy_or_recently_loaded_deployments() -> None:
    loaded = [
        candidate("hot", "hot"),
        candidate("busy", idle=False),
        candidate("new", loaded=90),
        candidate("old", loaded=69),
    ]
    assert [c.deployment_id for c in evictions(Footprint(100), None, loaded, 100, 30) or []] == ["old"]
    assert evictions(Footprint(200), None, loaded, 100, 30) is None  # the load waits
    assert evictions(Footprint(0), None, loaded, 100, 30) == []  # it fits already


def test_eviction_for_a_gpu_frees_that_gpu_and_passes_over_what_frees_nothing_short() -> None:
    loaded = [
        candidate("cpu-only", used=1, size=500),
        candidate("other-gpu", used=2, size=10, gpu=1, gpu_size=800),
        candidate("this-gpu", used=3, size=10, gpu=0, gpu_size=800),
    ]
    plan = evictions(Footprint(0, 600), 0, loaded, now=100, min_residency=0)
    assert [c.deployment_id for c in plan or []] == ["this-gpu"]


def test_a_cold_load_never_evicts_another_accounts_warm_deployment() -> None:
    loaded = [
        candidate("theirs-warm", "warm", used=1, account="alpha"),
        candidate("theirs-cold", "cold", used=5, account="alpha"),
        candidate("own-warm", "warm", used=3, account="bravo"),
    ]
    everyone = {"alpha": Footprint(200), "bravo": Footprint(100)}
    cold = Load("bravo", "cold", everyone, share=Footprint(150))
    # its own warm one (first: its own go first) and another account's cold one make room; the other's
    # warm one never does
    plan = evictions(Footprint(200), None, loaded, 100, 30, cold)
    assert [c.deployment_id for c in plan or []] == ["own-warm", "theirs-cold"]
    assert evictions(Footprint(300), None, loaded, 100, 30, cold) is None  # it waits
    # the same account's cold load evicts its own warm deployments as before
    own = Load("alpha", "cold", everyone, share=Footprint(150))
    assert [c.deployment_id for c in evictions(Footprint(200), None, loaded, 100, 30, own) or []] == [
        "theirs-cold",
        "theirs-warm",
    ]


def test_a_warm_load_evicts_another_accounts_warm_ones_only_while_it_holds_more_than_its_share() -> None:
    loaded = [
        candidate("alpha-old", "warm", used=1, account="alpha"),
        candidate("alpha-new", "warm", used=2, account="alpha"),
    ]
    # alpha holds 200 of a 300 budget shared by two accounts (150 each): one of its warm ones may go,
    # which leaves it 100, within its share, and the second stays
    warm = Load("bravo", "warm", {"alpha": Footprint(200), "bravo": Footprint(0)}, share=Footprint(150))
    assert [c.deployment_id for c in evictions(Footprint(100), None, loaded, 100, 30, warm) or []] == [
        "alpha-old"
    ]
    assert evictions(Footprint(150), None, loaded, 100, 30, warm) is None
    hot = Load("bravo", "hot", {"alpha": Footprint(200), "bravo": Footprint(0)}, share=Footprint(150))
    assert evictions(Footprint(150), None, loaded, 100, 30, hot) is None  # pinned or not, the same share
    within = Load("bravo", "warm", {"alpha": Footprint(150), "bravo": Footprint(0)}, share=Footprint(150))
    assert evictions(Footprint(100), None, loaded, 100, 30, within) is None
    # on a GPU, an account over its share of that GPU's budget gives way too
    on_gpu = [candidate("alpha-gpu", "warm", account="alpha", size=10, gpu=0, gpu_size=600)]
    gpu_load = Load("bravo", "warm", {"alpha": Footprint(10, 600)}, share=Footprint(1000, 500))
    assert [c.deployment_id for c in evictions(Footprint(0, 100), 0, on_gpu, 100, 30, gpu_load) or []] == [
        "alpha-gpu"
    ]


def test_a_load_takes_its_own_accounts_idle_deployments_before_anyone_elses() -> None:
    """Even another account's cold deployment, used longer ago, goes after the loading account's own
    warm one (issue 72: eviction takes the loading account's own first)."""
    loaded = [
        candidate("theirs-cold", "cold", used=1, account="alpha"),
        candidate("own-warm", "warm", used=9, account="bravo"),
        candidate("own-cold", "cold", used=8, account="bravo"),
    ]
    load = Load("bravo", "warm", {"alpha": Footprint(100), "bravo": Footprint(200)}, share=Footprint(150))
    plan = evictions(Footprint(300), None, loaded, 100, 30, load)
    assert [c.deployment_id for c in plan or []] == ["own-cold", "own-warm", "theirs-cold"]
    assert [c.deployment_id for c in evictions(Footprint(100), None, loaded, 100, 30, load) or []] == [
        "own-cold"
    ]


def test_a_load_over_its_own_accounts_share_evicts_no_other_accounts_warm_deployment() -> None:
    """Alpha holds 200 of a 300 budget (over its share of 150): bravo's load of 100 may take one of
    alpha's warm ones, but bravo's load of 200 would put bravo over its own share, so it may not."""
    loaded = [
        candidate("alpha-old", "warm", used=1, account="alpha"),
        candidate("alpha-new", "warm", used=2, account="alpha"),
    ]
    held = {"alpha": Footprint(200), "bravo": Footprint(0)}
    small = Load("bravo", "warm", held, share=Footprint(150), needs=Footprint(100))
    assert [c.deployment_id for c in evictions(Footprint(100), None, loaded, 100, 30, small) or []] == [
        "alpha-old"
    ]
    large = Load("bravo", "warm", held, share=Footprint(150), needs=Footprint(200))
    assert large.loader_over_share()
    assert evictions(Footprint(100), None, loaded, 100, 30, large) is None


def test_an_accounts_share_of_the_budget_follows_the_accounts_weights() -> None:
    """Weights 2 and 1 on a 900 budget: 600 and 300. Alpha, of weight 2, holding 500 is within its share,
    so bravo's warm load may not evict it; at weight 1 alpha would be over its 450, and it may."""
    capacity = Capacity(budget=900)
    capacity.hold("a1", "alpha", Footprint(500), None, weight=2.0)
    load = capacity.load("bravo", "warm", None, weight=1.0, needs=Footprint(100))
    assert load.share == Footprint(300)  # a weight of 1's share: 900 / (2 + 1)
    assert (load.share_of("alpha"), load.share_of("bravo")) == (Footprint(600), Footprint(300))
    loaded = [candidate("a1", "warm", account="alpha", size=500)]
    assert evictions(Footprint(100), None, loaded, 100, 30, load) is None
    capacity.hold("a2", "alpha", Footprint(0), None, weight=1.0)  # the operator lowered it: its next load
    equal = capacity.load("bravo", "warm", None, weight=1.0, needs=Footprint(100))
    assert equal.share_of("alpha") == Footprint(450)
    assert [c.deployment_id for c in evictions(Footprint(100), None, loaded, 100, 30, equal) or []] == ["a1"]


def test_an_accounts_share_is_an_equal_part_of_the_budget_among_the_accounts_holding_memory() -> None:
    capacity = Capacity(budget=900, gpu_budgets=[600])
    capacity.hold("a1", "alpha", Footprint(300), None)
    capacity.hold("a2", "alpha", Footprint(200, 100), 0)
    capacity.release(capacity.hold("gone", "charlie", Footprint(100), None))
    capacity.hold("b1", "bravo", Footprint(100), None).unloading = True  # still holds until it exits
    load = capacity.load("delta", "warm", 0)
    assert load.share == Footprint(900 // 3, 600 // 3)  # alpha, bravo and the load's own account
    assert load.held == {"alpha": Footprint(500, 100), "bravo": Footprint(100), "delta": Footprint(0)}
    assert capacity.load("alpha", "cold", None).share == Footprint(450)  # alpha and bravo


def test_a_gpu_deployment_goes_to_the_gpu_with_the_most_free_budget_that_fits() -> None:
    capacity = Capacity(10 * GiB, [8 * GiB, 16 * GiB, 16 * GiB])
    capacity.hold("x", "acct", Footprint(MB, 10 * GiB), 2)
    assert capacity.gpu_order(Footprint(MB, 4 * GiB)) == [1, 0, 2]  # 16 free, 8 free, 6 free
    assert capacity.gpu_order(Footprint(MB, 12 * GiB)) == [1, 2]  # GPU 0 could never hold it
    assert capacity.gpu_order(Footprint(MB)) == [None]  # host memory only
    assert capacity.fits(Footprint(MB, 7 * GiB), 2) is False and capacity.fits(Footprint(MB, 6 * GiB), 2)
    assert "more than the budget of the largest GPU" in (capacity.never_fits(Footprint(MB, 17 * GiB)) or "")


def test_hot_deployments_are_packed_onto_the_gpus_before_another_is_accepted() -> None:
    capacity = Capacity(100 * GiB, [10 * GiB, 10 * GiB])
    pinned = [Footprint(GiB, 6 * GiB), Footprint(GiB, 6 * GiB)]
    assert capacity.fits_beside_pinned(Footprint(GiB, 4 * GiB), pinned)  # 6+4 and 6
    assert not capacity.fits_beside_pinned(Footprint(GiB, 5 * GiB), pinned)  # 6+5 fits no GPU
    assert not capacity.fits_beside_pinned(Footprint(99 * GiB), pinned)  # host memory


def test_a_holding_stays_reserved_until_released_and_releasing_twice_is_harmless() -> None:
    capacity = Capacity(1000)
    first = capacity.hold("a", "acct", Footprint(600), None)
    assert not capacity.fits(Footprint(500), None)
    first.unloading = True  # its processes are stopping: still counted
    assert capacity.reserved == 600
    capacity.release(first)
    capacity.release(first)
    assert capacity.reserved == 0 and capacity.fits(Footprint(1000), None)
    assert "more than the whole budget" in (capacity.never_fits(Footprint(1001)) or "")


# ---------------------------------------------------------------- the default budget


def test_the_memory_limit_is_the_smallest_of_the_machine_and_the_cgroups_on_the_path(tmp_path: Path) -> None:
    meminfo = "MemTotal:       16384000 kB\nMemFree: 1 kB\n"
    (tmp_path / "memory" / "kube" / "pod").mkdir(parents=True)
    (tmp_path / "memory" / "kube" / "memory.limit_in_bytes").write_text(str(4 * GiB))
    (tmp_path / "memory" / "kube" / "pod" / "memory.limit_in_bytes").write_text("9223372036854771712")
    v1 = "4:memory:/kube/pod\n3:cpu:/\n"
    assert memory_limit(tmp_path, v1, meminfo) == 4 * GiB  # the parent's limit holds for the child
    (tmp_path / "svc").mkdir()
    (tmp_path / "svc" / "memory.max").write_text(f"{3 * GiB}\n")
    assert memory_limit(tmp_path, "0::/svc\n", meminfo) == 3 * GiB
    (tmp_path / "svc" / "memory.max").write_text("max\n")
    assert memory_limit(tmp_path, "0::/svc\n", meminfo) == 16384000 * 1024  # no limit: the machine's
    assert memory_limit(tmp_path / "absent", v1, meminfo) == 16384000 * 1024


# ---------------------------------------------------------------- predicted and measured footprints


def tiny_generator(folder: Path, *, dtype: str = "float32") -> Path:
    folder.mkdir()
    config = {
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_size": 64,
        "max_position_embeddings": 1024,
        "dtype": dtype,
    }
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"\0" * (3 * MB))
    (folder / "tokenizer.json").write_text("{}")  # not a weight
    return folder


def test_a_prediction_is_the_weights_plus_the_kv_cache_plus_the_engine_base(tmp_path: Path) -> None:
    folder = tiny_generator(tmp_path / "gen")
    per_token = 2 * 2 * 2 * (64 // 4) * 4  # K and V, layers, kv heads, head dim, float32
    kv = kv_cache_bytes(folder, None, host_budget=8 * GiB, gpu_room=None)
    assert kv == -(-64 * 1025 * per_token // MB) * MB  # 64 whole contexts, in whole MB
    common = dict(
        model_dir=folder, pipeline="text-generation", remembered=None, kv_cache_mb=None, host_budget=8 * GiB,
        gpu_budget=0, base_costs={}, preload=True,
    )  # fmt: skip
    cpu = predict(engine="transformers", on_gpu=False, **common)  # type: ignore[arg-type]
    assert (cpu.weights, cpu.kv_cache) == (3 * MB, kv)
    assert cpu.footprint == Footprint(3 * MB + kv + BASE_COSTS["transformers"])
    learned = predict(engine="transformers", on_gpu=False, **{**common, "base_costs": {"transformers": MB}})  # type: ignore[arg-type]
    assert learned.footprint == Footprint(3 * MB + kv + MB)
    remembered = predict(engine="transformers", on_gpu=False, **{**common, "remembered": Footprint(7)})  # type: ignore[arg-type]
    assert remembered.footprint == Footprint(7) and remembered.remembered


def test_the_kv_cache_is_the_operators_or_capped_by_the_budget(tmp_path: Path) -> None:
    folder = tiny_generator(tmp_path / "gen")
    assert kv_cache_bytes(folder, 48, host_budget=8 * GiB, gpu_room=None) == 48 * MB
    assert kv_cache_bytes(folder, None, host_budget=16 * MB, gpu_room=None) == 2 * MB  # an eighth
    assert kv_cache_bytes(folder, None, host_budget=8 * GiB, gpu_room=6 * MB) == 3 * MB  # half the GPU's room


def test_an_encoder_predicts_no_kv_cache_and_a_gpu_deployment_puts_weights_on_the_gpu(tmp_path: Path) -> None:
    folder = tiny_generator(tmp_path / "enc")
    common = dict(
        model_dir=folder, pipeline="feature-extraction", engine="transformers", remembered=None,
        kv_cache_mb=None, host_budget=8 * GiB, gpu_budget=40 * GiB, base_costs={}, preload=True,
    )  # fmt: skip
    assert predict(on_gpu=False, **common).kv_cache == 0  # type: ignore[arg-type]
    on_gpu = predict(on_gpu=True, **common)  # type: ignore[arg-type]
    assert on_gpu.footprint.host == BASE_COSTS["transformers"] and on_gpu.footprint.gpu > 3 * MB


SMAPS = b"""\
00400000-00600000 r-xp 00000000 08:01 1234 /usr/lib/libtorch_cpu.so
Rss:                2048 kB
Pss:                 512 kB
Private_Clean:      1024 kB
Private_Dirty:         8 kB
SwapPss:               0 kB
VmFlags: rd ex mr mw me
7f0000000000-7f0000100000 rw-p 00000000 00:00 0 [heap]
Rss:                1024 kB
Pss:                 600 kB
Private_Clean:         4 kB
Private_Dirty:       500 kB
SwapPss:              16 kB
7f0000200000-7f0000600000 r--s 00000000 08:01 99 /data/blobs/art_1/model.safetensors
Size:               4096 kB
Rss:                2048 kB
Pss:                1024 kB
Private_Clean:         0 kB
Private_Dirty:         0 kB
SwapPss:               0 kB
7f0000500000-7f0000600000 rw-p 00000000 00:00 0
Rss:                 100 kB
Pss:                  30 kB
Private_Clean:         0 kB
Private_Dirty:        30 kB
SwapPss:               0 kB
"""


UNTOUCHED = b"""\
7f0000200000-7f0000600000 r--s 00000000 08:01 99 /data/blobs/art_1/model-2.safetensors
Size:               4096 kB
Rss:                   0 kB
Pss:                   0 kB
"""


def test_a_footprint_counts_written_pages_and_a_share_of_data_files_not_library_code() -> None:
    # library: its written pages (8); heap: private (4 + 500) and swap (16); a data file: its share of the
    # resident pages (1024); an anonymous mapping: private (30). The template's shared pages: nowhere.
    assert _footprint_of(SMAPS) == (8 + 4 + 500 + 16 + 1024 + 30) * 1024


def test_the_models_own_files_count_whole_once_whoever_else_maps_them() -> None:
    model = b"/data/blobs/art_1/"
    # the weights: half of their 4096 kB read, half of that shared with another replica: all 4096 kB
    # count, as they would with the other replica gone (issue 49)
    assert _footprint_of(SMAPS, model) == (8 + 4 + 500 + 16 + 4096 + 30) * 1024
    assert _footprint_of(UNTOUCHED, model) == 4096 * 1024  # not read yet: they will be
    assert _footprint_of(UNTOUCHED + UNTOUCHED, model) == 4096 * 1024  # one file mapped twice: once
    second_part = UNTOUCHED.replace(b" 00000000 08:01", b" 00400000 08:01")  # its next 4096 kB
    assert _footprint_of(UNTOUCHED + second_part, model) == 2 * 4096 * 1024
    assert _footprint_of(UNTOUCHED, b"/elsewhere/") == 0


# ---------------------------------------------------------------- placement: waiting, evicting, GPUs


@dataclass
class FakeTenant:
    """A deployment as placement sees it, loaded or not, that records its eviction."""

    spec: DeploymentSpec
    state: str = "unloaded"
    last_used: float = 0.0
    loaded_at: float = 0.0
    in_flight: int = 0
    evicted: list[str] = field(default_factory=list)
    placement: Placement | None = None
    reservation: object = None

    async def busy(self) -> bool:
        return self.in_flight > 0

    async def held(self) -> int:
        return self.in_flight

    async def evict(self, reason: str) -> bool:
        self.evicted.append(reason)
        self.state = "unloaded"
        assert self.placement is not None
        self.placement.release(self.reservation)  # type: ignore[arg-type]
        return True


def spec_of(
    name: str, tmp_path: Path, readiness: str = "cold", size: int = 30 * MB, account: str = "acct"
) -> DeploymentSpec:
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    return DeploymentSpec(
        id=name, pipeline="feature-extraction", readiness=readiness, min_replicas=1, max_replicas=1,
        model_dir=folder, account_id=account, model=name, artifact_id="art",
        remembered={"cpu": Footprint(size)},
    )  # fmt: skip


def placement_of(tmp_path: Path, budget_mb: int, **settings: object) -> Placement:
    values = Settings(
        data_dir=tmp_path, memory_budget_mb=budget_mb, min_residency_seconds=0, device="cpu", **settings
    )  # type: ignore[arg-type]
    return Placement(values, SystemClock(), gpus=[])


async def loaded(placement: Placement, tenant: FakeTenant, tenants: list[FakeTenant]) -> None:
    tenant.placement = placement
    tenant.reservation = await placement.admit(tenant, 1, deadline=1e18, tenants=lambda: tenants)
    tenant.state = "ready"


async def test_a_load_that_does_not_fit_evicts_the_least_recently_used_idle_deployment(
    tmp_path: Path,
) -> None:
    placement = placement_of(tmp_path, 70)
    old, recent = FakeTenant(spec_of("old", tmp_path), last_used=1), FakeTenant(spec_of("recent", tmp_path))
    tenants = [old, recent]
    await loaded(placement, old, tenants)
    await loaded(placement, recent, tenants)
    recent.last_used = 5
    newcomer = FakeTenant(spec_of("new", tmp_path))
    await loaded(placement, newcomer, [*tenants, newcomer])
    assert old.evicted and old.evicted[0].startswith("evicted to make room for new at ")
    assert not recent.evicted
    assert placement.capacity.reserved == 60 * MB


async def test_waiting_loads_get_room_first_in_first_out_and_time_out_with_retry_after(
    tmp_path: Path,
) -> None:
    placement = placement_of(tmp_path, 40)
    busy = FakeTenant(spec_of("busy", tmp_path), in_flight=1)
    tenants = [busy]
    await loaded(placement, busy, tenants)
    order: list[str] = []

    async def wait_for_room(name: str) -> None:
        tenant = FakeTenant(spec_of(name, tmp_path))
        tenants.append(tenant)
        await loaded(placement, tenant, tenants)
        order.append(name)
        placement.release(tenant.reservation)  # type: ignore[arg-type]

    first = asyncio.create_task(wait_for_room("first"))
    await asyncio.sleep(0.05)
    second = asyncio.create_task(wait_for_room("second"))
    await asyncio.sleep(0.05)
    assert placement.waiting == 2 and not order
    busy.in_flight = 0  # idle now: evictable; the first in line evicts it, then the second follows
    await asyncio.wait_for(asyncio.gather(first, second), 5)
    assert order == ["first", "second"]

    blocker = FakeTenant(spec_of("pinned", tmp_path, readiness="hot"))
    await loaded(placement, blocker, [blocker])
    late = FakeTenant(spec_of("late", tmp_path))
    with pytest.raises(InsufficientCapacity) as refused:
        await placement.admit(late, 1, deadline=time.monotonic() + 0.3, tenants=lambda: [blocker, late])
    assert refused.value.headers == {"Retry-After": "5"}
    assert "pinned (hot)" in refused.value.message and "pinned (hot, 30 MiB)" in refused.value.message
    assert placement.waiting == 0


async def test_a_background_reload_takes_only_free_room_and_never_jumps_the_queue(tmp_path: Path) -> None:
    placement = placement_of(tmp_path, 40)
    idle = FakeTenant(spec_of("idle", tmp_path))
    await loaded(placement, idle, [idle])
    warm = FakeTenant(spec_of("warm", tmp_path, readiness="warm"))
    with pytest.raises(InsufficientCapacity):
        await placement.admit(warm, 1, deadline=1e18, tenants=lambda: [idle, warm], may_evict=False)
    assert not idle.evicted  # a background reload evicts nobody


async def test_a_hot_deployment_must_fit_beside_the_pinned_ones(tmp_path: Path) -> None:
    placement = placement_of(tmp_path, 70)
    pinned = spec_of("p1", tmp_path, readiness="hot")
    placement.check_fits(spec_of("p2", tmp_path, readiness="hot"), 1, [(pinned, 1)], {})
    with pytest.raises(CapacityConflict) as refused:
        placement.check_fits(spec_of("p3", tmp_path, readiness="hot", size=50 * MB), 1, [(pinned, 1)], {})
    assert "p1 (p1, 30 MiB)" in refused.value.message and "70 MiB budget" in refused.value.message
    grown = {pinned.key: Footprint(45 * MB)}  # loaded, and measured above its prediction
    with pytest.raises(CapacityConflict):
        placement.check_fits(spec_of("p2", tmp_path, readiness="hot"), 1, [(pinned, 1)], grown)
    placement.check_fits(spec_of("c", tmp_path, size=50 * MB), 1, [(pinned, 1)], {})  # cold: evicts or waits
    with pytest.raises(CapacityConflict):
        placement.check_fits(spec_of("huge", tmp_path, size=71 * MB), 1, [], {})  # never fits at all


async def test_gpu_deployments_are_placed_on_the_gpu_with_the_most_free_budget(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, memory_budget_mb=10_000, device="auto", gpu_memory_fraction=0.5)
    placement = Placement(settings, SystemClock(), gpus=[8 * GiB, 16 * GiB])
    assert placement.capacity.gpu_budgets == [4 * GiB, 8 * GiB]
    tenants: list[FakeTenant] = []
    devices = []
    for name in ("a", "b", "c"):
        spec = replace(spec_of(name, tmp_path), remembered={"cuda": Footprint(MB, 3 * GiB)})
        tenant = FakeTenant(spec)
        tenants.append(tenant)
        await loaded(placement, tenant, tenants)
        devices.append(tenant.reservation.spec.device)  # type: ignore[attr-defined]
    assert devices == ["cuda:1", "cuda:1", "cuda:0"]  # 8 free, then 5 free against 4, then 4 against 2
    view = await placement.view()
    assert [g["reserved_bytes"] for g in view["gpus"]] == [3 * GiB, 6 * GiB]


async def test_footprints_measured_above_the_budget_evict_idle_deployments_until_it_holds(
    tmp_path: Path,
) -> None:
    placement = placement_of(tmp_path, 100)
    old, busy, recent = (FakeTenant(spec_of(n, tmp_path)) for n in ("old", "busy", "recent"))
    tenants = [old, busy, recent]
    for tenant in tenants:
        await loaded(placement, tenant, tenants)
    old.last_used, busy.last_used, recent.last_used, busy.in_flight = 1, 2, 3, 1
    for tenant in tenants:  # they grew as requests touched their weights: 40 MiB each, 120 in all
        placement.measured(tenant.reservation, [Footprint(40 * MB)])  # type: ignore[arg-type]
    assert placement.over_budget() == 20 * MB
    await placement.shed(tenants)
    assert old.evicted and old.evicted[0].endswith("the deployments' measured memory grew above the budget")
    assert not busy.evicted and not recent.evicted
    assert placement.over_budget() == 0
    assert placement.base_costs["transformers"] == 40 * MB  # what a replica took above its weights (none)


# ---------------------------------------------------------------- what one tenant reads of another


async def test_capacity_messages_name_the_viewers_own_deployments_and_count_the_others(
    tmp_path: Path,
) -> None:
    """The 409 for a hot deployment, the 503 after a wait (and its `state_reason`), and an evicted
    deployment's `state_reason`, each as the account it is written for reads it: its own deployments
    named, other accounts' counted (docs/api-decisions.md, "What one tenant can see of another")."""
    placement = placement_of(tmp_path, 70)
    pinned = FakeTenant(spec_of("alpha-pinned", tmp_path, readiness="hot", account="alpha"))
    idle = FakeTenant(spec_of("alpha-idle", tmp_path, account="alpha"))
    tenants = [pinned, idle]
    for tenant in tenants:
        await loaded(placement, tenant, tenants)
    alpha = ("alpha-pinned", "alpha-idle")

    hot = spec_of("bravo-hot", tmp_path, readiness="hot", size=50 * MB, account="bravo")
    with pytest.raises(CapacityConflict) as refused:
        placement.check_fits(hot, 1, [(pinned.spec, 1)], placement.held())
    message = refused.value.message
    assert "1 pinned deployment of other accounts holds 30 MiB" in message, message
    assert not any(name in message for name in alpha), message
    assert "Make one of yours" not in message  # it has none to change
    own = spec_of("alpha-hot", tmp_path, readiness="hot", size=50 * MB, account="alpha")
    with pytest.raises(CapacityConflict) as refused:
        placement.check_fits(own, 1, [(pinned.spec, 1)], placement.held())
    assert "alpha-pinned (alpha-pinned, 30 MiB)" in refused.value.message  # its owner reads its name

    # bravo's load evicts alpha's idle deployment: alpha reads that another account's load took its room
    newcomer = FakeTenant(spec_of("bravo-new", tmp_path, account="bravo"))
    await loaded(placement, newcomer, [*tenants, newcomer])
    [why] = idle.evicted
    assert why.startswith("evicted to make room for a deployment of another account at "), why
    assert "bravo" not in why

    # and finds no room for a second: the 503 (its `state_reason`) counts alpha's pinned deployment
    late = FakeTenant(spec_of("bravo-late", tmp_path, account="bravo"))
    newcomer.in_flight = 1
    with pytest.raises(InsufficientCapacity) as waited:
        await placement.admit(late, 1, time.monotonic() + 0.3, lambda: [pinned, newcomer, late])
    message = waited.value.message
    assert "bravo-new (cold, 30 MiB); 1 deployment of other accounts holds 30 MiB" in message, message
    assert not any(name in message for name in alpha), message


async def test_what_is_said_of_a_shared_base_names_none_of_its_owners_other_deployments(
    tmp_path: Path,
) -> None:
    """A shared base's state is read by the accounts whose adapters it serves too."""
    placement = placement_of(tmp_path, 40)
    pinned = FakeTenant(spec_of("alpha-pinned", tmp_path, readiness="hot", account="alpha"))
    await loaded(placement, pinned, [pinned])
    theirs = AttachedAdapter("bravo-adapter", "bravo", "bravo-tuned", "art", 1000, 8)
    base = FakeTenant(replace(spec_of("alpha-base", tmp_path, account="alpha"), adapters=(theirs,)))
    assert base.spec.viewers == {"alpha", "bravo"}
    with pytest.raises(InsufficientCapacity) as waited:
        await placement.admit(base, 1, time.monotonic() + 0.3, lambda: [pinned, base])
    message = waited.value.message
    assert "No memory to load alpha-base" in message and "1 other deployment holds 30 MiB" in message
    assert "alpha-pinned" not in message, message


async def test_one_accounts_cold_load_waits_rather_than_evict_another_accounts_idle_warm_deployment(
    tmp_path: Path,
) -> None:
    """Issue 70, S15: a cold load took another account's warm deployment's room (its next request waited
    for a load). Now it waits and says why; a warm load takes that room only from an account holding more
    than its share (an equal part of the budget among the accounts holding memory), and only down to it."""
    placement = placement_of(tmp_path, 70)
    alpha = [FakeTenant(spec_of(f"alpha-{n}", tmp_path, readiness="warm", account="alpha")) for n in (1, 2)]
    tenants = [*alpha]
    for tenant in alpha:
        await loaded(placement, tenant, tenants)
    alpha[0].last_used, alpha[1].last_used = 1, 2
    cold = FakeTenant(spec_of("bravo-cold", tmp_path, account="bravo"))
    tenants.append(cold)
    with pytest.raises(InsufficientCapacity) as waited:
        await placement.admit(cold, 1, time.monotonic() + 0.3, lambda: tenants)
    assert not alpha[0].evicted and not alpha[1].evicted
    message = waited.value.message
    assert "warm deployments of other accounts, which a cold deployment's load never evicts" in message
    assert "alpha" not in message, message

    # bravo's warm load: alpha holds 60 of 70 MiB, more than its 35: its least recently used one goes
    warm = FakeTenant(spec_of("bravo-warm", tmp_path, readiness="warm", account="bravo"))
    tenants.append(warm)
    await loaded(placement, warm, tenants)
    assert alpha[0].evicted and not alpha[1].evicted
    # a second one would put bravo over its own share (30 + 30 of 35 MiB; its own warm one is busy):
    # it waits, and says which share is full
    warm.in_flight = 1
    second = FakeTenant(spec_of("bravo-second", tmp_path, readiness="warm", account="bravo"))
    tenants.append(second)
    with pytest.raises(InsufficientCapacity) as waited:
        await placement.admit(second, 1, time.monotonic() + 0.3, lambda: tenants)
    assert not alpha[1].evicted
    message = waited.value.message
    assert "which a load is not given while its own account's share is full" in message, message
    assert "would hold 60 MiB with it, over its share of 35 MiB (weight 1 of the 2" in message, message
