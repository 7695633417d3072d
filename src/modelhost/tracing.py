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
import contextlib
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
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
    """The context a caller's W3C headers name, to parent a span on; None for a new trace. A
    `tracestate` that is not the standard's list of `key=value` members is dropped (W3C Trace Context:
    it is not propagated), before OpenTelemetry, which would log its invalid members verbatim."""
    if not traceparent:
        return None
    carrier = {"traceparent": traceparent}
    if tracestate and valid_tracestate(tracestate):
        carrier["tracestate"] = tracestate
    found = _propagator.extract(carrier)
    return found if trace.get_current_span(found).get_span_context().is_valid else None


# W3C Trace Context, `tracestate`: at most 32 comma-separated `key=value` members, 512 characters in
# all; a key is lowercase letters, digits and `_-*/` (with an optional `@vendor` part), a value printable
# ASCII other than `,` and `=`, not ending in a space.
_TRACESTATE_KEY = r"(?:[a-z][_0-9a-z\-*/]{0,255}|[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13})"
_TRACESTATE_VALUE = r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
_TRACESTATE_MEMBER = re.compile(f"{_TRACESTATE_KEY}={_TRACESTATE_VALUE}")
TRACESTATE_MAX_LENGTH = 512
TRACESTATE_MAX_MEMBERS = 32


def valid_tracestate(header: str) -> bool:
    """Whether a `tracestate` header is one W3C Trace Context allows."""
    if len(header) > TRACESTATE_MAX_LENGTH:
        return False
    members = [m.strip(" \t") for m in header.split(",")]
    members = [m for m in members if m]  # empty members are allowed and ignored
    if len(members) > TRACESTATE_MAX_MEMBERS:
        return False
    return all(_TRACESTATE_MEMBER.fullmatch(m) for m in members)


def header_of(span: trace.Span) -> str | None:
    """A span as a W3C `traceparent` / `traceresponse` value; None for an invalid one."""
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def parent() -> str:
    """The current span as a `traceparent` for another process (the replica protocol); "" when tracing
    is off or the current span records nothing (none, or not sampled: the other process's spans of it
    would not be either, so it is spared making them)."""
    if not ENABLED:
        return ""
    return traceparent(trace.get_current_span())


def traceparent(span: trace.Span | None) -> str:
    """A recording span as a `traceparent` for another process; "" for none, or one not sampled."""
    return (header_of(span) or "") if span is not None and span.is_recording() else ""


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
    "/v1/messages": "chat",
}


def server_span(
    method: str,
    path: str,
    scheme: str,
    traceparent: str | None,
    tracestate: str | None,
    trusted: bool = True,
) -> trace.Span:
    """A gateway's SERVER span for an HTTP request, continuing the caller's trace when it sent one and
    is `trusted` (the caller's sampled flag then decides, as W3C says). An untrusted caller's trace is
    not continued: the span starts a trace of its own, which this server's sampler decides, linked to
    the caller's span (so that anyone cannot force their requests to be traced, or not). Its name and
    the rest of its attributes are set when the request ends (`server_span_ended`)."""
    attributes = {"http.request.method": method, "url.path": path, "url.scheme": scheme}
    context = continued(traceparent, tracestate)
    links: list[trace.Link] = []
    if context is not None and not trusted:
        links.append(trace.Link(trace.get_current_span(context).get_span_context()))
        context = otel_context.Context()  # a new root, whatever the current context holds
    return _tracer.start_span(
        method, context=context, kind=trace.SpanKind.SERVER, attributes=attributes, links=links
    )


