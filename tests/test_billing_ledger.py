"""The credit ledger on SQLite and PostgreSQL: exact arithmetic, idempotent ticks, storage meters,
usage breakdowns. The runtime side (replicas, readiness, enforcement) is in tests/test_billing.py."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from decimal import Decimal
from fractions import Fraction

import orjson
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from modelhost.batches.files import Owner
from modelhost.billing.ledger import COMPUTE, ComputeReading, Ledger, day_of, shared_meter_id
from modelhost.billing.rates import GB, Rates, cap_reached, carry_text, charge, to_micro
from modelhost.evals import graders
from modelhost.evals.sources import checked_config
from modelhost.evals.store import EvalStore, ItemResult
from modelhost.fine_tuning.dataset import resolve
from modelhost.fine_tuning.store import FineTuningJobs, NewJob
from modelhost.store import migrate
from modelhost.store.db import Database
from modelhost.store.models import (
    Account,
    Batch,
    FineTuningCheckpoint,
    LedgerEntry,
    Meter,
    ModelArtifact,
    UploadedFile,
)
from modelhost.store.types import new_id, utcnow

T0 = 1_795_305_600_000  # 2026-11-22T00:00:00Z in Unix ms
MINUTE = 60_000
# 0.001 credits per GB-second = 1 micro-credit per GB-ms; 0.0036 per GB-hour = 1 micro per GB-second.
RATES = Rates.per_gb(Decimal("0.001"), Decimal("0.0036"), Decimal(0))


def test_charge_carries_the_fraction_so_many_small_ticks_add_up_to_one_big_one() -> None:
    rate = RATES.storage
    assert rate is not None
    carry, total = Fraction(0), 0
    for _ in range(600):  # 600 ticks of 0.1 s of 1 GB: each worth a tenth of a micro-credit
        amount, carry = charge(GB, 100, rate, carry)
        total += amount
    assert (total, carry) == (60, 0) == charge(GB, 60_000, rate, Fraction(0))
    amount, carry = charge(GB, 700, rate, Fraction(0))
    assert (amount, carry) == (0, Fraction(7, 10)) and Fraction(carry_text(carry)) == carry


@pytest.mark.parametrize(
    ("cap", "allowed", "refused"),
    [(5, 4_999_999, 5_000_000), (0.0000015, 1, 2), (0.0000001, 0, 1), (1e-12, 0, 1), (0.000001, 0, 1)],
)
def test_a_spend_cap_is_reached_when_the_spent_micro_credits_reach_it_even_below_one_micro_credit(
    cap: float, allowed: int, refused: int
) -> None:
    """A cap under half a micro-credit once rounded to 0, and refused every request before any was billed."""
    assert not cap_reached(allowed, cap)
    assert cap_reached(refused, cap)


def test_rates_convert_operator_units_exactly() -> None:
    rates = Rates.per_gb(Decimal("0.001"), None, Decimal("0.5"))
    assert charge(GB, 1000, rates.compute, Fraction(0))[0] == 1000  # 1 GB for 1 s = 0.001 credits
    assert rates.storage is None and rates.billed_memory(1) == GB // 2 and rates.billed_memory(GB) == GB
    assert to_micro(0.1) == 100_000 and to_micro(Decimal("12.345678")) == 12_345_678


@pytest.fixture
def database(database_url: str) -> Iterator[Database]:
    db = Database(database_url)
    migrate.upgrade(db)
    yield db
    db.dispose()


def account_with_artifact(database: Database, size: int = 2 * GB, credits: int = 1000) -> tuple[str, str]:
    with database.transaction() as session:
        account = Account(id=new_id("acct"), name="a", credits_granted_micro=credits * 1_000_000)
        session.add(account)
        session.flush()
        artifact = ModelArtifact(
            id=new_id("art"), account_id=account.id, display_name="weights", pipeline="feature-extraction"
        )
        artifact.status, artifact.published_version, artifact.size_bytes = "ready", "up_1", size
        session.add(artifact)
        return account.id, artifact.id


def open_meter(
    ledger: Ledger,
    account_id: str,
    artifact_id: str,
    deployment: str = "dep_1",
    owner: str = "gw",
    *,
    shared: str | None = None,
    now_ms: int = T0,
) -> str:
    return ledger.open_compute(
        owner=owner,
        account_id=account_id,
        deployment_id=deployment,
        model="m",
        artifact_id=artifact_id,
        now_ms=now_ms,
        shared=shared,
    )


def entries(database: Database) -> list[LedgerEntry]:
    with database.transaction() as session:
        return list(session.scalars(select(LedgerEntry).order_by(LedgerEntry.period_start_ms)))


def test_ticks_bill_memory_times_time_contiguously_and_a_repeated_tick_bills_nothing(
    database: Database,
) -> None:
    ledger = Ledger(database, RATES)
    account_id, artifact_id = account_with_artifact(database)
    meter = open_meter(ledger, account_id, artifact_id)
    for minute in (1, 2, 3):
        ledger.bill_compute([ComputeReading(meter, T0 + minute * MINUTE, 3 * GB)])
    again = ledger.bill_compute([ComputeReading(meter, T0 + 3 * MINUTE, 3 * GB)])  # a retried tick
    stale = ledger.bill_compute([ComputeReading(meter, T0 + 2 * MINUTE, 3 * GB)])  # a late one
    assert again == stale == []
    rows = entries(database)
    assert [(e.period_start_ms, e.period_end_ms) for e in rows] == [
        (T0 + m * MINUTE, T0 + (m + 1) * MINUTE) for m in range(3)
    ]
    assert {e.tick_key for e in rows} == {f"{meter}:{T0 + m * MINUTE}" for m in range(3)}
    assert [e.amount_micro for e in rows] == [3 * MINUTE] * 3  # 3 GB × 60 s × 0.001 = 0.18 credits
    assert ledger.balances_micro([account_id]) == {account_id: 1000_000_000 - 9 * MINUTE}


def test_concurrent_ticks_of_one_meter_never_bill_a_period_twice(database: Database) -> None:
    """Two gateways (threads here) racing to bill the same meter: every millisecond is billed once."""
    ledger = Ledger(database, RATES)
    account_id, artifact_id = account_with_artifact(database)
    meter = open_meter(ledger, account_id, artifact_id)
    ends = [T0 + step * 1000 for step in range(1, 41)]

    def biller() -> None:
        for end in ends:
            ledger.bill_compute([ComputeReading(meter, end, GB)])

    threads = [threading.Thread(target=biller) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rows = entries(database)
    assert sum(e.amount_micro for e in rows) == 40_000  # 1 GB × 40 s, once
    assert all(a.period_end_ms == b.period_start_ms for a, b in itertools.pairwise(rows))


def test_minimum_billed_memory_applies_per_model_process_and_none_run_for_free(database: Database) -> None:
    ledger = Ledger(database, Rates.per_gb(Decimal("0.001"), None, Decimal(4)))
    account_id, artifact_id = account_with_artifact(database)
    meter = open_meter(ledger, account_id, artifact_id)
    ledger.bill_compute([ComputeReading(meter, T0 + 1000, GB // 10)])
    ledger.bill_compute([ComputeReading(meter, T0 + 2000, GB // 10, processes=2)])  # Ray Serve: 2 replicas
    ledger.bill_compute([ComputeReading(meter, T0 + 3000, 0, processes=0)], close=True)  # scaled to zero
    assert [(e.bytes, e.amount_micro) for e in entries(database)] == [(4 * GB, 4000), (8 * GB, 8000), (0, 0)]


def test_a_crashed_gateways_meters_are_closed_at_their_last_tick_and_never_billed_again(
    database: Database,
) -> None:
    ledger = Ledger(database, RATES)
    account_id, artifact_id = account_with_artifact(database)
    crashed = open_meter(ledger, account_id, artifact_id, owner="gw_dead")
    live = open_meter(ledger, account_id, artifact_id, deployment="dep_2", owner="gw_live")
    ledger.bill_compute([ComputeReading(crashed, T0 + MINUTE, GB), ComputeReading(live, T0 + MINUTE, GB)])
    assert ledger.close_stale(T0 + 5 * MINUTE, stale_ms=3 * MINUTE, owner="gw_new") == 2
    assert ledger.close_stale(T0 + 5 * MINUTE, stale_ms=3 * MINUTE, owner="gw_new") == 0
    assert ledger.bill_compute([ComputeReading(crashed, T0 + 6 * MINUTE, GB)]) == []
    with database.transaction() as session:
        assert session.get(Meter, crashed).ended_ms == T0 + MINUTE  # type: ignore[union-attr]


def test_a_shared_meter_is_one_for_all_gateways_billed_once_and_reopened_after_it_closed(
    database: Database,
) -> None:
    """A Ray Serve application two gateways use: each opens and ticks the same meter."""
    ledger = Ledger(database, RATES)
    account_id, artifact_id = account_with_artifact(database)
    first = open_meter(ledger, account_id, artifact_id, owner="gw_1", shared="serve:dep_1")
    second = open_meter(ledger, account_id, artifact_id, owner="gw_2", shared="serve:dep_1", now_ms=T0 + 5)
    assert first == second == shared_meter_id("serve:dep_1")
    for minute in (1, 2):  # both gateways tick every minute, a few milliseconds apart
        ledger.bill_compute([ComputeReading(first, T0 + minute * MINUTE, GB)])
        ledger.bill_compute([ComputeReading(second, T0 + minute * MINUTE + 7, GB)])
    ledger.bill_compute([ComputeReading(first, T0 + 3 * MINUTE, GB)], close=True)  # the deployment unloads
    assert ledger.bill_compute([ComputeReading(second, T0 + 4 * MINUTE, GB)]) == []  # closed for both
    open_meter(ledger, account_id, artifact_id, owner="gw_2", shared="serve:dep_1", now_ms=T0 + 10 * MINUTE)
    ledger.bill_compute([ComputeReading(first, T0 + 11 * MINUTE, GB)])
    rows = entries(database)
    assert sum(e.amount_micro for e in rows) == 4 * MINUTE  # 1 GB × (3 + 1) minutes: nothing twice
    assert [(e.period_start_ms, e.period_end_ms) for e in rows][-1] == (T0 + 10 * MINUTE, T0 + 11 * MINUTE)
    assert all(a.period_end_ms == b.period_start_ms for a, b in itertools.pairwise(rows[:-1]))
    with database.transaction() as session:
        assert session.scalar(select(func.count()).select_from(Meter)) == 1


def test_storage_meter_follows_the_published_version(database: Database) -> None:
    ledger = Ledger(database, RATES)
    _account_id, artifact_id = account_with_artifact(database, size=2 * GB)
    assert ledger.tick_storage(T0) == []  # opens the meter (artifact published before billing)
    assert sum(b.amount_micro for b in ledger.tick_storage(T0 + 3_600_000)) == 2 * 3600  # 2 GB-hours
    with database.transaction() as session:  # a re-upload replaces the files with a smaller version
        artifact = session.get(ModelArtifact, artifact_id)
        assert artifact is not None
        artifact.published_version, artifact.size_bytes = "up_2", GB
        session.flush()
        ledger.sync_storage_in(session, artifact_id, T0 + 3_600_000 + 1000)
    ledger.tick_storage(T0 + 2 * 3_600_000)
    with database.transaction() as session:  # the artifact is deleted
        session.delete(session.get(ModelArtifact, artifact_id))
        session.flush()
        ledger.sync_storage_in(session, artifact_id, T0 + 3 * 3_600_000)
    assert ledger.tick_storage(T0 + 4 * 3_600_000) == []
    amounts = [e.amount_micro for e in entries(database)]
    assert amounts == [7200, 2, 3599, 3600]  # 2 GB × 1 h; 2 GB × 1 s; 1 GB × (1 h − 1 s); 1 GB × 1 h
    with database.transaction() as session:
        assert session.scalars(select(Meter).where(Meter.ended_ms.is_(None))).all() == []


def test_a_file_of_the_files_api_is_billed_as_storage_until_it_is_deleted(database: Database) -> None:
    ledger = Ledger(database, RATES)
    with database.transaction() as session:
        account_id = new_id("acct")
        session.add(Account(id=account_id, name="a", credits_granted_micro=10**9))
        session.flush()
        session.add(
            UploadedFile(
                id="file_1", account_id=account_id, key_id="key_1", filename="requests.jsonl",
                purpose="batch", bytes=GB, sha256="0" * 64, blob_key="files/file_1",
            )
        )  # fmt: skip
        session.flush()
        ledger.sync_storage_in(session, "file_1", T0)  # what `Files.store` calls
    ledger.tick_storage(T0 + 3_600_000)
    usage = ledger.usage(account_id, T0, T0 + 4 * 3_600_000)  # listed under its file name
    assert usage is not None and [line.name for line in usage.by_artifact] == ["requests.jsonl"]
    with database.transaction() as session:
        session.delete(session.get(UploadedFile, "file_1"))
        session.flush()
        ledger.sync_storage_in(session, "file_1", T0 + 2 * 3_600_000)  # what `Files.delete` calls
    assert ledger.tick_storage(T0 + 3 * 3_600_000) == []
    assert [e.amount_micro for e in entries(database)] == [3600, 3600]  # 1 GB × 1 h, twice


def test_what_a_batch_holds_is_billed_as_storage_at_its_size_until_its_files_are_written(
    database: Database,
) -> None:
    """A batch's input copy and answers (`stored_bytes`) grow as answers are recorded: each tick bills
    the period at the size it had, then takes the new size; once its files are written it holds
    nothing and its meter closes."""
    ledger = Ledger(database, RATES)
    with database.transaction() as session:
        account_id = new_id("acct")
        session.add(Account(id=account_id, name="a", credits_granted_micro=10**9))
        session.flush()
        session.add(
            Batch(
                id="batch_1", account_id=account_id, key_id="key_1", endpoint="/v1/embeddings",
                input_file_id="file_1", input_key="batches/batch_1/input.jsonl", completion_window="24h",
                status="in_progress", stored_bytes=GB, expires_at=utcnow(),
            )
        )  # fmt: skip
        session.flush()
        ledger.sync_storage_in(session, "batch_1", T0)  # what `Batches.create` calls
    ledger.tick_storage(T0 + 3_600_000)
    with database.transaction() as session:  # answers recorded: it holds 2 GB now
        batch = session.get(Batch, "batch_1")
        assert batch is not None
        batch.stored_bytes = 2 * GB
    ledger.tick_storage(T0 + 2 * 3_600_000)  # the past hour at 1 GB, then 2 GB
    ledger.tick_storage(T0 + 3 * 3_600_000)
    usage = ledger.usage(account_id, T0, T0 + 4 * 3_600_000)
    assert usage is not None and [line.name for line in usage.by_artifact] == ["batch input and answers"]
    with database.transaction() as session:  # its files are written, its answers deleted
        batch = session.get(Batch, "batch_1")
        assert batch is not None
        batch.stored_bytes = 0
        session.flush()
        ledger.sync_storage_in(session, "batch_1", T0 + 4 * 3_600_000)  # what `Batches.finalize` calls
    assert ledger.tick_storage(T0 + 5 * 3_600_000) == []
    assert [e.amount_micro for e in entries(database)] == [3600, 3600, 7200, 7200]


HOUR = 3_600_000
# 1 micro-credit per byte-second: what a few bytes of JSON hold shows in whole micro-credits
PER_BYTE = Rates(compute=Fraction(0), storage=Fraction(1, 1000), min_memory_bytes=0)


class MovedClock:
    """The time `storage_changed` bills up to, moved by the test (as `Services.build` wires the ledger)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger, self.now_ms = ledger, T0

    def storage_changed(self, session: Session, held_id: str) -> None:
        self.ledger.sync_storage_in(session, held_id, self.now_ms)


