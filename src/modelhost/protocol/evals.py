"""OpenAI's Evals API (issue 74; docs/evals.md): what an eval and a run are created with, and the objects
answered. The configs, criteria and data sources are checked by `modelhost.evals` (each wrong field a 400
that names it and says why), so that a refused grader (`python`) says why it is refused."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from modelhost.protocol.batches import Metadata
from modelhost.protocol.common import PageOf, StrictModel

Name = Annotated[str, Field(max_length=256)]


class EvalCreateRequest(StrictModel):
    name: Name | None = None
    data_source_config: dict[str, Any] = Field(
        description="`{type: custom, item_schema, include_sample_schema}` "
        "(`stored_completions` and `logs`: 400); each run's items must conform to `item_schema`, "
        "a JSON Schema (Draft 2020-12 by default) that references nothing outside itself."
    )
    testing_criteria: list[dict[str, Any]] = Field(
        description="Graders: `string_check`, `text_similarity`, `score_model`, `label_model` "
        "(`python`: 400)."
    )
    metadata: Metadata | None = None


class EvalUpdateRequest(StrictModel):
    name: Name | None = None
    metadata: Metadata | None = None


class RunCreateRequest(StrictModel):
    name: Name | None = None
    data_source: dict[str, Any] = Field(
        description="`jsonl` or `completions`, its source `file_content` or `file_id` (`responses`: 400); "
        "an item that does not conform to the eval's `item_schema` is a 400 naming it."
    )
    metadata: Metadata | None = None


class EvalObject(BaseModel):
    object: Literal["eval"] = "eval"
    id: str
    name: str | None
    data_source_config: dict[str, Any]
    testing_criteria: list[dict[str, Any]]
    created_at: int
    metadata: dict[str, str] | None


class ResultCounts(BaseModel):
    total: int
    passed: int
    failed: int
    errored: int


class CriterionResult(BaseModel):
    testing_criteria: str
    passed: int
    failed: int


class ModelUsage(BaseModel):
    model_name: str
    invocation_count: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cached_tokens: int


class EvalRunObject(BaseModel):
    object: Literal["eval.run"] = "eval.run"
    id: str
    eval_id: str
    name: str | None
    status: Literal["queued", "in_progress", "completed", "canceled", "failed"]
    model: str | None
    data_source: dict[str, Any]
    created_at: int
    error: dict[str, Any] | None
    metadata: dict[str, str] | None
    report_url: str | None
    result_counts: ResultCounts
    per_testing_criteria_results: list[CriterionResult]
    per_model_usage: list[ModelUsage]


class OutputItemObject(BaseModel):
    object: Literal["eval.run.output_item"] = "eval.run.output_item"
    id: str
    run_id: str
    eval_id: str
    created_at: int
    status: Literal["pass", "fail", "error"]
    datasource_item_id: int
    datasource_item: dict[str, Any]
    results: list[dict[str, Any]]
    sample: dict[str, Any] | None


class EvalDeleted(BaseModel):
    object: Literal["eval.deleted"] = "eval.deleted"
    deleted: bool
    eval_id: str


class RunDeleted(BaseModel):
    object: Literal["eval.run.deleted"] = "eval.run.deleted"
    deleted: bool
    run_id: str


EvalList = PageOf[EvalObject]
EvalRunList = PageOf[EvalRunObject]
OutputItemList = PageOf[OutputItemObject]