def server_span_ended(
    span: trace.Span, method: str, route: str | None, status: int, model: str | None, tokens: list[int]
) -> None:
    """Name the span now that its route (and model) are known, record the answer's status and the
    tokens the request used (`auth.limits.start_counting`: all, input, output), end it."""
    operation = GEN_AI_OPERATIONS.get(route or "")
    if operation is not None and model:
        span.update_name(f"{operation} {model}")
        span.set_attributes({"gen_ai.operation.name": operation, "gen_ai.request.model": model})
    else:
        span.update_name(f"{method} {route}" if route else method)
        if model:
            span.set_attribute("gen_ai.request.model", model)
    if tokens[0]:
        span.set_attributes(usage(tokens[1], tokens[2]))
    if route:
        span.set_attribute("http.route", route)
    span.set_attribute("http.response.status_code", status)
    if status >= 500:
        span.set_attribute("error.type", str(status))
        span.set_status(trace.StatusCode.ERROR)
    span.end()


def activate(span: trace.Span) -> object:
    """Make `span` the current one (its children and the replica protocol's `parent` find it); give the
    token back to `deactivate`."""
    return otel_context.attach(trace.set_span_in_context(span))


def deactivate(token: object) -> None:
    otel_context.detach(token)  # type: ignore[arg-type]


# ---------------------------------------------------------------- a request's steps in the gateway

_OFF: AbstractContextManager[None] = contextlib.nullcontext()  # what `step` gives while tracing is off
Attributes = Mapping[str, str | int | float | bool]
CLIENT = trace.SpanKind.CLIENT


def step(
    name: str, attributes: Attributes | None = None, kind: trace.SpanKind = trace.SpanKind.INTERNAL
) -> AbstractContextManager[trace.Span | None]:
    """A child of the current span around one step of a request (authentication, limits, the wait for
    a replica, the dispatch), current while the step runs so that what it calls joins it. Off, or
    outside any sampled request's span (a load in the background), a shared context that does nothing."""
    if not ENABLED or not trace.get_current_span().is_recording():
        return _OFF
    return _tracer.start_as_current_span(name, attributes=attributes, kind=kind)


def started(
    name: str, attributes: Attributes | None = None, kind: trace.SpanKind = trace.SpanKind.CLIENT
) -> trace.Span | None:
    """A child of the current span that the caller ends itself (`span.end()`), never made current: a
    generation's dispatch, which lives across the yields of a stream. None while tracing is off, or
    outside a sampled span."""
    if not ENABLED or not trace.get_current_span().is_recording():
        return None
    return _tracer.start_span(name, attributes=attributes, kind=kind)


def span_ended(span: trace.Span, input_tokens: int, output_tokens: int) -> None:
    """End a generation's dispatch span with the tokens it carried."""
    span.set_attributes(usage(input_tokens, output_tokens))
    span.end()


def usage(input_tokens: int, output_tokens: int) -> dict[str, int]:
    """The GenAI conventions' usage attributes."""
    return {"gen_ai.usage.input_tokens": input_tokens, "gen_ai.usage.output_tokens": output_tokens}


def current_attributes(attributes: Attributes) -> None:
    """Set attributes on the current span (a step's outcome); nothing while tracing is off."""
    if ENABLED:
        trace.get_current_span().set_attributes(attributes)


# ---------------------------------------------------------------- a replica's spans


def replica_request_spans(
    traceparent: str, deployment: str, arrived_ns: int, started_ns: int, ended_ns: int, batch_size: int
) -> None:
    """A batch task's request in a replica, in the trace of the gateway's dispatch that sent it:
    `replica` (its arrival to its answer) with two children, `queue` (its wait for a batch) and
    `model call` (the batch it ran in). Made once the batch is done, from the times it kept."""
    attributes: dict[str, str | int | float] = {
        "modelhost.deployment": deployment,
        "modelhost.queue.seconds": (started_ns - arrived_ns) / 1e9,
        "modelhost.batch.size": batch_size,
    }
    replica = _replica_span("replica", traceparent, attributes, arrived_ns)
    _phase(replica, "queue", arrived_ns, started_ns)
    _phase(replica, "model call", started_ns, ended_ns, {"modelhost.batch.size": batch_size})
    replica.end(end_time=ended_ns)


