"""A batch's input file: JSONL, one request per line, checked the way OpenAI checks it.

At upload (`purpose: batch`) the file must be JSONL of objects within the size and line limits, and no
line may be one the server would refuse to run whatever the batch (`JsonlCheck`, fed as the bytes
arrive): anything else is a 400 then, naming the first bad line. At batch creation its lines are
checked against the batch (`check_lines`): each a `POST` of the batch's endpoint with a body naming a
model, the `custom_id`s distinct. Line errors fail the batch (status `failed`) with `errors` naming each
line, as OpenAI's do.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

import orjson

from modelhost.errors import InvalidRequest, PayloadTooLarge

MAX_LINES = 50_000
MAX_ERRORS = 100  # a batch's `errors` lists at most this many lines (the first ones)
MAX_CUSTOM_ID = 512  # characters of a line's `custom_id` (OpenAI states none; its answers echo it)
# Levels of nesting of a line (the line's own object is one). orjson, which encodes every answer,
# refuses 255 levels; half that leaves room for whatever an answer nests a request's body in.
MAX_DEPTH = 128
SHOWN = 64  # characters of a client's value that an error message quotes (`shown`)


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


def shown(value: object, limit: int = SHOWN) -> str:
    """A client's value as an error message quotes it: its `repr`, cut to `limit` characters, so that
    an answer never carries back more than a bounded part of what was sent."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


class JsonlCheck:
    """A batch input file checked as its bytes arrive (`feed`, then `finish`): the first bad line is a
    400 naming it, found without reading further, and the file is never held whole: only the line
    being read is (at most `max_line_bytes`: one line is one request). Lines are split as
    `bytes.splitlines` splits them (`\\n`, `\\r\\n` or `\\r`), so that line numbers agree with
    the runner's (`batches.reader`).

    A line is refused when it is not a JSON object, is longer than `max_line_bytes`, nests deeper than
    `MAX_DEPTH`, has a `custom_id` longer than `MAX_CUSTOM_ID`, or asks to run in the background
    (`body.background`: a batch line already does, and a background response would escape the bound
    on the batch's lines in flight); the 50,001st request is refused before it is parsed."""

    def __init__(self, max_bytes: int, max_line_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.max_line_bytes = max_line_bytes
        self.size = 0
        self.requests = 0
        self._number = 0  # lines read so far, blank ones included
        self._pending = bytearray()  # the line being read: no line break seen after it yet

    def feed(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.max_bytes:
            raise PayloadTooLarge(
                f"A batch input file may have at most {self.max_bytes} bytes.", param="file"
            )
        self._pending += chunk
        # Complete lines only: a final `\r` waits, as the next chunk may begin with its `\n`. What
        # was pending before this chunk holds no line break (but that `\r`): only the rest is searched.
        start = max(0, len(self._pending) - len(chunk) - 1)
        stop = len(self._pending) - int(self._pending.endswith(b"\r"))
        pending = self._pending
        end = max(pending.rfind(b"\n", start, stop), pending.rfind(b"\r", start, stop))
        if end >= 0:
            complete = bytes(self._pending[: end + 1])
            del self._pending[: end + 1]
            self._lines(complete.splitlines())
        if len(self._pending) > self.max_line_bytes:
            self._too_long(self._number + 1)

    def finish(self) -> int:
        """The number of requests; a 400 if the file has none."""
        self._lines(bytes(self._pending).splitlines())
        self._pending.clear()
        if self.requests == 0:
            raise InvalidRequest("The batch input file is empty.", param="file", code="invalid_file_format")
        return self.requests

    def _lines(self, lines: list[bytes]) -> None:
        for raw in lines:
            self._number += 1
            if raw.strip():
                self._check(self._number, raw)

    def _check(self, number: int, raw: bytes) -> None:
        if len(raw) > self.max_line_bytes:
            self._too_long(number)
        self.requests += 1
        if self.requests > MAX_LINES:
            _refuse(
                number,
                f"is request {MAX_LINES + 1}; a batch input file may have at most {MAX_LINES} requests",
            )
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            deep = "depth" in str(exc)
            _refuse(number, f"nests deeper than {MAX_DEPTH} levels" if deep else "is not valid JSON")
        if not isinstance(value, dict):
            _refuse(number, "is not a JSON object; the file must be JSONL: one JSON object per line")
        reason = refusal(value, raw)
        if reason is not None:
            _refuse(number, reason)

    def _too_long(self, number: int) -> None:
        _refuse(
            number,
            f"has more than {self.max_line_bytes} bytes; a line is one request, at most the request body "
            "limit (MODELHOST_MAX_BODY_BYTES)",
        )


def refusal(line: dict[str, Any], raw: bytes) -> str | None:
    """Why a line (a JSON object, `raw` its text) can run in no batch, or None."""
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH and _deeper_than(line, MAX_DEPTH):
        return f"nests deeper than {MAX_DEPTH} levels"
    custom_id = line.get("custom_id")
    if isinstance(custom_id, str) and len(custom_id) > MAX_CUSTOM_ID:
        return f"has a 'custom_id' of more than {MAX_CUSTOM_ID} characters"
    body = line.get("body")
    if isinstance(body, dict) and body.get("background") not in (None, False):
        return (
            "asks for 'body.background'; a batch's lines already run in the background, so leave "
            "'background' out"
        )
    return None


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether `value` nests more than `limit` levels of objects and arrays (its own counts one)."""
    level: list[Iterator[Any]] = [iter(value.values() if isinstance(value, dict) else value)]
    while level:
        for item in level[-1]:
            if isinstance(item, dict | list):
                if len(level) >= limit:
                    return True
                level.append(iter(item.values() if isinstance(item, dict) else item))
                break
        else:
            level.pop()
    return False


def _refuse(number: int, what: str) -> NoReturn:
    raise InvalidRequest(
        f"Invalid file format for Batch API. Line {number} {what}.", param="file", code="invalid_file_format"
    )


def check_jsonl(chunks: Iterable[bytes], max_bytes: int, max_line_bytes: int) -> int:
    """The number of requests of a batch input file read in `chunks` (`JsonlCheck`); a 400 (413 over
    `max_bytes`) if it is not one."""
    check = JsonlCheck(max_bytes, max_line_bytes)
    for chunk in chunks:
        check.feed(chunk)
    return check.finish()


def parse_line(number: int, raw: bytes) -> Line | LineError:
    """One non-blank line as a request, or the reason it is not one (the file passed `check_jsonl`
    at upload, but a line may still lack a field). The runner parses each line as it sends it
    (`batches.reader`): a batch's lines are never all held at once."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return LineError("invalid_json_line", number, "This line is not parseable as valid JSON.")
    reason = refusal(value, raw) if isinstance(value, dict) else None
    if reason is not None:  # a file uploaded before these were refused at upload
        return LineError("invalid_request", number, f"This line {reason}.")
    return _line(number, value, len(raw))


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
            f"The URL provided for this request ({shown(line.url)}) does not match the batch "
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