def new_account_id(database: Database) -> str:
    with database.transaction() as session:
        account_id = new_id("acct")
        session.add(Account(id=account_id, name="a", credits_granted_micro=10**9))
        return account_id


def open_storage(database: Database, held_id: str) -> list[Meter]:
    with database.transaction() as session:
        return list(
            session.scalars(select(Meter).where(Meter.artifact_id == held_id, Meter.ended_ms.is_(None)))
        )


def test_an_eval_runs_items_and_results_are_billed_as_storage_until_it_is_deleted(database: Database) -> None:
    """A run holds its copy of its items from its creation, and each output item as it is recorded (their
    JSON's size): each tick bills the period at the size it had; deleting the run closes its meter."""
    ledger = Ledger(database, PER_BYTE)
    clock = MovedClock(ledger)
    store = EvalStore(database, clock.storage_changed)
    owner = Owner(new_account_id(database), "key_1")
    criterion = {"type": "string_check", "name": "s", "input": "{{sample.output_text}}", "reference": "x",
                 "operation": "eq"}  # fmt: skip
    made = store.create(
        owner, "e", checked_config({"type": "custom", "item_schema": {}}), graders.checked([criterion]), None
    )
    items = [{"item": {"q": "x" * 100}, "sample": {"output_text": "x"}}]
    run = store.create_run(
        owner, made["id"], None, {"type": "jsonl", "source": {"type": "file_content"}}, items, None, None
    )
    copy = len(orjson.dumps(items))
    assert [m.bytes for m in open_storage(database, run["id"])] == [copy]
    ledger.tick_storage(T0 + HOUR)
    claimed = store.claim("runner", 30, 1)
    assert claimed is not None and claimed.id == run["id"]
    graded = graders.grade(claimed.testing_criteria[0], items[0]["item"], items[0]["sample"])
    result = ItemResult(0, "pass", items[0]["item"], [graded], items[0]["sample"], {})
    assert store.record(run["id"], "runner", [result])
    output = len(orjson.dumps({"item": result.item, "results": result.results, "sample": result.sample}))
    ledger.tick_storage(T0 + 2 * HOUR)  # the past hour at the items' copy, then with the output item
    ledger.tick_storage(T0 + 3 * HOUR)
    usage = ledger.usage(owner.account_id, T0, T0 + 4 * HOUR)
    assert usage is not None
    assert [(line.key, line.name) for line in usage.by_artifact] == [
        (run["id"], "eval run items and results")
    ]
    assert usage.storage_micro == 3600 * (copy + copy + copy + output)
    clock.now_ms = T0 + 4 * HOUR
    store.delete_run(owner, made["id"], run["id"])
    assert open_storage(database, run["id"]) == [] and ledger.tick_storage(T0 + 5 * HOUR) == []
    assert [e.amount_micro for e in entries(database)] == [3600 * copy, 3600 * copy] + [
        3600 * (copy + output)
    ] * 2