def _replica_span(name: str, traceparent: str, attributes: Attributes, start_ns: int) -> trace.Span:
    """A replica's SERVER span of a request, a child of the gateway's span that `traceparent` names."""
    return _tracer.start_span(
        name,
        context=continued(traceparent),
        kind=trace.SpanKind.SERVER,
        attributes=attributes,
        start_time=start_ns,
    )


def _phase(
    parent: trace.Span, name: str, start_ns: int, end_ns: int, attributes: Attributes | None = None
) -> None:
    """A child of `parent` from `start_ns` to `end_ns`, made once both are known."""
    context = trace.set_span_in_context(parent)
    _tracer.start_span(name, context=context, attributes=attributes, start_time=start_ns).end(end_time=end_ns)


@dataclass(eq=False)
class GenerationTrace:
    """A generation in a replica: `generate` (from its arrival to its last event), in the trace of the
    gateway's dispatch that sent it, and once it ends its two phases as children, `prefill` (its wait
    for the engine and its prompt's prefill, to the first token) and `decode` (the rest). The engine
    says when a prompt is prefilled (its `Started` event); the token counts come in its events
    (`runtime.worker.host.trace_event` reads them)."""

    span: trace.Span
    started_ns: int
    prefilled_ns: int = 0
    tokens: int = 0
    ended: bool = False
    attributes: dict[str, str | int | float] = field(default_factory=dict)

    def prefilled(self, prompt_tokens: int, cached_tokens: int) -> None:
        """The prompt went in: the prefill phase ends here."""
        if self.ended or self.prefilled_ns:
            return
        self.prefilled_ns = time.time_ns()
        self.attributes["gen_ai.usage.input_tokens"] = prompt_tokens
        self.attributes["modelhost.cached_tokens"] = cached_tokens

    def generated(self, tokens: int) -> None:
        self.tokens = tokens

    def end(self, finish: str | None = None, failed: bool = False) -> None:
        """The generation's last event (`finish`: why it ended; `failed`), or its cancel."""
        if self.ended:
            return
        self.ended, ended = True, time.time_ns()
        span, attributes = self.span, self.attributes
        attributes["gen_ai.usage.output_tokens"] = self.tokens
        if finish is not None:
            span.set_attribute("gen_ai.response.finish_reasons", [finish])
        if failed:
            span.set_status(trace.StatusCode.ERROR)
        if self.prefilled_ns:
            attributes["gen_ai.server.time_to_first_token"] = (self.prefilled_ns - self.started_ns) / 1e9
            if self.tokens > 1:
                per_token = (ended - self.prefilled_ns) / 1e9 / (self.tokens - 1)
                attributes["gen_ai.server.time_per_output_token"] = per_token
            _phase(span, "prefill", self.started_ns, self.prefilled_ns)
            _phase(span, "decode", self.prefilled_ns, ended, {"gen_ai.usage.output_tokens": self.tokens})
        span.set_attributes(attributes)
        span.end(end_time=ended)


def generation_trace(traceparent: str, deployment: str, engine: str) -> GenerationTrace | None:
    """The trace of a generation a replica starts (None while tracing is off or the request untraced)."""
    if not ENABLED or not traceparent:
        return None
    started = time.time_ns()
    attributes = {"modelhost.deployment": deployment, "modelhost.engine": engine}
    return GenerationTrace(_replica_span("generate", traceparent, attributes, started), started)


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


async def within(
    make_span: Callable[[], trace.Span], work: Awaitable[T], stopped: tuple[type[BaseException], ...] = ()
) -> T:
    """Await `work` with the span `make_span` makes current (made only while tracing is on: off, the
    work is awaited alone), and end the span with it. Current, so that what the work sends on (the
    replica protocol's `parent`, an in-process request) joins the span's trace. An exception marks the
    span an error (`error.type`: a modelhost error's code, else the exception's class), but for a cancel
    and the `stopped` ones, which end the work without failing it (a deleted run)."""
    if not ENABLED:
        return await work
    span = make_span()
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
