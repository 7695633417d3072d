"""A batch's input file: JSONL, one request per line, checked the way OpenAI checks it.

At upload (`purpose: batch`) the file must be JSONL of objects within the size and line limits
(`check_jsonl`): anything else is a 400 then. At batch creation its lines are checked against the batch
(`check_lines`): each a `POST` of the batch's endpoint with a body naming a model, the `custom_id`s
distinct. Line errors fail the batch (status `failed`) with `errors` naming each line, as OpenAI's do.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from modelhost.errors import InvalidRequest, PayloadTooLarge

MAX_LINES = 50_000
MAX_ERRORS = 100  # a batch's `errors` lists at most this many lines (the first ones)


@dataclass(frozen=True, slots=True)
class Line:
    """One request of a batch: its 1-based line number in the file, `custom_id`, and body."""

    number: int
    custom_id: str
    method: Any
    url: Any
    body: dict[str, Any]
    size: int = 0  # the line's bytes: lines of like size go to the model together (`batches.runner`)


@dataclass(frozen=True, slots=True)
class LineError:
    code: str
    line: int
    message: str
    param: str | None = None

    def view(self) -> dict[str, Any]:
        return {"code": self.code, "line": self.line, "message": self.message, "param": self.param}


def check_jsonl(data: bytes, max_bytes: int) -> int:
    """The number of lines of a batch input file; a 400 (413 over `max_bytes`) if it is not one."""
    if len(data) > max_bytes:
        raise PayloadTooLarge(f"A batch input file may have at most {max_bytes} bytes.", param="file")
    count = 0
    for number, _, value in _json_lines(data):
        if value is NOT_JSON or not isinstance(value, dict):
            what = "is not valid JSON" if value is NOT_JSON else "is not a JSON object"
            raise InvalidRequest(
                f"Invalid file format for Batch API. Line {number} {what}; the file must be JSONL: one "
                "JSON object per line.",
                param="file",
                code="invalid_file_format",
            )
        count += 1
    if count == 0:
        raise InvalidRequest("The batch input file is empty.", param="file", code="invalid_file_format")
    if count > MAX_LINES:
        raise InvalidRequest(
            f"A batch input file may have at most {MAX_LINES} requests; this one has {count}.",
            param="file",
            code="invalid_file_format",
        )
    return count


def parse_line(number: int, raw: bytes) -> Line | LineError:
    """One non-blank line as a request, or the reason it is not one (the file passed `check_jsonl`
    at upload, but a line may still lack a field). The runner parses each line as it sends it
    (`batches.reader`): a batch's lines are never all held at once."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return LineError("invalid_json_line", number, "This line is not parseable as valid JSON.")
    return _line(number, value, len(raw))


NOT_JSON = object()  # what `_json_lines` gives for a line that does not parse


def _json_lines(data: bytes) -> Iterator[tuple[int, bytes, Any]]:
    """(1-based line number, the line, its JSON value or NOT_JSON) of each non-blank line."""
    for number, raw in enumerate(data.splitlines(), start=1):
        if raw.strip():
            try:
                yield number, raw, orjson.loads(raw)
            except orjson.JSONDecodeError:
                yield number, raw, NOT_JSON


def _line(number: int, value: Any, size: int) -> Line | LineError:
    if not isinstance(value, dict):
        return LineError("invalid_json_line", number, "This line is not a JSON object.")
    custom_id = value.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return LineError("missing_required_parameter", number, "Missing or empty 'custom_id'.", "custom_id")
    body = value.get("body")
    if not isinstance(body, dict):
        return LineError("missing_required_parameter", number, "'body' must be a JSON object.", "body")
    return Line(number, custom_id, value.get("method", "POST"), value.get("url"), body, size)


def check_lines(
    parsed: Iterable[Line | LineError], endpoint: str, unknown_model: Callable[[str], str | None]
) -> list[LineError]:
    """The errors of the lines wrong for the batch (at most MAX_ERRORS), read one at a time.
    `unknown_model(model) -> str | None` says why a line's model cannot serve the endpoint."""
    errors: list[LineError] = []
    seen: set[bytes] = set()  # digests of the custom_ids: small, however long the IDs
    verdicts: dict[str, str | None] = {}  # a model is looked up once
    for item in parsed:
        if isinstance(item, LineError):
            errors.append(item)
            continue
        digest = hashlib.blake2b(item.custom_id.encode(), digest_size=16).digest()
        error = _wrong_for_batch(item, endpoint, digest in seen)
        if error is None:
            model = str(item.body["model"])
            if model not in verdicts:
                verdicts[model] = unknown_model(model)
            reason = verdicts[model]
            if reason is not None:
                error = LineError("model_not_found", item.number, reason, "body.model")
        seen.add(digest)
        if error is not None:
            errors.append(error)
            if len(errors) >= MAX_ERRORS:
                break
    return errors


def _wrong_for_batch(line: Line, endpoint: str, duplicate: bool) -> LineError | None:
    if duplicate:
        return LineError(
            "duplicate_custom_id",
            line.number,
            "The custom_id for this request is a duplicate of another request. The custom_id parameter "
            "must be unique for each request in a batch.",
            "custom_id",
        )
    if line.method != "POST":
        return LineError("invalid_method", line.number, "The method must be POST.", "method")
    if line.url != endpoint:
        return LineError(
            "invalid_url",
            line.number,
            f"The URL provided for this request ({line.url!r}) does not match the batch "
            f"endpoint ({endpoint}).",
            "url",
        )
    if not isinstance(line.body.get("model"), str):
        return LineError("missing_required_parameter", line.number, "'body.model' is required.", "body.model")
    if line.body.get("stream"):
        return LineError(
            "invalid_request", line.number, "Batch requests cannot stream; leave 'stream' out.", "body.stream"
        )
    return None
