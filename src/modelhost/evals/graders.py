"""The graders of an eval's testing criteria, as OpenAI names them (docs/evals.md): pure functions of a
criterion, an item and a sample, testable without a server.

- `string_check`: `operation` `eq`, `ne`, `like` (the reference is in the input), `ilike` (the same,
  case-insensitive) between two rendered templates; score 1 or 0.
- `text_similarity`: a score from 0 to 1 between the rendered input and reference, passed at or above
  `pass_threshold`: `fuzzy_match` (rapidfuzz's normalised Indel similarity, `fuzz.ratio` / 100), `bleu`
  and `gleu` (NLTK's sentence BLEU, smoothed, and sentence GLEU, on whitespace tokens) and `rouge_1` …
  `rouge_5`, `rouge_l` (Google's rouge-score, its F-measure, with stemming). `meteor` needs WordNet's
  data, which no package ships, and `cosine` an embeddings model: both are refused with a 400.
- `score_model` and `label_model`: a call of one of the account's deployments (`model_request` builds
  the chat request, `score_of` / `label_of` read its answer); the runner sends it.
- `python` is refused: it would run a tenant's code in the gateway, which serves every account (the
  isolation rule: a tenant's input is only parsed, or compiled under bounds, never run).

`checked` validates a list of criteria once, when an eval is created or updated, with a 400 naming the
field that is wrong; the runner grades only criteria that passed it.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

import orjson

from modelhost.errors import InvalidRequest
from modelhost.evals.templates import references, render

MAX_CRITERIA = 32
MAX_TEMPLATE = 64 * 1024
STRING_OPERATIONS = ("eq", "ne", "like", "ilike")
ROUGES = ("rouge_1", "rouge_2", "rouge_3", "rouge_4", "rouge_5", "rouge_l")
METRICS = ("fuzzy_match", "bleu", "gleu", *ROUGES)
REFUSED_METRICS = {
    "meteor": "needs WordNet's data, which no installed package ships",
    "cosine": "needs an embeddings model of OpenAI's",
}
MODEL_GRADERS = ("score_model", "label_model")
REFUSED_TYPES = {
    "python": "A 'python' grader would run your code in the gateway, which serves every account; "
    "modelhost runs no tenant code there. Use 'string_check', 'text_similarity', 'score_model' or "
    "'label_model'.",
    "multi": "A 'multi' grader is not supported; give each grader as a testing criterion of its own.",
}
GRADER_MAX_TOKENS = 64
Item = Mapping[str, Any]
Sample = Mapping[str, Any]


def checked(criteria: Any) -> list[dict[str, Any]]:
    """The criteria as stored, each with its `name`; InvalidRequest naming the first wrong field."""
    if not isinstance(criteria, list) or not criteria:
        raise InvalidRequest("'testing_criteria' must be a non-empty list.", param="testing_criteria")
    if len(criteria) > MAX_CRITERIA:
        raise InvalidRequest(
            f"An eval has at most {MAX_CRITERIA} testing criteria.", param="testing_criteria"
        )
    out = [_checked_one(c, f"testing_criteria[{i}]") for i, c in enumerate(criteria)]
    names = [c["name"] for c in out]
    if len(set(names)) != len(names):
        raise InvalidRequest("Each testing criterion needs a name of its own.", param="testing_criteria")
    return out


def _checked_one(criterion: Any, where: str) -> dict[str, Any]:
    if not isinstance(criterion, dict):
        raise InvalidRequest(f"{where} must be an object.", param=where)
    kind = criterion.get("type")
    if kind in REFUSED_TYPES:
        raise InvalidRequest(REFUSED_TYPES[str(kind)], param=f"{where}.type")
    check = CHECKS.get(kind) if isinstance(kind, str) else None
    if check is None:
        kinds = ", ".join(f"'{k}'" for k in CHECKS)
        raise InvalidRequest(f"{where}.type must be one of {kinds}.", param=f"{where}.type")
    name = criterion.get("name", kind)
    if not isinstance(name, str) or not 0 < len(name) <= 256:
        raise InvalidRequest(f"{where}.name must be a string of 1 to 256 characters.", param=f"{where}.name")
    return {**check(criterion, where), "type": kind, "name": name}


def _template(criterion: Mapping[str, Any], field: str, where: str) -> str:
    value = criterion.get(field)
    if not isinstance(value, str) or len(value) > MAX_TEMPLATE:
        raise InvalidRequest(
            f"{where}.{field} must be a template string of at most {MAX_TEMPLATE} characters.",
            param=f"{where}.{field}",
        )
    return value


def _number(criterion: Mapping[str, Any], field: str, where: str, default: float | None = None) -> float:
    value = criterion.get(field, default)
    if not _is_number(value):
        raise InvalidRequest(f"{where}.{field} must be a number.", param=f"{where}.{field}")
    return float(value)


def _string_check(criterion: Mapping[str, Any], where: str) -> dict[str, Any]:
    operation = criterion.get("operation")
    if operation not in STRING_OPERATIONS:
        raise InvalidRequest(
            f"{where}.operation must be one of {', '.join(STRING_OPERATIONS)}.", param=f"{where}.operation"
        )
    return {
        "input": _template(criterion, "input", where),
        "reference": _template(criterion, "reference", where),
        "operation": operation,
    }


def _text_similarity(criterion: Mapping[str, Any], where: str) -> dict[str, Any]:
    metric = criterion.get("evaluation_metric")
    if metric in REFUSED_METRICS:
        raise InvalidRequest(
            f"The evaluation metric '{metric}' is not supported: it {REFUSED_METRICS[str(metric)]}. "
            f"Use one of {', '.join(METRICS)}.",
            param=f"{where}.evaluation_metric",
        )
    if metric not in METRICS:
        raise InvalidRequest(
            f"{where}.evaluation_metric must be one of {', '.join(METRICS)}.",
            param=f"{where}.evaluation_metric",
        )
    threshold = _number(criterion, "pass_threshold", where)
    return {
        "input": _template(criterion, "input", where),
        "reference": _template(criterion, "reference", where),
        "evaluation_metric": metric,
        "pass_threshold": threshold,
    }


def _model_grader(criterion: Mapping[str, Any], where: str) -> dict[str, Any]:
    model = criterion.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest(f"{where}.model must name one of your deployments.", param=f"{where}.model")
    messages = criterion.get("input")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest(f"{where}.input must be a non-empty list of messages.", param=f"{where}.input")
    out: dict[str, Any] = {
        "model": model,
        "input": [checked_message(m, f"{where}.input[{i}]") for i, m in enumerate(messages)],
    }
    params = criterion.get("sampling_params")
    if params is not None:
        out["sampling_params"] = sampling_params(params, f"{where}.sampling_params")
    if criterion["type"] == "label_model":
        labels, passing = criterion.get("labels"), criterion.get("passing_labels")
        if not _strings(labels):
            raise InvalidRequest(
                f"{where}.labels must be a non-empty list of strings.", param=f"{where}.labels"
            )
        if not _strings(passing) or not set(passing or ()) <= set(labels or ()):
            raise InvalidRequest(
                f"{where}.passing_labels must be a non-empty list of some of its labels.",
                param=f"{where}.passing_labels",
            )
        return {**out, "labels": labels, "passing_labels": passing}
    bounds = criterion.get("range", [0, 1])
    if not (isinstance(bounds, list) and len(bounds) == 2 and all(_is_number(x) for x in bounds)):
        raise InvalidRequest(f"{where}.range must be [min, max], min < max.", param=f"{where}.range")
    low, high = float(bounds[0]), float(bounds[1])
    if not low < high:
        raise InvalidRequest(f"{where}.range must be [min, max], min < max.", param=f"{where}.range")
    threshold = _number(criterion, "pass_threshold", where, (low + high) / 2)
    return {**out, "range": [low, high], "pass_threshold": threshold}


def checked_message(message: Any, where: str) -> dict[str, str]:
    if not isinstance(message, dict) or message.get("role") not in (
        "system",
        "developer",
        "user",
        "assistant",
    ):
        raise InvalidRequest(
            f"{where} must be a message with a role (system, developer, user, assistant).", param=where
        )
    content = message.get("content")
    if isinstance(content, dict) and content.get("type") in ("input_text", "output_text"):
        content = content.get("text")
    if not isinstance(content, str) or len(content) > MAX_TEMPLATE:
        raise InvalidRequest(
            f"{where}.content must be a template string of at most {MAX_TEMPLATE} characters.",
            param=f"{where}.content",
        )
    return {"role": message["role"], "content": content}


def sampling_params(params: Any, where: str) -> dict[str, Any]:
    """OpenAI's `sampling_params` of a run or a model grader: temperature, top_p, seed, max tokens."""
    if not isinstance(params, dict):
        raise InvalidRequest(f"{where} must be an object.", param=where)
    out: dict[str, Any] = {}
    for name in ("temperature", "top_p"):
        if params.get(name) is not None:
            out[name] = _number(params, name, where)
    for name in ("seed", "max_completion_tokens", "max_completions_tokens", "max_tokens"):
        value = params.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31:
            raise InvalidRequest(f"{where}.{name} must be a non-negative integer.", param=f"{where}.{name}")
        out["seed" if name == "seed" else "max_completion_tokens"] = value
    return out


