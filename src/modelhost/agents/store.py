"""Agents, their runs and the runs' events in the database; every move of a run is one guarded UPDATE.

    queued ──> in_progress ──> completed | requires_action | failed
       │            │
       └────────────┴──cancel──> cancelled        stale (gateway died): failed `interrupted`
    any state ──delete──> deleting ──(runner stopped, events erased)──> gone

An event is written only while its run is active (`queued` or `in_progress`) and held by the writing
runner: the insert, the run's `last_seq` bump and any status change are one transaction whose first
statement is that guarded UPDATE. It locks the run's row, so a delete (which first moves the run to
`deleting` with its own UPDATE) is ordered against every event write: once the delete has marked the
run, no runner anywhere can add an event, and the delete then erases the events it finds.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, select, update

from modelhost.auth.limits import Subject
from modelhost.auth.quotas import Person
from modelhost.errors import Conflict, NotFound
from modelhost.frontend import Target
from modelhost.routing import split_key
from modelhost.store.db import Database
from modelhost.store.models import Agent, AgentRun, AgentRunEvent
from modelhost.store.pages import keyset_page
from modelhost.store.types import new_id, unix_seconds, utcnow

ACTIVE = ("queued", "in_progress")
FINISHED = ("completed", "failed", "cancelled", "requires_action")
INTERRUPTED = "The run was interrupted: the server running it stopped."


@dataclass(frozen=True)
class RunJob:
    """What a runner needs to execute a run."""

    id: str
    agent_id: str
    agent_name: str
    target: Target  # the deployment it generates on, and what that adds to its requests
    model: str
    instructions: str
    tools: list[dict[str, Any]] | None
    request: dict[str, Any]
    traceparent: str  # the request that created it, which the run's span links to ("": none)
    # Whom its tokens count against (the key and account that started it, where rate-limited).
    subjects: tuple[Subject, ...] = ()
    # the person whose use they count towards too (`auth.quotas`; None: a service key)
    person: Person | None = None


class AgentStore:
    def __init__(self, database: Database) -> None:
        self._database = database

    # ---------------------------------------------------------------- agents

    def create_agent(
        self, account_id: str, name: str, model: str, instructions: str, tools: list[dict[str, Any]] | None
    ) -> dict[str, Any]:
        with self._database.transaction() as session:
            agent = Agent(
                id=new_id("agent"),
                account_id=account_id,
                name=name,
                model=model,
                instructions=instructions,
                tools=tools,
            )
            session.add(agent)
            session.flush()
            return agent_view(agent)

    def get_agent(self, account_id: str, agent_id: str) -> dict[str, Any]:
        with self._database.transaction() as session:
            return agent_view(self._agent(session, account_id, agent_id))

    def list_agents(
        self, account_id: str, after: str | None, limit: int, order: str
    ) -> tuple[list[dict[str, Any]], bool]:
        with self._database.transaction() as session:
            query = select(Agent).where(Agent.account_id == account_id)
            cursor = self._agent(session, account_id, after) if after is not None else None
            rows, more = keyset_page(session, query, Agent, cursor, limit, order)
            return [agent_view(a) for a in rows], more

    def begin_delete_agent(self, account_id: str, agent_id: str) -> list[str]:
        """Mark every run of the agent `deleting` (no more events from anywhere); the runs to stop."""
        with self._database.transaction() as session:
            self._agent(session, account_id, agent_id)
            runs = list(session.scalars(select(AgentRun.id).where(AgentRun.agent_id == agent_id)).all())
            session.execute(
                update(AgentRun)
                .where(AgentRun.agent_id == agent_id)
                .values(status="deleting", updated_at=utcnow())
            )
            return runs

    def finish_delete_agent(self, agent_id: str) -> None:
        with self._database.transaction() as session:
            runs = select(AgentRun.id).where(AgentRun.agent_id == agent_id).scalar_subquery()
            session.execute(delete(AgentRunEvent).where(AgentRunEvent.run_id.in_(runs)))
            session.execute(delete(AgentRun).where(AgentRun.agent_id == agent_id))
            session.execute(delete(Agent).where(Agent.id == agent_id))

    def _agent(self, session: Any, account_id: str, agent_id: str) -> Agent:
        agent = session.get(Agent, agent_id)
        if agent is None or agent.account_id != account_id:
            raise NotFound("Agent not found", code="agent_not_found")
        return agent  # type: ignore[no-any-return]

    # ---------------------------------------------------------------- runs: the API's side

    def create_run(
        self,
        account_id: str,
        agent_id: str,
        target: Target,
        request: dict[str, Any],
        runner: str,
        traceparent: str = "",
    ) -> tuple[dict[str, Any], RunJob]:
        """A queued run on `target` (the agent's deployment, as a chat completion would run on it) held by
        `runner` (the supervisor that starts it), with its `run.created` event. `traceparent` is the
        creating request's span (`tracing.parent()`), for the run's to link to."""
        with self._database.transaction() as session:
            agent = self._agent(session, account_id, agent_id)
            run = AgentRun(
                id=new_id("run"),
                agent_id=agent_id,
                account_id=account_id,
                deployment_id=split_key(target.runtime_key)[0],
                request=request,
                status="queued",
                claimed_by=runner,
                last_seq=1,
                traceparent=traceparent or None,
            )
            session.add(run)
            session.flush()
            session.add(AgentRunEvent(run_id=run.id, seq=1, type="run.created", data={"status": "queued"}))
            job = RunJob(
                id=run.id,
                agent_id=agent.id,
                agent_name=agent.name,
                target=target,
                model=agent.model,
                instructions=agent.instructions,
                tools=agent.tools,
                request=dict(request),
                traceparent=traceparent,
            )
            return run_view(run, agent.model), job

    def get_run(self, account_id: str, agent_id: str, run_id: str) -> dict[str, Any]:
        with self._database.transaction() as session:
            run = self._run(session, account_id, agent_id, run_id)
            return run_view(run, self._agent(session, account_id, agent_id).model)

    def list_runs(
        self, account_id: str, agent_id: str, after: str | None, limit: int, order: str
    ) -> tuple[list[dict[str, Any]], bool]:
        with self._database.transaction() as session:
            agent = self._agent(session, account_id, agent_id)
            query = select(AgentRun).where(AgentRun.agent_id == agent_id, AgentRun.status != "deleting")
            cursor = self._run(session, account_id, agent_id, after) if after is not None else None
            rows, more = keyset_page(session, query, AgentRun, cursor, limit, order)
            return [run_view(r, agent.model) for r in rows], more

    def events(
        self, account_id: str, agent_id: str, run_id: str, after_seq: int = 0
    ) -> tuple[list[dict[str, Any]], str]:
        """The run's stored events after `after_seq`, in order, and the run's status (read together)."""
        with self._database.transaction() as session:
            run = self._run(session, account_id, agent_id, run_id)
            rows = session.scalars(
                select(AgentRunEvent)
                .where(AgentRunEvent.run_id == run_id, AgentRunEvent.seq > after_seq)
                .order_by(AgentRunEvent.seq)
            ).all()
            return [event_view(e) for e in rows], run.status

    def cancel_run(self, account_id: str, agent_id: str, run_id: str) -> dict[str, Any]:
        """Stop an active run: `cancelled`, with its `run.cancelled` event (409 if it has finished)."""
        with self._database.transaction() as session:
            run = self._run(session, account_id, agent_id, run_id)
            if run.status not in ACTIVE:
                raise Conflict(f"The run is {run.status}; only a queued or running run can be cancelled.",
                               code="run_not_active")  # fmt: skip
            moved = self._append(
                session,
                run_id,
                None,
                "run.cancelled",
                {"status": "cancelled"},
                {"status": "cancelled", "completed_at": utcnow()},
            )
            if not moved:
                raise Conflict("The run has just finished.", code="run_not_active")
            session.expire_all()
            run = self._run(session, account_id, agent_id, run_id)
            return run_view(run, self._agent(session, account_id, agent_id).model)

    def begin_delete_run(self, account_id: str, agent_id: str, run_id: str) -> None:
        """Move the run to `deleting` (404 if it is not the caller's, or already being deleted). From
        here on no event of it can be written, by this gateway or any other."""
        with self._database.transaction() as session:
            marked = session.execute(
                update(AgentRun)
                .where(
                    AgentRun.id == run_id,
                    AgentRun.agent_id == agent_id,
                    AgentRun.account_id == account_id,
                    AgentRun.status != "deleting",
                )
                .values(status="deleting", updated_at=utcnow())
            ).rowcount  # type: ignore[attr-defined]
        if not marked:
            raise NotFound("Run not found", code="run_not_found")

    def finish_delete_run(self, run_id: str) -> None:
        """Erase the run and its events in one transaction (after its runner has stopped)."""
        with self._database.transaction() as session:
            session.execute(delete(AgentRunEvent).where(AgentRunEvent.run_id == run_id))
            session.execute(delete(AgentRun).where(AgentRun.id == run_id))

    def _run(self, session: Any, account_id: str, agent_id: str, run_id: str) -> AgentRun:
        run = session.get(AgentRun, run_id)
        if (
            run is None
            or run.account_id != account_id
            or run.agent_id != agent_id
            or run.status == "deleting"
        ):
            raise NotFound("Run not found", code="run_not_found")
        return run  # type: ignore[no-any-return]

    # ---------------------------------------------------------------- runs: the runner's side

    def append(
        self,
        run_id: str,
        runner: str | None,
        type_: str,
        data: dict[str, Any],
        run_values: dict[str, Any] | None = None,
    ) -> bool:
        """Write one event (and move the run with `run_values`) if the run is still active and held by
        `runner`; False when it is not (deleted, deleting, cancelled, finished or taken over)."""
        with self._database.transaction() as session:
            return self._append(session, run_id, runner, type_, data, run_values or {})

    def _append(
        self,
        session: Any,
        run_id: str,
        runner: str | None,
        type_: str,
        data: dict[str, Any],
        run_values: dict[str, Any],
    ) -> bool:
        guard = [AgentRun.id == run_id, AgentRun.status.in_(ACTIVE)]
        if runner is not None:
            guard.append(AgentRun.claimed_by == runner)
        now = utcnow()
        moved = session.execute(
            update(AgentRun)
            .where(*guard)
            .values(last_seq=AgentRun.last_seq + 1, updated_at=now, **run_values)
        ).rowcount
        if not moved:
            return False
        seq = session.scalar(select(AgentRun.last_seq).where(AgentRun.id == run_id))
        session.add(AgentRunEvent(run_id=run_id, seq=seq, type=type_, data=data, created_at=now))
        return True

    def beat(self, run_id: str, runner: str) -> bool:
        """Heartbeat of a run held by `runner`; False when it is no longer active and held."""
        with self._database.transaction() as session:
            moved = session.execute(
                update(AgentRun)
                .where(AgentRun.id == run_id, AgentRun.status.in_(ACTIVE), AgentRun.claimed_by == runner)
                .values(updated_at=utcnow())
            ).rowcount  # type: ignore[attr-defined]
        return bool(moved)

    def fail(self, run_id: str, runner: str | None, code: str, message: str) -> bool:
        values = {"status": "failed", "error_code": code, "error_message": message, "completed_at": utcnow()}
        data = {"status": "failed", "error": {"code": code, "message": message}}
        return self.append(run_id, runner, "run.failed", data, values)

    def recover_stale(self, stale_seconds: float) -> int:
        """Runs whose gateway stopped beating fail with `interrupted`; deletions it left half done
        (marked `deleting`, events not yet erased) are finished."""
        cutoff = utcnow() - timedelta(seconds=stale_seconds)
        with self._database.transaction() as session:
            stale = session.scalars(
                select(AgentRun.id).where(AgentRun.status.in_(ACTIVE), AgentRun.updated_at < cutoff)
            ).all()
            abandoned = session.scalars(
                select(AgentRun.id).where(AgentRun.status == "deleting", AgentRun.updated_at < cutoff)
            ).all()
        failed = 0
        for run_id in stale:
            # Guarded on the run still being stale: a runner that beat meanwhile keeps it.
            with self._database.transaction() as session:
                still = session.scalar(
                    select(AgentRun.id).where(
                        AgentRun.id == run_id, AgentRun.status.in_(ACTIVE), AgentRun.updated_at < cutoff
                    )
                )
                if still is not None:
                    values = {"status": "failed", "error_code": "interrupted", "error_message": INTERRUPTED,
                              "completed_at": utcnow()}  # fmt: skip
                    data = {"status": "failed", "error": {"code": "interrupted", "message": INTERRUPTED}}
                    failed += self._append(session, run_id, None, "run.failed", data, values)
        for run_id in abandoned:
            self.finish_delete_run(run_id)
        return failed


def agent_view(agent: Agent) -> dict[str, Any]:
    return {
        "id": agent.id,
        "object": "agent",
        "created_at": unix_seconds(agent.created_at),
        "name": agent.name,
        "model": agent.model,
        "instructions": agent.instructions,
        "tools": agent.tools or [],
    }


def run_view(run: AgentRun, model: str) -> dict[str, Any]:
    error = {"code": run.error_code, "message": run.error_message or ""} if run.status == "failed" else None
    output = run.output or {}
    return {
        "id": run.id,
        "object": "agent.run",
        "agent_id": run.agent_id,
        "model": model,
        "status": run.status,
        "created_at": unix_seconds(run.created_at),
        "completed_at": unix_seconds(run.completed_at),
        "output": output.get("content"),
        "tool_calls": output.get("tool_calls") or [],
        "error": error,
    }


def event_view(event: AgentRunEvent) -> dict[str, Any]:
    return {
        "object": "agent.run.event",
        "run_id": event.run_id,
        "seq": event.seq,
        "type": event.type,
        "created_at": event.created_at.timestamp(),
        "data": event.data,
    }
