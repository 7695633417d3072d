"""`GET /v1/usage`: the account's balance and what it was billed, by deployment, artifact and day."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query

from modelhost.api.deps import AccountPrincipal, ServicesDep, account_id_of
from modelhost.api.errors import error_responses
from modelhost.billing.ledger import Usage as UsageReport
from modelhost.billing.rates import to_credits
from modelhost.protocol.billing import ArtifactUsage, DayUsage, DeploymentUsage, Usage

router = APIRouter(prefix="/v1/usage", tags=["billing"], responses=error_responses(400, 401))

Moment = Annotated[
    datetime | None,
    Query(
        description="ISO 8601 date or time (UTC unless it says), or Unix seconds.",
        # What pydantic's datetime accepts, said in the schema: Unix seconds are valid too.
        json_schema_extra={"anyOf": [{"type": "string", "format": "date-time"}, {"type": "number"}]},
    ),
]


@router.get("", summary="Credits: balance and usage in a range (default: this calendar month, UTC)")
async def get_usage(
    principal: AccountPrincipal, services: ServicesDep, start: Moment = None, end: Moment = None
) -> Usage:
    account_id = account_id_of(principal)
    since, until = _utc(start), _utc(end)
    report, first, last = await asyncio.to_thread(services.billing.usage, account_id, since, until)
    return present(account_id, report, first, last)


def present(account_id: str, report: UsageReport, start: datetime, end: datetime) -> Usage:
    return Usage(
        account_id=account_id,
        start=start,
        end=end,
        credits_balance=to_credits(report.granted_micro - report.spent_micro),
        credits_granted=to_credits(report.granted_micro),
        credits_used=to_credits(report.spent_micro),
        credits=to_credits(report.compute_micro + report.storage_micro),
        compute_credits=to_credits(report.compute_micro),
        storage_credits=to_credits(report.storage_micro),
        by_deployment=[
            DeploymentUsage(
                deployment_id=line.key, model=line.name, compute_credits=to_credits(line.compute_micro)
            )
            for line in report.by_deployment
        ],
        by_artifact=[
            ArtifactUsage(
                artifact_id=line.key,
                display_name=line.name,
                compute_credits=to_credits(line.compute_micro),
                storage_credits=to_credits(line.storage_micro),
            )
            for line in report.by_artifact
        ],
        by_day=[
            DayUsage(
                date=line.key,
                compute_credits=to_credits(line.compute_micro),
                storage_credits=to_credits(line.storage_micro),
                credits=to_credits(line.compute_micro + line.storage_micro),
            )
            for line in report.by_day
        ],
    )


def _utc(moment: datetime | None) -> datetime | None:
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)