def test_deleting_an_eval_closes_the_storage_meters_of_its_runs(database: Database) -> None:
    ledger = Ledger(database, PER_BYTE)
    clock = MovedClock(ledger)
    store = EvalStore(database, clock.storage_changed)
    owner = Owner(new_account_id(database), "key_1")
    criterion = {"type": "string_check", "name": "s", "input": "a", "reference": "a", "operation": "eq"}
    made = store.create(
        owner, "e", checked_config({"type": "custom", "item_schema": {}}), graders.checked([criterion]), None
    )
    source = {"type": "jsonl", "source": {"type": "file_content"}}
    runs = [
        store.create_run(owner, made["id"], None, source, [{"item": {}}], None, None)["id"] for _ in range(2)
    ]
    assert all(open_storage(database, run_id) for run_id in runs)
    clock.now_ms = T0 + HOUR
    store.delete(owner, made["id"])
    assert [open_storage(database, run_id) for run_id in runs] == [[], []]
    assert [e.amount_micro for e in entries(database)] == [3600 * len(b'[{"item":{}}]')] * 2


def test_a_fine_tuning_jobs_checkpoints_are_billed_from_each_one_until_they_are_forgotten_once_it_ended(
    database: Database,
) -> None:
    """Each checkpoint adds its bytes from when it is recorded; an ended job's checkpoints are found by
    the runner's sweep, which deletes their files and then forgets them: the meter closes, the rows stay
    (listed, without a blob key). A job still running or paused keeps them (it resumes from them)."""
    ledger = Ledger(database, PER_BYTE)
    clock = MovedClock(ledger)
    jobs = FineTuningJobs(database, 3, clock.storage_changed)
    owner = Owner(new_account_id(database), "key_1")
    new = NewJob("dep_x", "base", "file_a", None, "k", None, resolve({}, 4), 8, None, 1, None, False)
    job_id = jobs.create(owner, new)["id"]
    assert jobs.claim("runner") is not None
    assert jobs.add_checkpoint(job_id, "runner", 2, {}, f"fine-tuning/{job_id}/step-2", 1000)
    clock.now_ms = T0 + HOUR
    assert jobs.add_checkpoint(job_id, "runner", 4, {}, f"fine-tuning/{job_id}/step-4", 500)
    assert not jobs.add_checkpoint(job_id, "other", 6, {}, f"fine-tuning/{job_id}/step-6", 9)  # not its claim
    assert jobs.ended_checkpoints() == []  # running: it may resume from them
    ledger.tick_storage(T0 + 2 * HOUR)
    usage = ledger.usage(owner.account_id, T0, T0 + 3 * HOUR)
    assert usage is not None
    assert [(line.key, line.name) for line in usage.by_artifact] == [(job_id, "fine-tuning checkpoints")]
    assert usage.storage_micro == 3600 * (1000 + 1500)
    assert jobs.fail(job_id, "runner", "training_error", "it broke")
    assert jobs.ended_checkpoints() == [job_id]
    clock.now_ms = T0 + 3 * HOUR
    jobs.forget_checkpoints(job_id)  # after the sweep deleted their files
    assert open_storage(database, job_id) == [] and jobs.ended_checkpoints() == []
    assert [e.amount_micro for e in entries(database)] == [3600 * 1000, 3600 * 1500, 3600 * 1500]
    listed, _ = jobs.checkpoints(owner, job_id, None, 10)
    assert [c["step_number"] for c in listed] == [4, 2]
    with database.transaction() as session:
        kept = session.scalars(
            select(FineTuningCheckpoint.blob_key).where(FineTuningCheckpoint.job_id == job_id)
        )
        assert set(kept) == {""}


