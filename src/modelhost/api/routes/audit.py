"""The audit log (docs/operations.md, Audit log): an account key reads its account's rows, the admin key
every row and verifies the chain."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query

from modelhost.api.deps import AdminPrincipal, AuditorPrincipal, ServicesDep
from modelhost.api.errors import error_responses
from modelhost.api.lists import After, Limit, Order, list_body
from modelhost.audit import Filters
from modelhost.auth.principal import PrincipalKind
from modelhost.protocol.management import (
    AuditActor,
    AuditChange,
    AuditEntry,
    AuditList,
    AuditProblem,
    AuditTarget,
    AuditVerification,
)
from modelhost.store.models import AuditRow

router = APIRouter(tags=["audit"], responses=error_responses(400, 401))

Text = Annotated[str | None, Query(max_length=64)]
Moment = Annotated[datetime | None, Query(description="ISO 8601; rows at or after `since`, before `until`.")]


def present(row: AuditRow) -> AuditEntry:
    return AuditEntry(
        id=row.id,
        seq=row.seq,
        created_at=row.created_at,
        actor=AuditActor(
            kind=row.actor_kind,
            key_id=row.actor_key_id,
            address=row.client_address,
            user_id=row.actor_user_id,
            email=row.actor_email,
            subject=row.actor_subject,
        ),
        request_id=row.request_id,
        action=row.action,
        target=AuditTarget(type=row.target_type, id=row.target_id),
        account_id=row.account_id,
        changes={name: AuditChange.model_validate(change) for name, change in row.changes.items()},
        hash=row.hash,
    )


@router.get(
    "/v1/audit",
    summary="Audit rows, newest first: every change to accounts, keys, deployments, artifacts, shares, "
    "limits, credits and files (an account key: its account's; the admin key: all)",
    response_model=AuditList,
    responses=error_responses(404),
)
async def list_audit(
    principal: AuditorPrincipal,
    services: ServicesDep,
    after: After = None,
    limit: Limit = 20,
    order: Order = "desc",
    action: Text = None,
    target_type: Text = None,
    target_id: Text = None,
    actor_key_id: Text = None,
    account_id: Annotated[str | None, Query(max_length=64, description="Admin key only.")] = None,
    since: Moment = None,
    until: Moment = None,
) -> dict[str, object]:
    if principal.kind is PrincipalKind.ACCOUNT:
        account_id = principal.account_id  # an account reads its own rows only, whatever it asks
    filters = Filters(account_id, action, target_type, target_id, actor_key_id, _utc(since), _utc(until))
    rows, more = await asyncio.to_thread(services.audit.page, filters, after, limit, order)
    return list_body([present(row).model_dump(mode="json") for row in rows], more)


def _utc(moment: datetime | None) -> datetime | None:
    """A time without a zone is UTC, as every time the API gives."""
    return moment.replace(tzinfo=UTC) if moment is not None and moment.tzinfo is None else moment


@router.get(
    "/v1/admin/audit/verify",
    summary="Recompute the audit log's hash chain: an edited, deleted or missing row is named",
    tags=["admin"],
)
async def verify_audit(_admin: AdminPrincipal, services: ServicesDep) -> AuditVerification:
    found = await asyncio.to_thread(services.audit.verify)
    return AuditVerification(
        ok=found.ok,
        rows=found.rows,
        first_seq=found.first_seq,
        last_seq=found.last_seq,
        head_hash=found.head_hash,
        pruned_through=found.pruned_through,
        problems=[AuditProblem(seq=p.seq, id=p.id, reason=p.reason) for p in found.problems],
    )
