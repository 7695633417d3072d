"""How a route sends a typed answer: the pydantic model the serving layer shaped, written by orjson.

`model_dump` applies the models' own rules (a field absent when it is not asked for, `exclude_if`), and
orjson writes the fields in their declared order, as the routes wrote their dict literals before; the
route's `response_model` declares the same model, so /openapi.json documents what is sent. FastAPI is not
asked to serialize the return value: it would validate the model a second time and write it with the
standard library's `json`.
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson
from fastapi import Response
from pydantic import BaseModel


def json_answer(
    answer: BaseModel, status_code: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(
        orjson.dumps(answer.model_dump()),
        status_code=status_code,
        media_type="application/json",
        headers=headers,
    )