def test_storage_is_not_metered_when_switched_off(database: Database) -> None:
    ledger = Ledger(database, Rates.per_gb(Decimal("0.001"), None, Decimal(0)))
    account_with_artifact(database)
    assert ledger.tick_storage(T0) == ledger.tick_storage(T0 + 3_600_000) == []
    assert entries(database) == []


def test_usage_breaks_credits_down_by_deployment_artifact_and_day_within_the_range(
    database: Database,
) -> None:
    ledger = Ledger(database, RATES)
    account_id, artifact_id = account_with_artifact(database, size=GB)
    other_account, other_artifact = account_with_artifact(database)
    day = 86_400_000
    first = open_meter(ledger, account_id, artifact_id, deployment="dep_a")
    second = open_meter(ledger, account_id, artifact_id, deployment="dep_b")
    theirs = open_meter(ledger, other_account, other_artifact)
    ledger.tick_storage(T0)
    ledger.bill_compute([ComputeReading(m, T0 + 1000, GB) for m in (first, second, theirs)])
    ledger.bill_compute([ComputeReading(first, T0 + day + 2000, GB)])  # ends on the next day
    ledger.tick_storage(T0 + day + 2000)

    whole = ledger.usage(account_id, T0, T0 + 2 * day)
    assert whole is not None and ledger.usage("acct_missing", T0, T0 + day) is None
    compute = 1000 + 1000 + (day + 1000)
    storage = (day + 2000) // 1000  # 1 GB × seconds × 1 micro per GB-second
    assert (whole.compute_micro, whole.storage_micro) == (compute, storage)
    assert whole.spent_micro == compute + storage
    assert [(line.key, line.name, line.compute_micro) for line in whole.by_deployment] == [
        ("dep_a", "m", 1000 + day + 1000),
        ("dep_b", "m", 1000),
    ]
    assert [(line.key, line.name, line.compute_micro, line.storage_micro) for line in whole.by_artifact] == [
        (artifact_id, "weights", compute, storage)
    ]
    assert [(line.key, line.compute_micro, line.storage_micro) for line in whole.by_day] == [
        (day_of(T0), 2000, 0),
        (day_of(T0 + day), day + 1000, storage),
    ]
    first_day = ledger.usage(account_id, T0, T0 + day)
    assert first_day is not None
    assert (first_day.compute_micro, first_day.storage_micro, len(first_day.by_day)) == (2000, 0, 1)
    assert first_day.spent_micro == whole.spent_micro  # the balance is all time, whatever the range
    with database.transaction() as session:
        kinds = set(session.scalars(select(LedgerEntry.kind).where(LedgerEntry.account_id == account_id)))
    assert kinds == {COMPUTE, "storage"}
