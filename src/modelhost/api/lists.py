"""The query parameters and the answer of every cursor-paged list route (`after`, `limit`, `order`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Query

After = Annotated[str | None, Query(description="ID of the last item of the previous page.")]
Limit = Annotated[int, Query(ge=1, le=100)]
Order = Annotated[Literal["asc", "desc"], Query(description="`desc`: newest first.")]


def list_body(items: list[dict[str, Any]], more: bool) -> dict[str, Any]:
    first, last = (items[0]["id"], items[-1]["id"]) if items else (None, None)
    return {"object": "list", "data": items, "first_id": first, "last_id": last, "has_more": more}
