"""Evals, their runs and each run's per-item results in the database (docs/evals.md).

An eval's run is queued work, as a batch is: the `eval_runs` table is the queue, a runner claims a run
with a guarded UPDATE (`claim`), beats `updated_at` while it runs it, and a claim left silent for
`stale` seconds is taken over (a server that was killed). The result of each item is a row keyed by
(run, item): recorded once (`record` skips items already there) in the transaction that counts it, so a
run taken over after a crash runs only the items without a result and never counts one twice.

    queued ──> in_progress ──> completed
       └──────────┴──cancel──> canceled          (failed: its key was revoked before it ran)

Every eval and run created or deleted is an audit row, in the transaction that makes the change.

What a run holds (its copy of its items, and its output items as they are recorded: `stored_bytes`, their
JSON's size) is billed as storage from its creation until it is deleted, with its eval or alone
(`storage_changed`, the ledger's storage meter under the run's ID: docs/billing.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import orjson
from sqlalchemy import delete, or_, select, update
from sqlalchemy.orm import Session

from modelhost import audit
from modelhost.batches.files import Owner, StorageChanged
from modelhost.errors import Conflict, InvalidRequest, NotFound
from modelhost.evals.views import eval_view, item_view, run_view, source_of
from modelhost.store.db import Database
from modelhost.store.models import Eval, EvalRun, EvalRunItem
from modelhost.store.pages import keyset_page
from modelhost.store.turns import in_turn
from modelhost.store.types import new_id, utcnow

ACTIVE = ("queued", "in_progress")


@dataclass(frozen=True, slots=True)
class Claimed:
    """A run as its runner needs it."""

    id: str
    eval_id: str
    account_id: str
    key_id: str
    data_source: dict[str, Any]
    items: list[dict[str, Any]]
    testing_criteria: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class ItemResult:
    """What a run learned of one item: its status (pass, fail, error), its criteria's results, its
    sample, and the tokens each model used for it (model → [calls, prompt tokens, completion tokens])."""

    index: int
    status: str
    item: dict[str, Any]
    results: list[dict[str, Any]]
    sample: dict[str, Any] | None
    usage: dict[str, list[int]]


class EvalStore:
    def __init__(self, database: Database, storage_changed: StorageChanged | None = None) -> None:
        self._database = database
        self._storage_changed = storage_changed or (lambda _session, _run_id: None)

    # ---------------------------------------------------------------- evals

    def create(
        self,
        owner: Owner,
        name: str | None,
        config: dict[str, Any],
        criteria: list[dict[str, Any]],
        metadata: dict[str, str] | None,
    ) -> dict[str, Any]:
        with self._database.transaction() as session:
            row = Eval(
                id=new_id("eval"),
                account_id=owner.account_id,
                key_id=owner.key_id,
                name=name,
                data_source_config=config,
                testing_criteria=criteria,
                eval_metadata=metadata,
                created_at=utcnow(),
            )
            session.add(row)
            fields = {"name": name, "testing_criteria": [c["type"] for c in criteria]}
            audit.record(session, "eval.created", "eval", row.id, owner.account_id, audit.created(fields))
            return eval_view(row)

    def get(self, owner: Owner, eval_id: str) -> dict[str, Any]:
        with self._database.transaction() as session:
            return eval_view(self._eval(session, owner, eval_id))

    def definition(self, owner: Owner, eval_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """What a new run of the eval is checked against: its data source config and its criteria."""
        with self._database.transaction() as session:
            row = self._eval(session, owner, eval_id)
            return dict(row.data_source_config), list(row.testing_criteria)

    def update(
        self, owner: Owner, eval_id: str, name: str | None, metadata: dict[str, str] | None
    ) -> dict[str, Any]:
        """OpenAI's update: its name and metadata (what it grades stays as its runs graded it)."""
        with self._database.transaction() as session:
            row = self._eval(session, owner, eval_id)
            before = {"name": row.name, "metadata": row.eval_metadata}
            if name is not None:
                row.name = name
            if metadata is not None:
                row.eval_metadata = metadata
            changes = audit.diff(before, {"name": row.name, "metadata": row.eval_metadata})
            if changes:
                audit.record(session, "eval.updated", "eval", row.id, owner.account_id, changes)
            return eval_view(row)

    def delete(self, owner: Owner, eval_id: str) -> dict[str, Any]:
        """The eval, its runs and their results; a run under way stops at its next beat."""
        with self._database.transaction() as session:
            row = self._eval(session, owner, eval_id)
            runs = list(session.scalars(select(EvalRun.id).where(EvalRun.eval_id == eval_id)))
            session.execute(delete(EvalRunItem).where(EvalRunItem.run_id.in_(runs)))
            session.execute(delete(EvalRun).where(EvalRun.eval_id == eval_id))
            audit.record(
                session, "eval.deleted", "eval", row.id, owner.account_id, audit.removed({"name": row.name})
            )
            session.delete(row)
            session.flush()
            for run_id in runs:  # what they held is gone: their storage meters close
                self._storage_changed(session, run_id)
            return {"object": "eval.deleted", "deleted": True, "eval_id": eval_id}

    def page(
        self, owner: Owner, after: str | None, limit: int, order: str
    ) -> tuple[list[dict[str, Any]], bool]:
        with self._database.transaction() as session:
            cursor = None if after is None else self._eval(session, owner, after)
            query = select(Eval).where(*owner.filter(Eval))
            rows, more = keyset_page(session, query, Eval, cursor, limit, order)
            return [eval_view(r) for r in rows], more

    # ---------------------------------------------------------------- runs

    def create_run(
        self,
        owner: Owner,
        eval_id: str,
        name: str | None,
        data_source: dict[str, Any],
        items: list[dict[str, Any]],
        model: str | None,
        metadata: dict[str, str] | None,
    ) -> dict[str, Any]:
        with self._database.transaction() as session:
            parent = self._eval(session, owner, eval_id)
            now = utcnow()
            row = EvalRun(
                id=new_id("evalrun"),
                eval_id=eval_id,
                account_id=owner.account_id,
                key_id=owner.key_id,
                name=name or f"run of {parent.name or eval_id}"[:256],
                status="queued",
                model=model,
                data_source=data_source,
                items=items,
                run_metadata=metadata,
                passed=0,
                failed=0,
                errored=0,
                per_criteria=[
                    {"testing_criteria": c["name"], "passed": 0, "failed": 0} for c in parent.testing_criteria
                ],
                usage={},
                stored_bytes=len(orjson.dumps(items)),
                created_at=now,
                updated_at=now,
            )
            session.add(row)
            session.flush()
            self._storage_changed(session, row.id)  # its copy of the items is billed from now
            fields = {"eval_id": eval_id, "model": model, "items": len(items)}
            audit.record(
                session, "eval_run.created", "eval_run", row.id, owner.account_id, audit.created(fields)
            )
            return run_view(row)

    def get_run(self, owner: Owner, eval_id: str, run_id: str) -> dict[str, Any]:
        with self._database.transaction() as session:
            return run_view(self._run(session, owner, eval_id, run_id))

    def cancel_run(self, owner: Owner, eval_id: str, run_id: str) -> dict[str, Any]:
        """`canceled` at once: its runner stops at its next beat, the items graded so far are kept."""
        with self._database.transaction() as session:
            row = self._run(session, owner, eval_id, run_id)
            if row.status in ACTIVE:
                row.status, row.updated_at = "canceled", utcnow()
                audit.record(session, "eval_run.canceled", "eval_run", row.id, owner.account_id, {})
            elif row.status != "canceled":
                raise Conflict(f"Cannot cancel a run with status '{row.status}'.", code="run_not_cancellable")
            session.flush()
            return run_view(row)

    def delete_run(self, owner: Owner, eval_id: str, run_id: str) -> dict[str, Any]:
        with self._database.transaction() as session:
            row = self._run(session, owner, eval_id, run_id)
            session.execute(delete(EvalRunItem).where(EvalRunItem.run_id == run_id))
            audit.record(
                session,
                "eval_run.deleted",
                "eval_run",
                run_id,
                owner.account_id,
                audit.removed({"eval_id": eval_id}),
            )
            session.delete(row)
            session.flush()
            self._storage_changed(session, run_id)  # what it held is gone: its meter closes
            return {"object": "eval.run.deleted", "deleted": True, "run_id": run_id}

    def page_runs(
        self, owner: Owner, eval_id: str, after: str | None, limit: int, order: str, status: str | None
    ) -> tuple[list[dict[str, Any]], bool]:
        with self._database.transaction() as session:
            self._eval(session, owner, eval_id)
            cursor = None if after is None else self._run(session, owner, eval_id, after)
            query = select(EvalRun).where(EvalRun.eval_id == eval_id, *owner.filter(EvalRun))
            if status is not None:
                query = query.where(EvalRun.status == status)
            rows, more = keyset_page(session, query, EvalRun, cursor, limit, order)
            return [run_view(r) for r in rows], more

    def get_item(self, owner: Owner, eval_id: str, run_id: str, item_id: str) -> dict[str, Any]:
        with self._database.transaction() as session:
            run = self._run(session, owner, eval_id, run_id)
            row = session.get(EvalRunItem, item_id)
            if row is None or row.run_id != run_id:
                raise NotFound(f"No such output item: {item_id[:64]}", code="output_item_not_found")
            return item_view(row, run)

    def page_items(
        self,
        owner: Owner,
        eval_id: str,
        run_id: str,
        after: str | None,
        limit: int,
        order: str,
        status: str | None,
    ) -> tuple[list[dict[str, Any]], bool]:
        with self._database.transaction() as session:
            run = self._run(session, owner, eval_id, run_id)
            cursor = None
            if after is not None:
                cursor = session.get(EvalRunItem, after)
                if cursor is None or cursor.run_id != run_id:
                    raise NotFound(f"No such output item: {after[:64]}", code="output_item_not_found")
            query = select(EvalRunItem).where(EvalRunItem.run_id == run_id)
            if status is not None:
                query = query.where(EvalRunItem.status == status)
            rows, more = keyset_page(session, query, EvalRunItem, cursor, limit, order)
            return [item_view(r, run) for r in rows], more

    def latest_source(self, owner: Owner, eval_id: str) -> dict[str, Any]:
        """The data source of the eval's latest `completions` run (what `evaluate` runs again)."""
        with self._database.transaction() as session:
            self._eval(session, owner, eval_id)
            runs = session.scalars(
                select(EvalRun).where(EvalRun.eval_id == eval_id).order_by(EvalRun.created_at.desc())
            )
            for run in runs:
                if run.data_source.get("type") == "completions":
                    return source_of(run)
        raise InvalidRequest(
            f"Eval {eval_id} has no 'completions' run to take a data source from.", param="eval_id"
        )

    def mean_scores(self, run_id: str) -> dict[str, float | None]:
        """Each criterion's mean score over the run's items that have one."""
        sums: dict[str, list[float]] = {}
        with self._database.transaction() as session:
            for results in session.scalars(select(EvalRunItem.results).where(EvalRunItem.run_id == run_id)):
                for graded in results:
                    scores = sums.setdefault(graded["name"], [])
                    if graded.get("score") is not None:
                        scores.append(float(graded["score"]))
        return {name: (sum(s) / len(s) if s else None) for name, s in sums.items()}

    # ---------------------------------------------------------------- the runner's side

    def claim(self, runner: str, stale_seconds: float, per_account: int) -> Claimed | None:
        """A queued or running run nobody runs (or whose runner went silent), in turn between accounts."""
        stale = utcnow() - timedelta(seconds=stale_seconds)
        claimable = (
            EvalRun.status.in_(ACTIVE),
            or_(EvalRun.claimed_by.is_(None), EvalRun.updated_at < stale),
        )
        running = (EvalRun.status.in_(ACTIVE), EvalRun.claimed_by.is_not(None), EvalRun.updated_at >= stale)
        with self._database.transaction() as session:
            for row in in_turn(session, EvalRun, claimable, running, per_account):
                taken = session.execute(
                    update(EvalRun)
                    .where(
                        EvalRun.id == row.id,
                        EvalRun.updated_at == row.updated_at,
                        EvalRun.claimed_by.is_not_distinct_from(row.claimed_by),
                    )
                    .values(claimed_by=runner, updated_at=utcnow(), status="in_progress")
                    .execution_options(synchronize_session=False)
                )
                if taken.rowcount == 1:  # type: ignore[attr-defined]
                    parent = session.get(Eval, row.eval_id)
                    assert parent is not None  # deleted with it, in one transaction
                    return Claimed(
                        row.id, row.eval_id, row.account_id, row.key_id, row.data_source, row.items,
                        parent.testing_criteria,
                    )  # fmt: skip
        return None

    def beat(self, run_id: str, runner: str) -> bool:
        """Still ours and still running (a cancel or a deletion shows here as False)."""
        with self._database.transaction() as session:
            moved = session.execute(
                update(EvalRun)
                .where(EvalRun.id == run_id, EvalRun.claimed_by == runner, EvalRun.status == "in_progress")
                .values(updated_at=utcnow())
                .execution_options(synchronize_session=False)
            )
            return bool(moved.rowcount == 1)  # type: ignore[attr-defined]

    def release(self, run_id: str, runner: str) -> None:
        with self._database.transaction() as session:
            session.execute(
                update(EvalRun)
                .where(EvalRun.id == run_id, EvalRun.claimed_by == runner)
                .values(claimed_by=None)
                .execution_options(synchronize_session=False)
            )

    def done(self, run_id: str) -> set[int]:
        with self._database.transaction() as session:
            return set(session.scalars(select(EvalRunItem.item_index).where(EvalRunItem.run_id == run_id)))

    def record(self, run_id: str, runner: str, results: list[ItemResult]) -> bool:
        """Record and count results not recorded yet; False if the run is no longer this runner's, or
        no longer running (nothing is recorded then)."""
        with self._database.transaction() as session:
            row = session.get(EvalRun, run_id, with_for_update=True)
            if row is None or row.claimed_by != runner or row.status != "in_progress":
                return False
            known = set(
                session.scalars(
                    select(EvalRunItem.item_index).where(
                        EvalRunItem.run_id == run_id, EvalRunItem.item_index.in_([r.index for r in results])
                    )
                )
            )
            per_criteria = {c["testing_criteria"]: dict(c) for c in row.per_criteria}
            usage = {model: list(counts) for model, counts in row.usage.items()}
            for found in (r for r in results if r.index not in known):
                session.add(
                    EvalRunItem(
                        id=new_id("outputitem"),
                        run_id=run_id,
                        item_index=found.index,
                        status=found.status,
                        item=found.item,
                        results=found.results,
                        sample=found.sample,
                        created_at=utcnow(),
                    )
                )
                row.stored_bytes += _size(found)  # billed from the next storage tick
                row.passed += found.status == "pass"
                row.failed += found.status == "fail"
                row.errored += found.status == "error"
                for graded in found.results:
                    counts = per_criteria.get(graded["name"])
                    if counts is not None and found.status != "error":
                        counts["passed" if graded["passed"] else "failed"] += 1
                for model, (calls, prompt, completion) in found.usage.items():
                    before = usage.get(model, [0, 0, 0])
                    usage[model] = [before[0] + calls, before[1] + prompt, before[2] + completion]
            row.per_criteria = list(per_criteria.values())
            row.usage = usage
            row.updated_at = utcnow()
            return True

    def finish(self, run_id: str, runner: str, status: str, error: dict[str, Any] | None = None) -> None:
        with self._database.transaction() as session:
            session.execute(
                update(EvalRun)
                .where(EvalRun.id == run_id, EvalRun.claimed_by == runner, EvalRun.status == "in_progress")
                .values(status=status, error=error, claimed_by=None, updated_at=utcnow())
                .execution_options(synchronize_session=False)
            )

    def summary(self, run_id: str) -> dict[str, Any] | None:
        """A run's object, whoever asks (the server's own callers: `evals.service.evaluate`)."""
        with self._database.transaction() as session:
            row = session.get(EvalRun, run_id)
            return None if row is None else run_view(row)

    # ---------------------------------------------------------------- lookups

    @staticmethod
    def _eval(session: Session, owner: Owner, eval_id: str) -> Eval:
        row = session.get(Eval, eval_id)
        if row is None or not owner.sees(row.account_id, row.key_id):
            raise NotFound(f"No such eval: {eval_id[:64]}", code="eval_not_found")
        return row

    def _run(self, session: Session, owner: Owner, eval_id: str, run_id: str) -> EvalRun:
        self._eval(session, owner, eval_id)
        row = session.get(EvalRun, run_id)
        if row is None or row.eval_id != eval_id or not owner.sees(row.account_id, row.key_id):
            raise NotFound(f"No such eval run: {run_id[:64]}", code="eval_run_not_found")
        return row


def _size(found: ItemResult) -> int:
    """What an output item adds to what its run holds: its JSON's size, as it is stored."""
    return len(orjson.dumps({"item": found.item, "results": found.results, "sample": found.sample}))
