"""A batch line's answer as its output or error file holds it: one JSON line each, as OpenAI writes
them, with the tokens its answer used (`batches.store` records them, `batches.runner` makes them)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import orjson

USAGE = re.compile(rb'"usage"\s*:')
INPUT_TOKENS = re.compile(rb'"(input_tokens|prompt_tokens)"\s*:\s*(\d+)')
OUTPUT_TOKENS = re.compile(rb'"(output_tokens|completion_tokens)"\s*:\s*(\d+)')
EXPIRED_LINE = {
    "code": "batch_expired",
    "message": "This request could not be executed before the completion window expired.",
}


@dataclass(frozen=True, slots=True)
class Answer:
    """One line's answer: its line of the output file (`ok`) or of the error file, as JSON, and the
    input and output tokens it used."""

    line: int
    ok: bool
    record: bytes
    tokens: tuple[int, int] = (0, 0)


def answered(batch_id: str, line: int, custom_id: str, status: int, request_id: str, body: bytes) -> Answer:
    """A line the app answered: a 2xx goes to the output file, any other answer to the error file. The
    answer's JSON body goes into the line as it came (a batch of embeddings is mostly numbers: parsing
    and writing them again would cost more than the rest of the line's way)."""
    if body[:1] not in (b"{", b"["):  # not the JSON every route answers: kept as text
        body = orjson.dumps(body.decode(errors="replace"))
    head = orjson.dumps({"id": line_id(batch_id, line), "custom_id": custom_id})[:-1]
    response = b',"response":{"status_code":%d,"request_id":%s,"body":' % (status, orjson.dumps(request_id))
    return Answer(line, 200 <= status < 300, head + response + body + b'},"error":null}', _usage(body))


def failed(batch_id: str, line: int, custom_id: str, error: dict[str, str]) -> Answer:
    """A line that got no answer, or whose answer is not kept (the window passed, the key was revoked,
    the answer passed its cap, the line asked to run in the background)."""
    record = {"id": line_id(batch_id, line), "custom_id": custom_id, "response": None, "error": error}
    return Answer(line, False, orjson.dumps(record))


def line_id(batch_id: str, line: int) -> str:
    """The `id` of a line's answer: unique, and the same if the line runs again after a crash."""
    return f"batch_req_{batch_id.removeprefix('batch_')}_{line}"


def _usage(body: bytes) -> tuple[int, int]:
    """(input, output) tokens of one answer, from its body's `usage` (chat and completions name them
    prompt/completion tokens, the Responses API input/output tokens), read from the JSON text after
    its last `"usage"` key without parsing the rest. A string in the body cannot fake one: inside a
    JSON string every quote is escaped, so `"prompt_tokens":` never matches there."""
    starts = [match.start() for match in USAGE.finditer(body)]
    if not starts:
        return 0, 0
    tail = body[starts[-1] :]
    given = INPUT_TOKENS.search(tail)
    made = OUTPUT_TOKENS.search(tail)
    return int(given.group(2)) if given else 0, int(made.group(2)) if made else 0
