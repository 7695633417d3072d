"""The FastAPI application: routers, error handlers, middleware, lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import re
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.types import Scope

import modelhost
from modelhost import tracing
from modelhost.api import console
from modelhost.api.batch_lines import line_caller
from modelhost.api.errors import error_responses, install_error_handlers
from modelhost.api.fastlane import FastLane
from modelhost.api.middleware import BodySizeLimit, KeyFirst, RequestPath
from modelhost.api.routes import (
    admin,
    agents,
    artifacts,
    audio,
    audit,
    batches,
    chat,
    deployments,
    embeddings,
    files,
    health,
    images,
    keys,
    messages,
    models,
    rerank,
    responses,
    tasks,
    usage,
    videos,
)
from modelhost.auth.limits import RateLimiter
from modelhost.config import Settings, get_settings
from modelhost.container import Services, Supervision
from modelhost.pipelines import ENDPOINT_TASKS
from modelhost.protocol.errors import ErrorBody

log = logging.getLogger("modelhost")
FORM_OVERHEAD = 64 * 1024  # a multipart form's own bytes around the file it carries
UPLOAD_PATH = re.compile(r"^/v1/model-artifacts/[^/]+/uploads/[^/]+/files/")

DESCRIPTION = """
Serve your own Hugging Face models over HTTP: task endpoints, OpenAI-compatible endpoints,
model artifact uploads and deployments.

**Auth**: every `/v1` route takes `Authorization: Bearer mh-...`. `/v1/admin/*` needs the operator's
admin key; management routes need an account key; inference routes and `/v1/models` take an account
key or a deployment key. Any other key → 401 `InvalidAPIKeyError`.

**Errors**: every failure answers `{"error": {"message", "type", "code", "param"}}`.
"""


Around = Callable[[Services], AbstractAsyncContextManager[None]]


def create_app(
    settings: Settings | None = None,
    services: Services | None = None,
    *,
    around: Around | None = None,
    limits: RateLimiter | None = None,
) -> FastAPI:
    """Build the gateway. Services are built at startup unless given (tests may share one). In the
    supervisor the lifespan also runs its duties; `around` wraps what runs while the app serves (the
    server's other gateway processes, `modelhost.server`), inside those duties; `limits` is the rate
    limiter on the table they share."""
    settings = settings or (services.settings if services else get_settings())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owned = services is None
        app.state.services = built = services or Services.build(settings, limits=limits)
        traced = tracing.start("gateway")  # on only where OTEL_EXPORTER_OTLP_*ENDPOINT is set
        try:
            async with contextlib.AsyncExitStack() as stack:
                if built.supervisor is not None:
                    await stack.enter_async_context(supervising(app, built, built.supervisor))
                if around is not None:
                    await stack.enter_async_context(around(built))
                yield
        finally:
            if owned:
                built.close()
            if traced:
                tracing.stop()  # after the replicas' shutdown: the last spans go out

    app = FastAPI(
        title="modelhost",
        version=modelhost.__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    if services is not None:
        app.state.services = services
    install_error_handlers(app)
    for router in (
        health.router,
        admin.router,
        keys.router,
        artifacts.router,
        deployments.router,
        models.router,
        embeddings.router,
        chat.router,
        responses.router,
        messages.router,
        files.router,
        batches.router,
        images.router,
        tasks.router,
        rerank.router,
        audio.router,
        videos.router,
        agents.router,
        usage.router,
        audit.router,
        console.router,
    ):
        app.include_router(router)

    def body_limit(scope: Scope) -> int:
        """File uploads stream to disk under their own (much larger) limit."""
        if scope.get("method") == "PUT" and UPLOAD_PATH.match(scope.get("path", "")):
            return settings.max_upload_file_bytes
        if scope.get("method") == "POST" and scope.get("path") == "/v1/files":  # a batch's input file
            return max(settings.max_body_bytes, settings.batch_max_file_bytes + FORM_OVERHEAD)
        return settings.max_body_bytes

    app.add_middleware(FastLane, fastapi=app)  # innermost: inside the body limit and the metrics
    app.add_middleware(BodySizeLimit, limit_for=body_limit)
    app.add_middleware(KeyFirst, fastapi=app)  # the key before the body: 401 comes before 413 and 400
    # outermost: every answer and log line of the request carries its ID, every answer is counted
    app.add_middleware(RequestPath)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document, with its 422 validation answers replaced by our 400 error body."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    error_ref = {"$ref": "#/components/schemas/ErrorBody"}
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.setdefault(
        "ErrorBody", ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")
    )
    for defn in (
        ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}").get("$defs", {}).items()
    ):
        components.setdefault(*defn)
    components.get("ErrorBody", {}).pop("$defs", None)
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    for path, path_item in schema.get("paths", {}).items():
        for method, operation in path_item.items():
            if method == "post" and path in ENDPOINT_TASKS:
                # which deployments answer it: the console builds its playground forms from this
                operation["x-modelhost-pipelines"] = list(ENDPOINT_TASKS[path])
            responses = operation.get("responses", {})
            responses.pop("422", None)
            if operation.get("requestBody") or operation.get("parameters"):
                responses.setdefault(
                    "400",
                    {
                        "description": error_responses(400)[400]["description"],
                        "content": {"application/json": {"schema": error_ref}},
                    },
                )
            for status in ("404", "405", "413"):
                responses.setdefault(
                    status,
                    {"description": _GENERIC[status], "content": {"application/json": {"schema": error_ref}}},
                )
    app.openapi_schema = schema
    return schema


_GENERIC = {
    "404": "Not found (unknown route or resource).",
    "405": "Method not allowed on this route.",
    "413": "Request body too large (`payload_too_large`).",
}


@asynccontextmanager
async def supervising(app: FastAPI, services: Services, supervision: Supervision) -> AsyncIterator[None]:
    """The supervisor's duties while it serves: housekeeping, metering, hot loads and the idle reaper,
    video jobs, agent runs, batches (their lines sent through `app` itself), imports and sharing rate-limit
    counts. At the end it bills every replica up to its unload."""
    sweeper = asyncio.create_task(_sweep_forever(services))
    billing = services.billing
    await asyncio.to_thread(billing.close_stale)
    metering = asyncio.create_task(billing.run_forever(supervision.runtime.unload_account))
    sharing = asyncio.create_task(supervision.shared_limits.run_forever())
    await supervision.runtime.start()
    supervision.videos.start()
    supervision.agents.start()
    supervision.batches.start(line_caller(app))
    supervision.imports.start_claiming()
    try:
        yield
    finally:
        sweeper.cancel()
        metering.cancel()
        sharing.cancel()
        await supervision.imports.stop()
        await supervision.batches.stop()
        await supervision.videos.stop()
        await supervision.agents.stop()
        await supervision.runtime.shutdown()
        await supervision.shared_limits.stop()


async def _sweep_forever(services: Services) -> None:
    """Background housekeeping: expire upload sessions and generated files, recover stale completions,
    prune audit rows past their retention."""
    await asyncio.to_thread(services.artifacts.recover)
    while True:
        await asyncio.sleep(services.settings.sweep_interval_seconds)
        for sweep in (
            services.artifacts.sweep,
            services.files.sweep,
            services.uploads.sweep,
            services.audit.prune,
        ):
            try:
                await asyncio.to_thread(sweep)
            except Exception:
                log.exception("sweep failed")


def settle_memory() -> None:
    """Called once a gateway process has built everything it keeps for its whole life.

    `gc.freeze` takes all of that out of the collector's view, and a larger first-generation threshold
    collects less often. Together they cut the gateway's CPU per request by about a tenth under load
    (bench/)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)
