"""The Evals API's service: what the routes call, and `evaluate` for the server's own callers (a gated
rollout: run an eval against a deployment and read its pass rates)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from modelhost.auth.principal import Principal
from modelhost.batches.files import Files, Owner
from modelhost.batches.runner import ModelCheck
from modelhost.errors import Conflict, InvalidRequest, NotFound
from modelhost.evals.graders import MODEL_GRADERS, checked, reads_sample
from modelhost.evals.sources import MAX_FILE_BYTES, checked_config, checked_source, items_of, lines_of
from modelhost.evals.store import EvalStore
from modelhost.generation.compile_sandbox import GrammarChecker
from modelhost.generation.grammar_bounds import GrammarBounds

CHAT = "/v1/chat/completions"
# (principal, model, artifact ID) → why that deployment has no such version serving (None: it has)
VersionCheck = Callable[[Principal, str, str], Awaitable[str | None]]
ENDED = ("completed", "canceled", "failed")
ITEM_SCHEMA = "the eval's item_schema"
# Schemas every item passes already (`items_of`: each item is an object): no compile process is asked
ANY_OBJECT: tuple[dict[str, Any], ...] = ({}, {"type": "object"})


@dataclass(frozen=True, slots=True)
class Scores:
    """A run's outcome, per testing criterion (by name): the share of graded items that passed, and the
    mean score of the items that have one (None: none had)."""

    run_id: str
    status: str
    pass_rates: dict[str, float]
    mean_scores: dict[str, float | None]
    result_counts: dict[str, int]


class EvalService:
    def __init__(
        self,
        store: EvalStore,
        files: Files,
        check_model: ModelCheck,
        check_version: VersionCheck,
        schemas: GrammarChecker,
        bounds: GrammarBounds,
    ) -> None:
        self.store = store
        self._files = files
        self._check_model = check_model
        self._check_version = check_version
        self._schemas = schemas  # its compile processes check a run's items against the item_schema
        self._bounds = bounds

    def create(
        self, owner: Owner, name: str | None, config: Any, criteria: Any, metadata: Any
    ) -> dict[str, Any]:
        return self.store.create(
            owner, name, checked_config(config, self._bounds), checked(criteria), metadata
        )

    async def create_run(
        self,
        principal: Principal,
        owner: Owner,
        eval_id: str,
        name: str | None,
        data_source: Any,
        metadata: Any,
    ) -> dict[str, Any]:
        """A run, `queued` (the eval runner claims it when woken, or at its next poll): its data source
        checked, its items read, every model it calls checked to be a chat deployment the key may use
        (404 `model_not_found` naming the field), and last each item checked against the eval's
        `item_schema` (a 400 naming the first that does not conform)."""
        config, criteria = await asyncio.to_thread(self.store.definition, owner, eval_id)
        source = checked_source(data_source)
        items, names, items_param = await asyncio.to_thread(self._items, owner, source)
        models = [("data_source.model", source.get("model"))]
        models += [
            (f"testing_criteria.{c['name']}.model", c.get("model"))
            for c in criteria
            if c["type"] in MODEL_GRADERS
        ]
        for param, model in models:
            if model is not None and (why := await self._check_model(principal, CHAT, model)) is not None:
                raise NotFound(why, code="model_not_found", param=param)
        pinned = source.get("artifact_id")
        if pinned is not None and (why := await self._check_version(principal, source["model"], pinned)):
            raise Conflict(why, code="version_not_serving", param="data_source.artifact_id")
        if source["type"] == "jsonl":
            self._check_samples(items, criteria)
        schema = config["item_schema"]
        if schema not in ANY_OBJECT:
            values = [entry["item"] for entry in items]
            await self._schemas.check_values(schema, values, names, items_param, ITEM_SCHEMA)
        if source["source"]["type"] == "file_content":  # its items are kept once, beside it (`items`)
            source = {**source, "source": {"type": "file_content"}}
        run = await asyncio.to_thread(
            self.store.create_run, owner, eval_id, name, source, items, source.get("model"), metadata
        )
        return run

    def _items(self, owner: Owner, source: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str], str]:
        """The run's items, what an error calls each (its index in the request, or its line in the
        file) and the field that gave them. A file is read whole here, when the run is created (at most
        MAX_FILE_BYTES): its items are refused then, as a 400, not when the run starts."""
        given = source["source"]
        if given["type"] == "file_content":
            param = "data_source.source.content"
            items = items_of(given.get("content"), param)
            return items, [f"{param}[{index}]" for index in range(len(items))], param
        param = "data_source.source.id"
        data = self._files.content_of(owner, given["id"], param, MAX_FILE_BYTES)
        rows = lines_of(data, param)
        items = items_of([row for _, row in rows], param)
        names = [f"Line {line} of file {given['id']} (item {index})" for index, (line, _) in enumerate(rows)]
        return items, names, param

    @staticmethod
    def _check_samples(items: list[dict[str, Any]], criteria: list[dict[str, Any]]) -> None:
        """A `jsonl` run generates nothing: criteria that read the sample need one with each item."""
        if any(map(reads_sample, criteria)) and any("sample" not in entry for entry in items):
            raise InvalidRequest(
                "The testing criteria read '{{sample...}}', but a 'jsonl' data source generates no samples: "
                "give a 'sample' with each item, or use a 'completions' data source with a model.",
                param="data_source",
            )

    async def evaluate(
        self,
        principal: Principal,
        eval_id: str,
        model: str,
        artifact_id: str | None = None,
        data_source: dict[str, Any] | None = None,
        timeout: float = 3600.0,
        poll: float = 0.5,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        created: Callable[[], None] | None = None,
    ) -> Scores:
        """Run eval `eval_id` against the deployment `model` (with `artifact_id`: its version of that
        artifact, whatever its split) and wait for its `Scores` (module docstring of `modelhost.evals`).
        `data_source`: a run's; None, the eval's latest `completions` run's. `created`: called once the
        run is queued (the supervisor's caller wakes its eval runner)."""
        assert principal.account_id is not None and principal.key_id is not None
        owner = Owner(principal.account_id, principal.key_id)
        if data_source is None:
            data_source = await asyncio.to_thread(self.store.latest_source, owner, eval_id)
        source = {**data_source, "model": model}
        source.pop("artifact_id", None)
        if artifact_id is not None:
            source["artifact_id"] = artifact_id
        run = await self.create_run(principal, owner, eval_id, None, source, None)
        if created is not None:
            created()
        deadline = time.monotonic() + timeout
        while run["status"] not in ENDED and time.monotonic() < deadline:
            await sleep(poll)
            run = await asyncio.to_thread(self.store.get_run, owner, eval_id, run["id"])
        means = await asyncio.to_thread(self.store.mean_scores, run["id"])
        rates = {
            c["testing_criteria"]: c["passed"] / max(1, c["passed"] + c["failed"])
            for c in run["per_testing_criteria_results"]
        }
        return Scores(run["id"], run["status"], rates, means, run["result_counts"])
