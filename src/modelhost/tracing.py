"""Traces with OpenTelemetry: on when an operator names an OTLP endpoint, free when not.

An operator configures tracing as for every other service, through the standard variables, which the
SDK reads itself: `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (tracing is off
unless one is set), `OTEL_EXPORTER_OTLP_PROTOCOL` (`http/protobuf`, the default, or `grpc`; the
`_TRACES_` variant wins), headers, timeout and compression, `OTEL_SERVICE_NAME` and
`OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER` and its argument, and the batch processor's
`OTEL_BSP_*`. `OTEL_SDK_DISABLED=true` turns it off as well.

Each process sets up its own provider (`start`): a gateway in its app's lifespan, a replica worker when
it serves; `stop` flushes what is left. The provider is ours, not the global one, so that several
servers in one process (the tests) each start and stop their own. While tracing is off `ENABLED` is
False, and callers check it before anything else: no span, context or header is made on the hot path.

A trace crosses processes as a W3C `traceparent` (`00-<trace id>-<span id>-<flags>`): from the client
into the gateway (`continued`), and from the gateway to a replica in the replica protocol (`parent`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span as Span  # re-exported: the type of the spans callers hold
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from modelhost.errors import ModelhostError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

log = logging.getLogger("modelhost.tracing")
ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
DEFAULT_SERVICE_NAME = "modelhost"
SCOPE = "modelhost"

ENABLED = False  # read first by every caller: off, nothing else is touched
_provider: TracerProvider | None = None
_users = 0  # the servers of this process that started it (tests run several)
_tracer: trace.Tracer = trace.NoOpTracer()
_propagator = TraceContextTextMapPropagator()


def configured(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the standard variables ask for traces: an OTLP endpoint named, the SDK not disabled."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(environ.get(name, "").strip() for name in ENDPOINTS)


def start(role: str) -> bool:
    """Set up this process's tracer provider when tracing is configured; `role` (`gateway`, `replica`)
    is recorded on its resource. True when tracing is on (also when it already was)."""
    global ENABLED, _provider, _tracer, _users
    if _provider is not None:
        _users += 1
        return True
    if not configured():
        return False
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"modelhost.process": role})
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    provider = TracerProvider(resource=resource)  # the sampler from OTEL_TRACES_SAMPLER
    provider.add_span_processor(BatchSpanProcessor(_exporter()))  # OTEL_BSP_* read by it
    _provider, _tracer, ENABLED, _users = provider, provider.get_tracer(SCOPE), True, 1
    return True


def stop() -> None:
    """Export what is left and turn tracing off (the server stops, the worker exits), once the last
    of this process's servers that started it stops."""
    global ENABLED, _provider, _tracer, _users
    _users = max(0, _users - 1)
    if _users:
        return
    provider, _provider = _provider, None
    ENABLED, _tracer = False, trace.NoOpTracer()
    if provider is not None:
        try:
            provider.shutdown()  # flushes the batch processor
        except Exception:  # an unreachable collector must not fail a shutdown
            log.exception("the tracer provider did not shut down cleanly")


def _exporter() -> SpanExporter:
    """The OTLP exporter of the configured protocol; it reads its endpoint, headers and the rest itself."""
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
    )
    if protocol.strip() == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc

        return Grpc()
    if protocol.strip() != "http/protobuf":
        log.warning("OTEL_EXPORTER_OTLP_PROTOCOL=%s is not supported; using http/protobuf", protocol)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

    return Http()


def continued(traceparent: str | None, tracestate: str | None = None) -> otel_context.Context | None:
    """The context a caller's W3C headers name, to parent a span on; None for a new trace."""
    if not traceparent:
        return None
    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    found = _propagator.extract(carrier)
    return found if trace.get_current_span(found).get_span_context().is_valid else None


def header_of(span: trace.Span) -> str | None:
    """A span as a W3C `traceparent` / `traceresponse` value; None for an invalid one."""
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def parent() -> str:
    """The current span as a `traceparent` for another process (the replica protocol); "" when tracing
    is off or no span is current."""
    if not ENABLED:
        return ""
    return header_of(trace.get_current_span()) or ""


def trace_id_of(span: trace.Span) -> str:
    return f"{span.get_span_context().trace_id:032x}"


# ---------------------------------------------------------------- the gateway's SERVER span

# A request's model (as the caller named it), put in its ASGI scope by the route's deployment lookup.
MODEL = "modelhost.model"
# The GenAI operation of each endpoint that has one in the GenAI semantic conventions: these spans are
# named `{operation} {model}`; every other request's span `{method} {route}`, as HTTP's conventions say.
GEN_AI_OPERATIONS = {
    "/v1/embeddings": "embeddings",
    "/v1/chat/completions": "chat",
    "/v1/completions": "text_completion",
    "/v1/responses": "chat",
}


def server_span(
    method: str, path: str, scheme: str, traceparent: str | None, tracestate: str | None
) -> trace.Span:
    """A gateway's SERVER span for an HTTP request, continuing the caller's trace when it sent one.
    Its name and the rest of its attributes are set when the request ends (`server_span_ended`)."""
    attributes = {"http.request.method": method, "url.path": path, "url.scheme": scheme}
    return _tracer.start_span(
        method, context=continued(traceparent, tracestate), kind=trace.SpanKind.SERVER, attributes=attributes
    )


