"""A trace drawn as a waterfall (SVG), from the spans an OTLP receiver got: the picture of one chat
request's trace in docs/operations.md is drawn by the traces test from a real trace when
`MODELHOST_TEST_TRACE_PICTURE` names the file to write."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from opentelemetry.proto.trace.v1.trace_pb2 import Span

ROW, LABEL, BAR, PAD = 22, 330, 560, 10
COLOURS = {"gateway": "#4c78a8", "replica": "#f58518"}


def save_if_asked(spans: list[tuple[dict[str, Any], Span]]) -> None:
    """Write the waterfall where `MODELHOST_TEST_TRACE_PICTURE` says, if it does."""
    target = os.environ.get("MODELHOST_TEST_TRACE_PICTURE")
    if target:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_text(waterfall(spans))


def waterfall(spans: list[tuple[dict[str, Any], Span]]) -> str:
    """One row per span, children under their parent in the order they started; each bar placed on
    the trace's time line, coloured by the process that made it."""
    rows = _in_tree_order(spans)
    start = min(span.start_time_unix_nano for _, span, _ in rows)
    end = max(span.end_time_unix_nano for _, span, _ in rows)
    scale = BAR / max(1, end - start)
    width, height = LABEL + BAR + 110, ROW * len(rows) + 2 * PAD + ROW
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{PAD}" y="{PAD + 12}" font-weight="bold">span (process)</text>',
        f'<text x="{LABEL}" y="{PAD + 12}" font-weight="bold">0 ms</text>',
        f'<text x="{LABEL + BAR}" y="{PAD + 12}" font-weight="bold" text-anchor="end">'
        f"{(end - start) / 1e6:.1f} ms</text>",
    ]
    for index, (resource, span, depth) in enumerate(rows):
        y = PAD + ROW * (index + 1)
        process = str(resource.get("modelhost.process", "?"))
        x = LABEL + (span.start_time_unix_nano - start) * scale
        bar = max(1.0, (span.end_time_unix_nano - span.start_time_unix_nano) * scale)
        took = (span.end_time_unix_nano - span.start_time_unix_nano) / 1e6
        label = escape(f"{span.name} ({process})")
        parts += [
            f'<text x="{PAD + 14 * depth}" y="{y + 15}">{label}</text>',
            f'<rect x="{x:.1f}" y="{y + 4}" width="{bar:.1f}" height="{ROW - 8}" '
            f'fill="{COLOURS.get(process, "#999")}"/>',
            f'<text x="{x + bar + 4:.1f}" y="{y + 15}" fill="#555">{took:.2f} ms</text>',
        ]
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _in_tree_order(spans: list[tuple[dict[str, Any], Span]]) -> list[tuple[dict[str, Any], Span, int]]:
    """Depth-first from the spans whose parent is not among them, each level by start time."""
    ids = {span.span_id for _, span in spans}
    children: dict[bytes, list[tuple[dict[str, Any], Span]]] = {}
    for resource, span in spans:
        parent = span.parent_span_id if span.parent_span_id in ids else b""
        children.setdefault(parent, []).append((resource, span))
    ordered: list[tuple[dict[str, Any], Span, int]] = []

    def visit(parent: bytes, depth: int) -> None:
        for resource, span in sorted(children.get(parent, []), key=lambda pair: pair[1].start_time_unix_nano):
            ordered.append((resource, span, depth))
            visit(span.span_id, depth + 1)

    visit(b"", 0)
    return ordered