def _strings(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, str) and v for v in value)


def _is_number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        return False


CHECKS: dict[str, Callable[[Mapping[str, Any], str], dict[str, Any]]] = {
    "string_check": _string_check,
    "text_similarity": _text_similarity,
    "score_model": _model_grader,
    "label_model": _model_grader,
}


def reads_sample(criterion: Mapping[str, Any]) -> bool:
    """Whether a checked criterion's templates reference the sample (`{{sample...}}`)."""
    templates = [criterion.get("input"), criterion.get("reference")]
    if isinstance(criterion.get("input"), list):
        templates = [m["content"] for m in criterion["input"]]
    return any(space == "sample" for t in templates if isinstance(t, str) for space, _ in references(t))


# ------------------------------------------------------------------------------ grading


def result(criterion: Mapping[str, Any], score: float | None, passed: bool, **extra: Any) -> dict[str, Any]:
    """One criterion's result for one item, as an output item's `results` lists them."""
    return {"name": criterion["name"], "type": criterion["type"], "score": score, "passed": passed, **extra}


def grade(criterion: Mapping[str, Any], item: Item, sample: Sample) -> dict[str, Any]:
    """The result of a `string_check` or `text_similarity` criterion on one item and its sample."""
    values = {"item": item, "sample": sample}
    given, reference = render(criterion["input"], values), render(criterion["reference"], values)
    if criterion["type"] == "string_check":
        passed = string_check(given, reference, criterion["operation"])
        return result(criterion, 1.0 if passed else 0.0, passed)
    score = similarity(given, reference, criterion["evaluation_metric"])
    return result(criterion, score, score >= criterion["pass_threshold"])


