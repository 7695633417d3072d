"""The credit ledger and its meters, in the database.

A meter is something that costs credits while it exists: a loaded replica (`compute`: its measured
memory × the time from load start to unload) or stored data (`storage`: size × time): an artifact's
published files, a Files API file, or what a batch, an eval run or a fine-tuning job holds (`HOLDERS`).
A tick bills a meter's `[billed_until, now]`: in one transaction, a guarded UPDATE moves
`billed_until` (only if nobody moved it first) and an entry keyed `{meter}:{period start}` is
appended. So a crash loses at most the time since the last tick, and a repeated or concurrent tick
bills nothing twice. The balance is the grant minus the sum of the ledger, nothing cached in rows.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fractions import Fraction

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from modelhost.billing.rates import Rates, carry_text, charge
from modelhost.store.db import Database
from modelhost.store.models import (
    Account,
    Batch,
    EvalRun,
    FineTuningJob,
    LedgerEntry,
    Meter,
    ModelArtifact,
    UploadedFile,
)
from modelhost.store.types import new_id

COMPUTE = "compute"
STORAGE = "storage"
# The owner of a shared compute meter (a Ray Serve application): every gateway using it ticks it.
SHARED = "shared"


@dataclass(frozen=True, slots=True)
class Billed:
    """What one tick of one meter appended to the ledger."""

    account_id: str
    kind: str
    amount_micro: int


@dataclass(frozen=True, slots=True)
class ComputeReading:
    """A compute meter to bill up to `until_ms`, with the memory measured now (None: not measurable,
    e.g. the process is gone; the last measurement is used)."""

    meter_id: str
    until_ms: int
    measured_bytes: int | None = None
    processes: int = 1  # model processes behind the replica (the minimum billed memory is per process)


@dataclass(slots=True)
class UsageLine:
    """Credits of one deployment, artifact or day, in micro-credits."""

    key: str
    name: str | None = None
    compute_micro: int = 0
    storage_micro: int = 0


@dataclass(slots=True)
class Usage:
    granted_micro: int
    spent_micro: int  # all time: the balance is granted − spent
    compute_micro: int = 0  # within the range
    storage_micro: int = 0
    by_deployment: list[UsageLine] = field(default_factory=list)
    by_artifact: list[UsageLine] = field(default_factory=list)
    by_day: list[UsageLine] = field(default_factory=list)


def day_of(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).date().isoformat()


def storage_meter_id(artifact_id: str, version: str) -> str:
    """One storage meter per published version, with an ID every gateway derives alike: two gateways
    that notice the same new version at once cannot both open a meter for it."""
    return "mst_" + hashlib.sha256(f"{artifact_id}:{version}".encode()).hexdigest()[:32]


Holder = type[Batch] | type[EvalRun] | type[FineTuningJob]
# What else holds data for an account, each row saying how many bytes it holds now (`stored_bytes`, which
# grows as it records more): (its table, its meter's one version, the name of its usage line). A batch
# its input copy and answers until its files are written; an eval run its copy of its items and its
# output items until it is deleted; a fine-tuning job its checkpoints until it ends.
HOLDERS: tuple[tuple[Holder, str, str], ...] = (
    (Batch, "batch", "batch input and answers"),
    (EvalRun, "eval_run", "eval run items and results"),
    (FineTuningJob, "checkpoints", "fine-tuning checkpoints"),
)


def _stored(session: Session, stored_id: str) -> tuple[str, int, str] | None:
    """(account, bytes, version) of what a storage meter bills: an artifact's published version, a
    file of the Files API (one version), or what a batch, an eval run or a fine-tuning job holds (one
    version whose size changes as it records more: `HOLDERS`); None once it is gone."""
    artifact = session.get(ModelArtifact, stored_id)
    if artifact is not None:
        if artifact.published_version is None:
            return None
        return artifact.account_id, artifact.size_bytes, artifact.published_version
    file = session.get(UploadedFile, stored_id)
    if file is not None:
        return file.account_id, file.bytes, "file"
    for holder, version, _ in HOLDERS:
        held = session.execute(
            select(holder.account_id, holder.stored_bytes).where(holder.id == stored_id)
        ).first()
        if held is not None:
            return (held.account_id, held.stored_bytes, version) if held.stored_bytes else None
    return None


def shared_meter_id(key: str) -> str:
    """The compute meter of something several gateways use (a Ray Serve application), with an ID each
    derives alike: whichever gateway ticks first bills a period, the others find it billed."""
    return "msh_" + hashlib.sha256(key.encode()).hexdigest()[:32]


class Ledger:
    def __init__(self, database: Database, rates: Rates) -> None:
        self._database = database
        self.rates = rates

    # ---------------------------------------------------------------- compute meters

    def open_compute(
        self,
        *,
        owner: str,
        account_id: str,
        deployment_id: str,
        model: str,
        artifact_id: str,
        now_ms: int,
        shared: str | None = None,
    ) -> str:
        """A replica starts loading: it costs from now on. A `shared` replica's meter is opened once
        for all gateways (reopened after it was closed), and billed by whichever ticks first."""
        fields = {
            "account_id": account_id,
            "deployment_id": deployment_id,
            "model": model,
            "artifact_id": artifact_id,
        }
        if shared is not None:
            return self._open_shared(shared_meter_id(shared), fields, now_ms)
        with self._database.transaction() as session:
            meter = _compute_meter(new_id("mtr"), owner, fields, now_ms)
            session.add(meter)
            return meter.id

    def _open_shared(self, meter_id: str, fields: dict[str, str], now_ms: int) -> str:
        # IntegrityError: another gateway inserted it at the same moment.
        with contextlib.suppress(IntegrityError), self._database.transaction() as session:
            meter = session.get(Meter, meter_id)
            if meter is None:
                session.add(_compute_meter(meter_id, SHARED, fields, now_ms))
            elif meter.ended_ms is not None:  # closed since: it costs again from now
                session.execute(
                    update(Meter)
                    .where(Meter.id == meter_id, Meter.ended_ms.is_not(None))
                    .values(ended_ms=None, started_ms=now_ms, billed_until_ms=now_ms, carry="0", bytes=0)
                )
        return meter_id

    def bill_compute(self, readings: Iterable[ComputeReading], close: bool = False) -> list[Billed]:
        """One tick of this gateway's replicas (or the last one of a replica, with `close`)."""
        billed: list[Billed] = []
        with self._database.transaction() as session:
            for reading in readings:
                meter = session.get(Meter, reading.meter_id)
                if meter is None or meter.ended_ms is not None:
                    continue
                entry = self._bill_in(
                    session, meter, reading.until_ms, reading.measured_bytes, close, reading.processes
                )
                if entry is not None:
                    billed.append(entry)
        return billed

    def close_stale(self, now_ms: int, stale_ms: int, owner: str) -> int:
        """Close compute meters that their gateway stopped ticking (it crashed): nothing more is billed
        for them; the time since their last tick is the loss a crash may cost."""
        with self._database.transaction() as session:
            result = session.execute(
                update(Meter)
                .where(
                    Meter.kind == COMPUTE,
                    Meter.ended_ms.is_(None),
                    Meter.owner != owner,
                    Meter.billed_until_ms < now_ms - stale_ms,
                )
                .values(ended_ms=Meter.billed_until_ms)
            )
            return int(result.rowcount)  # type: ignore[attr-defined]

    # ---------------------------------------------------------------- storage meters

    def sync_storage_in(self, session: Session, artifact_id: str, now_ms: int) -> list[Billed]:
        """Make the storage meter of an artifact (or of a file of the Files API, by its ID) match what is
        stored: bill and close the meter of a version that is gone (deleted, replaced), open one for
        the version now stored."""
        if self.rates.storage is None:
            return []
        stored = _stored(session, artifact_id)
        wanted = storage_meter_id(artifact_id, stored[2]) if stored is not None else None
        billed: list[Billed] = []
        open_meters = session.scalars(
            select(Meter).where(
                Meter.kind == STORAGE, Meter.artifact_id == artifact_id, Meter.ended_ms.is_(None)
            )
        ).all()
        for meter in open_meters:
            kept = stored is not None and meter.id == wanted  # billed so far at its size, then resized
            entry = self._bill_in(
                session, meter, now_ms, stored[1] if kept and stored else None, close=not kept
            )
            if entry is not None:
                billed.append(entry)
        if stored is not None and wanted is not None and session.get(Meter, wanted) is None:
            session.add(
                Meter(
                    id=wanted,
                    kind=STORAGE,
                    account_id=stored[0],
                    artifact_id=artifact_id,
                    bytes=stored[1],
                    started_ms=now_ms,
                    billed_until_ms=now_ms,
                    carry="0",
                )
            )
        return billed

    def tick_storage(self, now_ms: int) -> list[Billed]:
        """Bill every stored artifact and file up to now (and open meters for those stored before
        billing existed). One transaction per artifact: one conflict does not hold up the others."""
        if self.rates.storage is None:
            return []
        with self._database.transaction() as session:
            stored = set(
                session.scalars(select(ModelArtifact.id).where(ModelArtifact.published_version.is_not(None)))
            )
            stored |= set(session.scalars(select(UploadedFile.id)))
            for holder, _, _ in HOLDERS:
                stored |= set(session.scalars(select(holder.id).where(holder.stored_bytes > 0)))
            metered = set(
                session.scalars(
                    select(Meter.artifact_id).where(Meter.kind == STORAGE, Meter.ended_ms.is_(None))
                )
            )
        billed: list[Billed] = []
        for artifact_id in sorted(stored | metered):
            with self._database.transaction() as session:
                billed.extend(self.sync_storage_in(session, artifact_id, now_ms))
        return billed

    # ---------------------------------------------------------------- the tick itself

    def _bill_in(
        self,
        session: Session,
        meter: Meter,
        until_ms: int,
        measured_bytes: int | None,
        close: bool,
        processes: int = 1,
    ) -> Billed | None:
        start = meter.billed_until_ms
        until = max(until_ms, start)
        if meter.kind == COMPUTE:
            measured = meter.bytes if measured_bytes is None else measured_bytes
            billed_bytes, rate = self.rates.billed_memory(measured, processes), self.rates.compute
        else:  # the period is billed at the size stored through it; a batch's size may change after
            billed_bytes = meter.bytes
            measured = meter.bytes if measured_bytes is None else measured_bytes
            rate = self.rates.storage or Fraction(0)
        amount, carry = charge(billed_bytes, until - start, rate, Fraction(meter.carry))
        moved = session.execute(
            update(Meter)
            .where(Meter.id == meter.id, Meter.billed_until_ms == start, Meter.ended_ms.is_(None))
            .values(
                billed_until_ms=until,
                carry=carry_text(carry),
                bytes=measured,
                ended_ms=until if close else None,
            )
        )
        if moved.rowcount != 1 or until == start:  # type: ignore[attr-defined]
            return None  # someone else billed this period first, or there was nothing to bill
        session.add(
            LedgerEntry(
                tick_key=f"{meter.id}:{start}",
                meter_id=meter.id,
                account_id=meter.account_id,
                kind=meter.kind,
                deployment_id=meter.deployment_id,
                model=meter.model,
                artifact_id=meter.artifact_id,
                bytes=billed_bytes,
                period_start_ms=start,
                period_end_ms=until,
                day=day_of(until),
                amount_micro=amount,
            )
        )
        return Billed(meter.account_id, meter.kind, amount)

    # ---------------------------------------------------------------- reading

    def balances_micro(self, account_ids: Iterable[str]) -> dict[str, int]:
        """Granted − spent, per account (accounts that do not exist are left out)."""
        ids = sorted(set(account_ids))
        if not ids:
            return {}
        with self._database.transaction() as session:
            totals = _granted_and_spent_in(session, ids)
        return {account: granted - spent for account, (granted, spent) in totals.items()}

    def spent_since_micro(self, account_id: str, since_ms: int) -> int:
        """Credits billed to the account for periods ending after `since_ms` (a spend cap's day or
        month; a tick that straddles its start counts whole)."""
        with self._database.transaction() as session:
            total = session.scalar(
                select(func.coalesce(func.sum(LedgerEntry.amount_micro), 0)).where(
                    LedgerEntry.account_id == account_id, LedgerEntry.period_end_ms > since_ms
                )
            )
        return int(total or 0)

    def usage(self, account_id: str, start_ms: int, end_ms: int) -> Usage | None:
        """Credits in `[start, end)` (by the end of each tick's period), with three breakdowns, and the
        balance read in the same transaction; None when the account does not exist."""
        with self._database.transaction() as session:
            totals = _granted_and_spent_in(session, [account_id]).get(account_id)
            if totals is None:
                return None
            rows = session.execute(
                select(
                    LedgerEntry.kind,
                    LedgerEntry.deployment_id,
                    LedgerEntry.model,
                    LedgerEntry.artifact_id,
                    LedgerEntry.day,
                    func.sum(LedgerEntry.amount_micro),
                )
                .where(
                    LedgerEntry.account_id == account_id,
                    LedgerEntry.period_end_ms >= start_ms,
                    LedgerEntry.period_end_ms < end_ms,
                )
                .group_by(
                    LedgerEntry.kind,
                    LedgerEntry.deployment_id,
                    LedgerEntry.model,
                    LedgerEntry.artifact_id,
                    LedgerEntry.day,
                )
            ).all()
            artifact_ids = {row[3] for row in rows}
            names = dict(
                session.execute(
                    select(ModelArtifact.id, ModelArtifact.display_name).where(
                        ModelArtifact.id.in_(artifact_ids)
                    )
                ).all()
            )
            # a file of the Files API is billed as stored data too, under its file name
            names.update(
                session.execute(
                    select(UploadedFile.id, UploadedFile.filename).where(UploadedFile.id.in_(artifact_ids))
                ).all()
            )
            for holder, _, label in HOLDERS:  # and what a batch, an eval run or a fine-tuning job holds
                names.update(
                    (held, label)
                    for held in session.scalars(select(holder.id).where(holder.id.in_(artifact_ids)))
                )
        usage = Usage(granted_micro=totals[0], spent_micro=totals[1])
        deployments: dict[str, UsageLine] = {}
        artifacts: dict[str, UsageLine] = {}
        days: dict[str, UsageLine] = {}
        for kind, deployment_id, model, artifact_id, day, total in rows:
            amount = int(total or 0)
            lines = [
                artifacts.setdefault(artifact_id, UsageLine(artifact_id, names.get(artifact_id))),
                days.setdefault(day, UsageLine(day)),
            ]
            if deployment_id is not None:
                line = deployments.setdefault(deployment_id, UsageLine(deployment_id, model))
                line.name = model or line.name
                lines.append(line)
            if kind == COMPUTE:
                usage.compute_micro += amount
                for line in lines:
                    line.compute_micro += amount
            else:
                usage.storage_micro += amount
                for line in lines:
                    line.storage_micro += amount
        usage.by_deployment = sorted(deployments.values(), key=lambda line: line.key)
        usage.by_artifact = sorted(artifacts.values(), key=lambda line: line.key)
        usage.by_day = sorted(days.values(), key=lambda line: line.key)
        return usage


def _compute_meter(meter_id: str, owner: str, fields: dict[str, str], now_ms: int) -> Meter:
    """A compute meter that starts costing at `now_ms`; `fields` name its account, deployment, model
    and artifact."""
    return Meter(
        id=meter_id,
        kind=COMPUTE,
        **fields,
        owner=owner,
        bytes=0,
        started_ms=now_ms,
        billed_until_ms=now_ms,
        carry="0",
    )


def _granted_and_spent_in(session: Session, account_ids: list[str]) -> dict[str, tuple[int, int]]:
    """`(credits granted, credits spent)` in micro-credits per existing account."""
    granted = dict(
        session.execute(
            select(Account.id, Account.credits_granted_micro).where(Account.id.in_(account_ids))
        ).all()
    )
    spent = dict(
        session.execute(
            select(LedgerEntry.account_id, func.sum(LedgerEntry.amount_micro))
            .where(LedgerEntry.account_id.in_(account_ids))
            .group_by(LedgerEntry.account_id)
        ).all()
    )
    return {account: (grant, int(spent.get(account) or 0)) for account, grant in granted.items()}
