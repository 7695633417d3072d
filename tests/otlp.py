"""A real OTLP/HTTP receiver for the trace tests: what a live server exports, decoded with
opentelemetry-proto (shared by tests/test_traces.py and tests/test_trace_links.py)."""

from __future__ import annotations

import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

Json = dict[str, Any]


class Receiver:
    """An OTLP receiver: each export decoded into (resource attributes, span) pairs. Over HTTP
    (`POST /v1/traces`, protobuf bodies), or over gRPC (the collector's `TraceService`) for
    `protocol="grpc"`; `url` is what `OTEL_EXPORTER_OTLP_ENDPOINT` names."""

    def __init__(self, protocol: str = "http/protobuf") -> None:
        self.spans: list[tuple[dict[str, Any], Span]] = []
        self.posts = 0
        self._lock = threading.Lock()
        self._grpc: Any = None
        if protocol == "grpc":
            self._serve_grpc()
            return
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.take(ExportTraceServiceRequest.FromString(body))
                self.send_response(200 if self.path == "/v1/traces" else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _serve_grpc(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

        receiver = self

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: ExportTraceServiceRequest, context: Any) -> ExportTraceServiceResponse:
                receiver.take(request)
                return ExportTraceServiceResponse()

        self._grpc = grpc.server(ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), self._grpc)
        port = self._grpc.add_insecure_port("127.0.0.1:0")
        self._grpc.start()
        self.url = f"http://127.0.0.1:{port}"

    def take(self, request: ExportTraceServiceRequest) -> None:
        with self._lock:
            self.posts += 1
            for resource_spans in request.resource_spans:
                resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    self.spans += [(resource, span) for span in scope_spans.spans]

    def of_trace(self, trace_id: str) -> list[tuple[dict[str, Any], Span]]:
        return [(r, s) for r, s in self.spans if s.trace_id.hex() == trace_id]

    def wait_for(self, trace_id: str, names: set[str], timeout: float = 30) -> dict[str, tuple[Json, Span]]:
        """The spans of a trace by name, once every one named has arrived."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = {span.name: (resource, span) for resource, span in self.of_trace(trace_id)}
            if names <= found.keys():
                return found
            time.sleep(0.05)
        raise AssertionError(f"spans {names} of {trace_id} not received; got {sorted(found)}")

    def close(self) -> None:
        if self._grpc is not None:
            self._grpc.stop(grace=None)
            return
        self.server.shutdown()
        self.server.server_close()


def _value(value: Any) -> Any:
    return getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None


def attributes_of(span: Span) -> dict[str, Any]:
    return {a.key: _value(a.value) for a in span.attributes}


def client_traceparent() -> tuple[str, str, str]:
    """A client's own trace: (its `traceparent` header, the trace ID, the client span's ID)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def exporting_to(receiver: Receiver, sampler: str = "parentbased_always_on") -> dict[str, str]:
    """The environment of a server (and its replica workers) that exports its traces to `receiver` at
    once (the batch processor's delay cut to 50 ms): every trace sampled, or as `sampler` says."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_TRACES_SAMPLER": sampler,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
