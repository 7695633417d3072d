"""A gated rollout as its deployment's row keeps it (`Deployment.rollout`), and the transactions that move
it: started by a PATCH, claimed by one server's gate runner, each decision written with its audit row
and its switch of traffic in one transaction (docs/deploy.md, "Gated rollouts"; the rule is
`services.gates`, the runner `services.gate_runner`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, or_, select, update
from sqlalchemy.orm import Session

from modelhost import audit
from modelhost.cache import TTLCache
from modelhost.errors import Conflict, InvalidRequest
from modelhost.routing import DeploymentRef
from modelhost.services import gates
from modelhost.services.gates import Gate
from modelhost.store.db import Database
from modelhost.store.models import Deployment, VersionFigures
from modelhost.store.types import new_id, utcnow

ACTIONS = {
    "started": "deployment.rollout_gate_started",
    "gate_passed": "deployment.rollout_gate_passed",
    "promoted_step": "deployment.rollout_promoted_step",
    "promoted": "deployment.rollout_promoted",
    "rolled_back": "deployment.rollout_rolled_back",
    "canceled": "deployment.rollout_gate_canceled",
}
MAX_DECISIONS = 50


def running(deployment: Deployment) -> bool:
    return bool(deployment.rollout) and deployment.rollout["state"] in gates.ACTIVE  # type: ignore[index]


def kept(deployment: Deployment) -> tuple[str, ...]:
    """The candidate of a gate still deciding: it stays loaded at 0 % (`rollouts.settle`)."""
    return (deployment.rollout["candidate"],) if running(deployment) else ()  # type: ignore[index]


def check_start(candidate: str, current: str, loaded: bool) -> None:
    if candidate == current:
        raise InvalidRequest(
            f"The deployment already serves artifact {candidate}: a gated rollout needs another one.",
            param="artifact_id",
        )
    if not loaded:
        raise Conflict(
            "A gated rollout compares the candidate with the version serving: load the deployment first "
            "(a request, or readiness warm or hot).",
            param="gate",
            code="deployment_not_loaded",
        )


def decision(step: int | None, decision: str, reason: str, **figures: Any) -> dict[str, Any]:
    return {
        "at": utcnow().strftime("%Y-%m-%dT%H:%M:%SZ"),
        "step": step,
        "decision": decision,
        "reason": reason,
        **figures,
    }


def _record(session: Session, deployment: Deployment, entry: dict[str, Any], **extra: Any) -> None:
    rollout = dict(deployment.rollout or {})
    rollout["decisions"] = [*rollout.get("decisions", []), entry][-MAX_DECISIONS:]
    deployment.rollout = {**rollout, **extra}
    changes: audit.Changes = {
        "decision": {"before": None, "after": entry["decision"]},
        "reason": {"before": None, "after": entry["reason"]},
    }
    for name in ("scores", "metrics", "traffic", "eval_runs"):
        if name in entry:
            changes[name] = {"before": None, "after": entry[name]}
    action = ACTIONS[entry["decision"]]
    audit.record(session, action, "deployment", deployment.id, deployment.account_id, changes)


def start(session: Session, deployment: Deployment, gate: Gate, candidate: str, now: str) -> None:
    """The gate starts `evaluating` (the candidate loading at 0 %), for any server's runner to claim."""
    actor = audit.current_actor()
    deployment.rollout = {
        "id": new_id("gate"),
        "gate": gate.stored(),
        "candidate": candidate,
        "current": deployment.artifact_id,
        "key_id": actor.key_id,
        "state": "evaluating",
        "step": None,
        "started_at": now,
        "ended_at": None,
        "eval_runs": {},
        "decisions": [],
    }
    deployment.rollout_claimed_by = deployment.rollout_beat_at = None
    reason = f"Evaluating {candidate} against {deployment.artifact_id} on eval {gate.eval_id}."
    _record(session, deployment, decision(None, "started", reason))


def _forget_figures(session: Session, deployment_id: str) -> None:
    """The servers' figures of a gate that ended: no longer read."""
    session.execute(delete(VersionFigures).where(VersionFigures.deployment_id == deployment_id))


def end(session: Session, deployment: Deployment, now: str, state: str, reason: str) -> None:
    """A gate still deciding ends (`canceled` by a new rollout): no traffic moves here."""
    step = (deployment.rollout or {}).get("step")
    _forget_figures(session, deployment.id)
    _record(session, deployment, decision(step, state, reason), state=state, ended_at=now)


def shown(rollout: dict[str, Any] | None) -> dict[str, Any] | None:
    """The rollout as the deployment object shows it (what the runner keeps for itself left out)."""
    if not rollout:
        return None
    return {k: v for k, v in rollout.items() if k not in ("baseline", "key_id", "id")}


@dataclass(frozen=True, slots=True)
class ClaimedGate:
    id: str  # the deployment's
    gate_id: str


