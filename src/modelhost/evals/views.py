"""OpenAI's objects of the Evals API (`eval`, `eval.run`, `eval.run.output_item`) from their rows."""

from __future__ import annotations

from typing import Any

from modelhost.store.models import Eval, EvalRun, EvalRunItem
from modelhost.store.types import unix_seconds


def eval_view(row: Eval) -> dict[str, Any]:
    """OpenAI's `eval` object."""
    return {
        "object": "eval",
        "id": row.id,
        "name": row.name,
        "data_source_config": shown_config(row.data_source_config),
        "testing_criteria": row.testing_criteria,
        "created_at": unix_seconds(row.created_at),
        "metadata": row.eval_metadata,
    }


def shown_config(config: dict[str, Any]) -> dict[str, Any]:
    """A `custom` config as OpenAI shows it: the JSON schema of what a template may reference."""
    properties: dict[str, Any] = {"item": config.get("item_schema") or {"type": "object"}}
    if config.get("include_sample_schema"):
        properties["sample"] = SAMPLE_SCHEMA
    schema = {"type": "object", "properties": properties, "required": list(properties)}
    return {"type": "custom", "schema": schema}


SAMPLE_SCHEMA = {
    "type": "object",
    "properties": {
        "model": {"type": "string"},
        "choices": {"type": "array"},
        "output_text": {"type": "string"},
        "output_json": {"type": "object"},
    },
    "required": ["model", "choices", "output_text"],
}


def run_view(row: EvalRun) -> dict[str, Any]:
    """OpenAI's `eval.run` object."""
    total = len(row.items)
    return {
        "object": "eval.run",
        "id": row.id,
        "eval_id": row.eval_id,
        "name": row.name,
        "status": row.status,
        "model": row.model,
        "data_source": source_of(row),
        "created_at": unix_seconds(row.created_at),
        "error": row.error,
        "metadata": row.run_metadata,
        "report_url": None,
        "result_counts": {"total": total, "passed": row.passed, "failed": row.failed, "errored": row.errored},
        "per_testing_criteria_results": row.per_criteria,
        "per_model_usage": [
            {
                "model_name": model,
                "invocation_count": calls,
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "cached_tokens": 0,
            }
            for model, (calls, prompt, completion) in sorted(row.usage.items())
        ],
    }


def source_of(row: EvalRun) -> dict[str, Any]:
    """A run's data source as it was given: a `file_content` source's items are kept once, in `items`."""
    source = dict(row.data_source)
    if source.get("source", {}).get("type") == "file_content":
        source["source"] = {"type": "file_content", "content": row.items}
    return source


def item_view(row: EvalRunItem, run: EvalRun) -> dict[str, Any]:
    """OpenAI's `eval.run.output_item` object."""
    return {
        "object": "eval.run.output_item",
        "id": row.id,
        "run_id": run.id,
        "eval_id": run.eval_id,
        "created_at": unix_seconds(row.created_at),
        "status": row.status,
        "datasource_item_id": row.item_index,
        "datasource_item": row.item,
        "results": row.results,
        "sample": row.sample,
    }
