"""The FastAPI application: routers, error handlers, middleware, lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.types import Scope

import modelhost
from modelhost import tracing
from modelhost.api import console
from modelhost.api.admission import Admission, admission_of
from modelhost.api.batch_lines import line_caller
from modelhost.api.deps import Guard, guard_of, require_admin
from modelhost.api.errors import error_responses, install_error_handlers
from modelhost.api.fastlane import FastLane, LaneFirst, routes_of
from modelhost.api.middleware import BodySizeLimit, KeyFirst, RequestPath
from modelhost.api.query import one_value_each
from modelhost.api.routes import (
    admin,
    agents,
    artifacts,
    audio,
    audit,
    auth,
    batches,
    chat,
    conversations,
    deployments,
    embeddings,
    evals,
    files,
    fine_tuning,
    health,
    images,
    keys,
    mcp_servers,
    messages,
    models,
    realtime,
    rerank,
    responses,
    tasks,
    usage,
    users,
    videos,
)
from modelhost.config import Settings, get_settings
from modelhost.container import Services
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

# FastAPI's own OpenTelemetry instrumentation (0.16x) off: modelhost traces requests itself
# (`api.middleware.RequestPath`, docs/traces.md), and FastAPI asking the global providers whether they
# are configured cost every request about 10 µs of gateway CPU (issue 71). Older FastAPI has no option.
_NO_FASTAPI_TELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters
    else {}
)


def create_app(settings: Settings | None = None, services: Services | None = None) -> FastAPI:
    """Build the gateway. Services are built at startup unless given (a gateway process builds its own
    with the supervisor's stand-ins; tests may share one). Where the services are a supervisor's (the
    embedded server: tests, Ray Serve's one process), the lifespan also runs its duties."""
    settings = settings or (services.settings if services else get_settings())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owned = services is None
        app.state.services = built = services or Services.build(settings)
        traced = tracing.start("gateway")  # on only where OTEL_EXPORTER_OTLP_*ENDPOINT is set
        # people's use, into the database: here in a gateway process, by the duties in the supervisor's
        quotas = asyncio.create_task(built.quotas.run_forever()) if built.supervisor is None else None
        try:
            async with contextlib.AsyncExitStack() as stack:
                if built.supervisor is not None:  # embedded: the supervisor's duties run here
                    await stack.enter_async_context(built.supervisor.duties(built, line_caller(app)))
                built.responses.start_taking_over()  # background responses of dead gateway processes
                try:
                    yield
                finally:  # while the replicas run: this process's background responses handed back
                    await built.responses.stop()
        finally:
            if quotas is not None:
                quotas.cancel()
                await built.quotas.stop()
            if owned:
                built.close()
            if traced:
                tracing.stop()  # after the replicas' shutdown: the last spans go out

    app = LaneFirst(
        title="modelhost",
        version=modelhost.__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        dependencies=[Depends(one_value_each)],  # a repeated one-value query parameter is a 400
        **_NO_FASTAPI_TELEMETRY,
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
        conversations.router,
        messages.router,
        files.router,
        batches.router,
        fine_tuning.router,
        images.router,
        tasks.router,
        rerank.router,
        audio.router,
        realtime.router,
        videos.router,
        agents.router,
        usage.router,
        audit.router,
        users.router,
        mcp_servers.router,
        auth.router,
        console.router,
        evals.router,
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
    rules = _rules(app)
    for path, path_item in schema.get("paths", {}).items():
        for method, operation in path_item.items():
            _document_rules(operation, *rules.get((method.upper(), path), (None, Admission.NONE)), error_ref)
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
            if operation.get("security") and not path.startswith("/v1/admin"):
                # an account's or deployment's key: its role may not give the route's action
                responses.setdefault(
                    "403",
                    {
                        "description": error_responses(403)[403]["description"],
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


def _rules(app: FastAPI) -> dict[tuple[str, str], tuple[Guard | None, Admission]]:
    """Each route's key check and admission (`api.admission`), by (method, path template)."""
    rules = {}
    for route, path in routes_of(app):
        guard = guard_of(route.dependant)
        for method in route.methods or ():
            rules[(method, path)] = (guard, admission_of(method, path, guard))
    return rules


def _document_rules(
    operation: dict[str, Any], guard: Guard | None, admission: Admission, error_ref: Any
) -> None:
    """The two rules of every request in the document: how a keyed request is admitted
    (`x-modelhost-admission`, and its 402 / 429), and the throttle of requests without a key (a 429)."""
    responses = operation.setdefault("responses", {})

    def answers(status: int, description: str) -> None:
        responses.setdefault(
            str(status), {"description": description, "content": {"application/json": {"schema": error_ref}}}
        )

    security = operation.get("security")
    if guard is not None and guard is not require_admin:
        operation["x-modelhost-admission"] = admission.name.lower()
        if admission is Admission.ADMIT:
            answers(402, error_responses(402)[402]["description"])
        if admission is not Admission.NONE:
            answers(429, error_responses(429)[429]["description"])
    if not security or {} in security:
        answers(429, ANONYMOUS_429)


ANONYMOUS_429 = (
    "Too many requests without a key from this client address (`too_many_anonymous_requests`; "
    'docs/security.md, "Anonymous routes"). See `Retry-After`.'
)
_GENERIC = {
    "404": "Not found (unknown route or resource).",
    "405": "Method not allowed on this route.",
    "413": "Request body too large (`payload_too_large`).",
}