class RolloutGates:
    """The gate runner's transactions on the deployments' rows."""

    def __init__(self, database: Database, refs_cache: TTLCache[list[DeploymentRef]]) -> None:
        self._database = database
        self._refs_cache = refs_cache

    def claim(self, runner: str, stale_seconds: float) -> ClaimedGate | None:
        """A deployment whose gate is deciding and which no live runner drives (a guarded UPDATE)."""
        stale = utcnow() - timedelta(seconds=stale_seconds)
        with self._database.transaction() as session:
            rows = session.scalars(
                select(Deployment).where(
                    Deployment.rollout.is_not(None),
                    or_(Deployment.rollout_claimed_by.is_(None), Deployment.rollout_beat_at < stale),
                )
            ).all()
            for row in rows:
                if not running(row):
                    continue
                taken = session.execute(
                    update(Deployment)
                    .where(
                        Deployment.id == row.id,
                        Deployment.rollout_claimed_by.is_not_distinct_from(row.rollout_claimed_by),
                        Deployment.rollout_beat_at.is_not_distinct_from(row.rollout_beat_at),
                    )
                    .values(
                        rollout_claimed_by=runner, rollout_beat_at=utcnow(), updated_at=Deployment.updated_at
                    )
                    .execution_options(synchronize_session=False)
                )
                if taken.rowcount == 1:  # type: ignore[attr-defined]
                    return ClaimedGate(row.id, row.rollout["id"])  # type: ignore[index]
        return None

    def beat(self, claimed: ClaimedGate, runner: str) -> bool:
        """Still ours, and the same gate still deciding (a cancel, a new gate or a deletion: False)."""
        with self._database.transaction() as session:
            row = session.get(Deployment, claimed.id, with_for_update=True)
            if row is None or row.rollout_claimed_by != runner or not running(row):
                return False
            if row.rollout["id"] != claimed.gate_id:  # type: ignore[index]
                return False
            session.execute(
                update(Deployment)
                .where(Deployment.id == row.id)
                .values(rollout_beat_at=utcnow(), updated_at=Deployment.updated_at)
                .execution_options(synchronize_session=False)
            )
            return True

    def release(self, deployment_id: str, runner: str) -> None:
        with self._database.transaction() as session:
            session.execute(
                update(Deployment)
                .where(Deployment.id == deployment_id, Deployment.rollout_claimed_by == runner)
                .values(rollout_claimed_by=None, rollout_beat_at=None, updated_at=Deployment.updated_at)
                .execution_options(synchronize_session=False)
            )

    def read(self, claimed: ClaimedGate) -> tuple[dict[str, Any], dict[str, str], str] | None:
        """The gate's rollout, its versions' states (artifact → state, with the reason of a failed one
        after a colon) and the deployment's model; None once it stopped deciding."""
        with self._database.transaction() as session:
            row = session.get(Deployment, claimed.id)
            if row is None or not running(row) or row.rollout["id"] != claimed.gate_id:  # type: ignore[index]
                return None
            states = {
                v["artifact_id"]: v["state"] + (f": {v['reason']}" if v.get("reason") else "")
                for v in row.versions or []
            }
            return dict(row.rollout or {}), states, row.model

    def decide(
        self,
        claimed: ClaimedGate,
        runner: str,
        decision: dict[str, Any],
        traffic: dict[str, int] | None = None,
        **rollout: Any,
    ) -> bool:
        """One decision, in one transaction: its traffic switched (`deployments.switch`), the rollout's
        fields given updated, the decision appended and its audit row written. False (nothing done): the
        gate is no longer this runner's, or no longer deciding."""
        from modelhost.services.deployments import switch  # its service imports this module

        with self._database.transaction() as session:
            row = session.get(Deployment, claimed.id, with_for_update=True)
            if row is None or row.rollout_claimed_by != runner or not running(row):
                return False
            if row.rollout["id"] != claimed.gate_id:  # type: ignore[index]
                return False
            if traffic is not None:
                decision = {**decision, "traffic": traffic}
                state = rollout.get("state", row.rollout["state"])  # type: ignore[index]
                keep = (row.rollout["candidate"],) if state in gates.ACTIVE else ()  # type: ignore[index]
                switch(session, row, traffic, decision["at"], loaded=True, keep=keep, record=False)
            if rollout.get("state") in ("promoted", "rolled_back"):
                rollout["ended_at"] = decision["at"]
                _forget_figures(session, row.id)
            _record(session, row, decision, **rollout)
        self._refs_cache.clear()
        return True

    # ------------------------------------------------------------ every server's figures of a candidate

    def promoting(self) -> list[tuple[str, str]]:
        """The deployments whose gate is judging its candidate's live traffic, and that candidate: each
        server publishes its own figures of it (`publish`), whichever server drives the gate."""
        with self._database.transaction() as session:
            gated = select(Deployment.id, Deployment.rollout).where(Deployment.rollout.is_not(None))
            rows = session.execute(gated)
            return [(d, r["candidate"]) for d, r in rows if r and r.get("state") == "promoting"]

    def publish(self, server: str, deployment_id: str, artifact_id: str, figures: dict[str, Any]) -> None:
        """This server's counts of the candidate so far (`gate_runner.measure`), replacing its last."""
        with self._database.transaction() as session:
            if session.get(Deployment, deployment_id) is None:
                return
            session.merge(VersionFigures(deployment_id=deployment_id, artifact_id=artifact_id, server=server,
                                         figures=figures, updated_at=utcnow()))  # fmt: skip

    def figures(self, deployment_id: str, artifact_id: str) -> dict[str, dict[str, Any]]:
        """Every server's last published counts of the candidate, by server."""
        with self._database.transaction() as session:
            rows = session.scalars(
                select(VersionFigures).where(
                    VersionFigures.deployment_id == deployment_id, VersionFigures.artifact_id == artifact_id
                )
            )
            return {row.server: dict(row.figures) for row in rows}
