"""A query parameter that takes one value, given more than once, is a 400 naming it.

FastAPI keeps the last of a repeated parameter that takes one value (`?target_type=a&target_type=b`
reads as `b`) and answers as if the others were not there: a request that says two things is answered
for one of them. Every route's parameters are checked here, by one app-wide dependency
(`api.app.create_app`), so a route added later is covered too (tests/test_openapi_fuzz.py sends such
requests). Parameters that take a list (`include[]`, `status`) may repeat."""

from __future__ import annotations

import collections
import types
import typing
from collections.abc import Iterator
from typing import Any

from fastapi import Request
from pydantic import BaseModel

from modelhost.errors import InvalidRequest

_MANY = (list, tuple, set, frozenset, collections.abc.Sequence, collections.abc.Set)
# the query parameters taking one value, by route (its path and methods: Starlette's routes are not
# hashable, and an ID could be a collected route's again)
_single_names: dict[tuple[str, frozenset[str]], frozenset[str]] = {}


def one_value_each(request: Request) -> None:
    """The dependency: InvalidRequest where a parameter that takes one value is repeated."""
    if not request.scope.get("query_string"):
        return
    route = request.scope.get("route")
    if route is None or not hasattr(route, "dependant"):
        return
    which = (route.path, frozenset(route.methods or ()))
    single = _single_names.get(which)
    if single is None:
        single = _single_names[which] = frozenset(
            name for name, annotation in _query_fields(route.dependant) if not _takes_many(annotation)
        )
    counts = collections.Counter(name for name, _ in request.query_params.multi_items())
    for name, count in counts.items():
        if count > 1 and name in single:
            raise InvalidRequest(f"`{name}` is given more than once; it takes one value.", param=name)


def _query_fields(dependant: Any) -> Iterator[tuple[str, Any]]:
    """(name in the query, annotation) of every query parameter of a route's dependant and its
    dependencies; a parameter model's fields one by one."""
    for field in dependant.query_params:
        annotation = field.field_info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            for name, info in annotation.model_fields.items():
                yield info.alias or name, info.annotation
        else:
            yield field.alias, annotation
    for sub in dependant.dependencies:
        yield from _query_fields(sub)


def _takes_many(annotation: Any) -> bool:
    """Whether a parameter's type takes several values (a list, a set, ...), through `Annotated`,
    `Optional` and unions."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _takes_many(typing.get_args(annotation)[0])
    if origin is typing.Union or origin is types.UnionType:
        return any(_takes_many(arg) for arg in typing.get_args(annotation))
    target = origin or annotation
    return isinstance(target, type) and issubclass(target, _MANY) and not issubclass(target, str | bytes)