def string_check(given: str, reference: str, operation: str) -> bool:
    if operation == "eq":
        return given == reference
    if operation == "ne":
        return given != reference
    if operation == "like":
        return reference in given
    return reference.casefold() in given.casefold()  # ilike


def similarity(given: str, reference: str, metric: str) -> float:
    """A score from 0 to 1 of `given` against `reference` by one of METRICS."""
    if metric == "fuzzy_match":
        from rapidfuzz import fuzz

        return float(fuzz.ratio(given, reference)) / 100
    if metric in ("bleu", "gleu"):
        return _ngram_score(given, reference, metric)
    name = "rougeL" if metric == "rouge_l" else f"rouge{metric[-1]}"
    return float(_rouge(name).score(reference, given)[name].fmeasure)


def _ngram_score(given: str, reference: str, metric: str) -> float:
    hypothesis, references = given.split(), [reference.split()]
    if not hypothesis or not references[0]:
        return float(hypothesis == references[0])
    if metric == "gleu":
        from nltk.translate.gleu_score import sentence_gleu

        return float(sentence_gleu(references, hypothesis))
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

    with warnings.catch_warnings():  # NLTK warns of short sentences; smoothing is the answer
        warnings.simplefilter("ignore")
        return float(sentence_bleu(references, hypothesis, smoothing_function=SmoothingFunction().method1))


@cache
def _rouge(name: str) -> Any:
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer([name], use_stemmer=True)


# ------------------------------------------------------------------------------ model graders


def model_request(criterion: Mapping[str, Any], item: Item, sample: Sample) -> dict[str, Any]:
    """The chat request a `score_model` or `label_model` criterion sends for one item: its messages
    rendered, and its answer constrained to OpenAI's shape (`{"result": ...}`) by a JSON schema."""
    values = {"item": item, "sample": sample}
    messages = [{"role": m["role"], "content": render(m["content"], values)} for m in criterion["input"]]
    if criterion["type"] == "label_model":
        answer: dict[str, Any] = {"type": "string", "enum": criterion["labels"]}
    else:
        low, high = criterion["range"]
        answer = {"type": "number", "minimum": low, "maximum": high}
    schema = {"type": "object", "properties": {"result": answer}, "required": ["result"]}
    params = {
        "max_completion_tokens": GRADER_MAX_TOKENS,
        "temperature": 0,
        **criterion.get("sampling_params", {}),
    }
    return {
        "model": criterion["model"],
        "messages": messages,
        "response_format": {"type": "json_schema", "json_schema": {"name": "grade", "schema": schema}},
        **params,
    }


NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def model_result(criterion: Mapping[str, Any], answer: str) -> dict[str, Any]:
    """The result of a model grader from its answer's text (`{"result": ...}`, or plain text)."""
    found: Any = None
    try:
        parsed = orjson.loads(answer)
        found = parsed.get("result") if isinstance(parsed, dict) else None
    except orjson.JSONDecodeError:
        pass
    if criterion["type"] == "label_model":
        label = found if isinstance(found, str) else answer.strip()
        if label not in criterion["labels"]:
            return result(
                criterion, None, False, error="The grader's answer is none of the labels.", output=answer
            )
        passed = label in criterion["passing_labels"]
        return result(criterion, 1.0 if passed else 0.0, passed, label=label, output=answer)
    score = score_of(found, answer, criterion["range"])
    if score is None:
        return result(criterion, None, False, error="The grader's answer has no score.", output=answer)
    return result(criterion, score, score >= criterion["pass_threshold"], output=answer)


def score_of(found: Any, answer: str, bounds: list[float]) -> float | None:
    """The score a grader answered, within its range; None if it gave none."""
    if not _is_number(found):
        match = NUMBER.search(answer)
        found = float(match.group()) if match else None
    if found is None or not _is_number(found):
        return None
    return min(max(float(found), bounds[0]), bounds[1])
