"""Readable tables for people, `--json` for scripts."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

out = Console()


def show(data: Any, columns: Sequence[str], as_json: bool, title: str | None = None) -> None:
    """Print one object or a list of objects (or an OpenAI-style `{"data": [...]}` list)."""
    if as_json:
        print(json.dumps(data, indent=2))
        return
    items = data.get("data", data) if isinstance(data, dict) and "data" in data else data
    if isinstance(items, dict):
        items = [items]
    table = Table(title=title)
    for column in columns:
        # Fold instead of truncating with "…": IDs and one-time secrets must print whole.
        table.add_column(column, overflow="fold")
    for item in items:
        # Text(...): server data is never interpreted as rich markup.
        table.add_row(*(Text(_cell(item.get(column))) for column in columns))
    out.print(table)
    for item in items:
        if item.get("api_key"):
            out.print(f"api_key: {item['api_key']}", soft_wrap=True, markup=False, highlight=False)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    if isinstance(value, dict):  # `limits`: those set
        return ", ".join(f"{k}={v}" for k, v in value.items() if v is not None) or "-"
    return str(value)
