"""Liveness, readiness and Prometheus metrics (no key needed: for load balancers and scrapers; the series
that name accounts need the admin or metrics key)."""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from modelhost.api.deps import ServicesDep
from modelhost.api.errors import error_responses
from modelhost.artifacts.disk import data_dir_space
from modelhost.config import Settings
from modelhost.errors import DATABASE_RETRY_AFTER_SECONDS, ServiceUnavailable
from modelhost.metrics import CONTENT_TYPE_LATEST, exposition
from modelhost.store import migrate

router = APIRouter(tags=["operations"])


@router.get("/health", summary="Liveness: the gateway's event loop answers")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/ready",
    summary="Readiness: database reachable and migrations current; free space of the data directory",
    responses=error_responses(503),
)
async def ready(services: ServicesDep) -> dict[str, str | int]:
    """Free disk is shown, not required: below the floor, uploads are refused (507) but inference, which
    needs no disk, goes on, so a load balancer must not take this gateway out (docs/operations.md)."""

    def check() -> str | None:
        if not services.database.ping():
            return "database unreachable"
        if not migrate.is_current(services.database):
            return "database migrations are not current; run `modelhost db upgrade`"
        return None

    problem = await run_in_threadpool(check)
    if problem:
        raise ServiceUnavailable(
            f"Not ready: {problem}.", headers={"Retry-After": str(DATABASE_RETRY_AFTER_SECONDS)}
        )
    space = await run_in_threadpool(data_dir_space, services.settings)
    return {
        "status": "ready",
        "disk": "low" if space.low else "ok",
        "disk_free_bytes": space.free_bytes,
        "disk_floor_bytes": space.floor_bytes,
    }


@router.get(
    "/metrics",
    summary="Prometheus metrics (text exposition format)",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text format."}},
)
async def metrics(request: Request, services: ServicesDep) -> Response:
    """Every process of the server (gateways, supervisor, replicas), added up: read in a thread, as it
    reads one file per process. The data directory's free space is measured first, so it is current.
    The series labelled with account IDs are shown only with the admin key or `MODELHOST_METRICS_KEY`
    as a bearer key (or with `MODELHOST_METRICS_PUBLIC`): one tenant must not read another's spend."""
    tenants = _sees_tenants(request.headers.get("authorization"), services.settings)
    await run_in_threadpool(data_dir_space, services.settings)
    return Response(await run_in_threadpool(exposition, tenants), media_type=CONTENT_TYPE_LATEST)


@router.head("/metrics", include_in_schema=False)
async def metrics_head() -> Response:
    """Whether /metrics answers (probes and scrapers ask with HEAD): 200, no body, nothing read."""
    return Response(media_type=CONTENT_TYPE_LATEST)


def _sees_tenants(authorization: str | None, settings: Settings) -> bool:
    """Whether a scrape sees the series that name accounts: with the admin key or the metrics key as a
    bearer key. Any other caller (no key, an account's key: the console reads /metrics with it) sees
    the rest."""
    if settings.metrics_public:
        return True
    scheme, _, token = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return False
    given = token.strip().encode()
    keys = (settings.admin_key_value, settings.metrics_key_value)
    return any(key is not None and hmac.compare_digest(given, key.encode()) for key in keys)