def server_span_ended(
    span: trace.Span, method: str, route: str | None, status: int, model: str | None
) -> None:
    """Name the span now that its route (and model) are known, record the answer's status, end it."""
    operation = GEN_AI_OPERATIONS.get(route or "")
    if operation is not None and model:
        span.update_name(f"{operation} {model}")
        span.set_attributes({"gen_ai.operation.name": operation, "gen_ai.request.model": model})
    else:
        span.update_name(f"{method} {route}" if route else method)
        if model:
            span.set_attribute("gen_ai.request.model", model)
    if route:
        span.set_attribute("http.route", route)
    span.set_attribute("http.response.status_code", status)
    if status >= 500:
        span.set_attribute("error.type", str(status))
        span.set_status(trace.StatusCode.ERROR)
    span.end()


def record_usage(input_tokens: int | None = None, output_tokens: int | None = None) -> None:
    """The tokens a request used, on the current span (GenAI `gen_ai.usage.*`); nothing while off."""
    if not ENABLED:
        return
    span = trace.get_current_span()
    if input_tokens is not None:
        span.set_attribute("gen_ai.usage.input_tokens", input_tokens)
    if output_tokens is not None:
        span.set_attribute("gen_ai.usage.output_tokens", output_tokens)


def activate(span: trace.Span) -> object:
    """Make `span` the current one (its children and the replica protocol's `parent` find it); give the
    token back to `deactivate`."""
    return otel_context.attach(trace.set_span_in_context(span))


def deactivate(token: object) -> None:
    otel_context.detach(token)  # type: ignore[arg-type]


# ---------------------------------------------------------------- a replica's spans


def replica_run_span(
    traceparent: str, deployment: str, start_ns: int, end_ns: int, queued_seconds: float, batch_size: int
) -> None:
    """A batch request's model call in a replica, a child of the gateway span that sent it."""
    attributes: dict[str, str | int | float] = {
        "modelhost.deployment": deployment,
        "modelhost.queue.seconds": queued_seconds,
        "modelhost.batch.size": batch_size,
    }
    span = _tracer.start_span(
        "model call",
        context=continued(traceparent),
        kind=trace.SpanKind.SERVER,
        attributes=attributes,
        start_time=start_ns,
    )
    span.end(end_time=end_ns)


def replica_generate_span(traceparent: str, deployment: str) -> trace.Span | None:
    """A generation in a replica, from its start to its last event (`generation_event`)."""
    if not ENABLED:
        return None
    attributes = {"modelhost.deployment": deployment}
    return _tracer.start_span(
        "generate", context=continued(traceparent), kind=trace.SpanKind.SERVER, attributes=attributes
    )


def generation_event(span: trace.Span, event: Mapping[str, object], tokens_before: int) -> None:
    """What an engine event tells a generation's span: its prompt's tokens once prefilled (`started`),
    its time to first token, and on its last event (or its cancel) its tokens and end."""
    prompt = event.get("prompt_tokens")
    if isinstance(prompt, int):
        span.set_attribute("gen_ai.usage.input_tokens", prompt)
        span.add_event("prefilled")
    generated = event.get("completion_tokens")
    if isinstance(generated, int) and generated and not tokens_before:
        started = getattr(span, "start_time", None)  # the SDK's spans keep it
        if isinstance(started, int):
            span.set_attribute("gen_ai.server.time_to_first_token", (time.time_ns() - started) / 1e9)
        span.add_event("first token")
    if "finish" in event or "error" in event or "cancelled" in event:
        span.set_attribute(
            "gen_ai.usage.output_tokens", generated if isinstance(generated, int) else tokens_before
        )
        if isinstance(event.get("finish"), str):
            span.set_attribute("gen_ai.response.finish_reasons", [str(event["finish"])])
        if "error" in event:
            span.set_status(trace.StatusCode.ERROR)
        span.end()


# ---------------------------------------------------------------- work started by a request

# Batch lines, agent runs and video jobs run after the request that created them has answered, maybe
# hours later, maybe after a restart. Each starts a trace of its own, linked to its creator's span (the
# creator's `traceparent`, stored with the work): OpenTelemetry's pattern for work handed over through a
# queue. The creator's trace stays as long as its request; the link leads from the work to it.

T = TypeVar("T")


def linked_span(name: str, creator: str | None, attributes: Mapping[str, AttributeValue]) -> trace.Span:
    """An INTERNAL span that is the root of a new trace, with a link to the span `creator` names (a W3C
    `traceparent`; no link when it names none: the work was created with tracing off)."""
    found = continued(creator)
    links = [] if found is None else [trace.Link(trace.get_current_span(found).get_span_context())]
    return _tracer.start_span(
        name,
        context=otel_context.Context(),  # a root: not the current span of whatever task starts it
        kind=trace.SpanKind.INTERNAL,
        attributes=attributes,
        links=links,
    )


async def within(span: trace.Span, work: Awaitable[T], stopped: tuple[type[BaseException], ...] = ()) -> T:
    """Await `work` with `span` current, and end the span with it. Current, so that what the work sends
    on (the replica protocol's `parent`, an in-process request) joins the span's trace. An exception
    marks the span an error (`error.type`: a modelhost error's code, else the exception's class), but
    for a cancel and the `stopped` ones, which end the work without failing it (a deleted run)."""
    token = activate(span)
    try:
        return await work
    except BaseException as exc:
        if not isinstance(exc, (asyncio.CancelledError, *stopped)):
            span.set_attribute(
                "error.type", exc.code if isinstance(exc, ModelhostError) else type(exc).__qualname__
            )
            span.set_status(trace.StatusCode.ERROR)
        raise
    finally:
        deactivate(token)
        span.end()
