"""Creating a fine-tuning job: the base and the datasets checked before anything is queued
(docs/fine-tuning.md, "Creating a job").

- `model` names a deployment of the account, or one the operator shares, that can serve adapters
  (`services.adapters.check_base`: the rules of an adapter deployment's base, so that the job's adapter
  is deployable on it at once);
- `training_file` and `validation_file` are Files API files of purpose `fine-tune`, each line a
  conversation (`fine_tuning.dataset`), no line's text longer than the base's context: a 400
  `invalid_training_file` (or `invalid_validation_file`) naming the first bad line;
- `auto` hyperparameters are resolved from the number of examples (`dataset.resolve`);
- the datasets are copied (a file deleted later does not touch the job) and the job is queued.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelhost.artifacts.blobstore import BlobStore
from modelhost.batches.files import Files, Owner
from modelhost.errors import InvalidRequest, NotFound
from modelhost.fine_tuning.dataset import Checked, DatasetError, check_dataset, resolve, steps_of
from modelhost.fine_tuning.objects import fine_tuned_name
from modelhost.fine_tuning.store import FineTuningJobs, NewJob
from modelhost.runtime.footprint import model_context
from modelhost.services import adapters
from modelhost.services.deployments import DeploymentService
from modelhost.store.db import Database
from modelhost.store.types import new_id

PURPOSE = "fine-tune"
MAX_MODEL_NAME = 128  # a deployment's model name, which `deploy` gives the fine-tuned model


@dataclass(frozen=True)
class Request:
    model: str
    training_file: str
    validation_file: str | None
    hyperparameters: dict[str, Any]
    suffix: str | None
    seed: int | None
    metadata: dict[str, str] | None
    deploy: bool


class FineTuning:
    def __init__(
        self,
        database: Database,
        blobs: BlobStore,
        files: Files,
        deployments: DeploymentService,
        jobs: FineTuningJobs,
        max_file_bytes: int,
    ) -> None:
        self._database = database
        self._blobs = blobs
        self._files = files
        self._deployments = deployments
        self.jobs = jobs
        self._max_file_bytes = max_file_bytes

    def create(self, owner: Owner, request: Request) -> dict[str, Any]:
        with self._database.transaction() as session:
            try:
                base = adapters.find_base(session, owner.account_id, request.model)
            except NotFound:
                raise NotFound(
                    f"The model '{request.model}' is not a deployment of this account, nor one shared "
                    "with it.",
                    param="model",
                    code="model_not_found",
                ) from None
            _as_model(adapters.check_base, base)
            base_id, base_model = base.id, base.model
        spec = self._deployments.runtime_spec(base_id)
        if spec is None:
            raise InvalidRequest(f"The deployment '{request.model}' was deleted.", param="model")
        counter = _token_counter(spec.model_dir)
        context = spec.generation.max_model_len or model_context(spec.model_dir)
        training, data = self._dataset(owner, request.training_file, "training_file", counter, context)
        validation_key = None
        if request.validation_file is not None:
            _, valid_data = self._dataset(owner, request.validation_file, "validation_file", counter, context)
            validation_key = self._copy(valid_data, "validation.jsonl")
        hyper = resolve(request.hyperparameters, len(training.conversations))
        seed = request.seed if request.seed is not None else secrets.randbelow(2**31)
        if (
            request.deploy
            and len(fine_tuned_name(base_model, request.suffix, new_id("ftjob"))) > MAX_MODEL_NAME
        ):
            raise InvalidRequest(
                f"With deploy, the fine-tuned model's name (ft:{base_model}:<suffix>:<job id>) must fit in "
                f"{MAX_MODEL_NAME} characters: use a shorter suffix.",
                param="suffix",
            )
        new = NewJob(
            base_deployment_id=base_id,
            model=base_model,
            training_file=request.training_file,
            validation_file=request.validation_file,
            training_key=self._copy(data, "training.jsonl"),
            validation_key=validation_key,
            hyperparameters=hyper,
            total_steps=steps_of(len(training.conversations), hyper),
            suffix=request.suffix,
            seed=seed,
            metadata=request.metadata,
            deploy=request.deploy,
        )
        return self.jobs.create(owner, new)

    def _dataset(
        self,
        owner: Owner,
        file_id: str,
        param: str,
        counter: Callable[[str], int] | None,
        context: int | None,
    ) -> tuple[Checked, bytes]:
        key, size = self._files.located(owner, file_id, PURPOSE, param=param, what="a fine-tuning dataset")
        if size > self._max_file_bytes:
            raise InvalidRequest(
                f"File {file_id} is {size} bytes; a fine-tuning dataset may have at most "
                f"{self._max_file_bytes}.",
                param=param,
                code=f"invalid_{param}",
            )
        with self._blobs.open(key) as handle:
            data = handle.read()
        try:
            return check_dataset(data, counter, context), data
        except DatasetError as exc:
            raise InvalidRequest(f"File {file_id}: {exc}", param=param, code=f"invalid_{param}") from None

    def _copy(self, data: bytes, name: str) -> str:
        key = f"fine-tuning/datasets/{new_id('ftdata')}/{name}"
        writer = self._blobs.writer(key)
        writer.write(data)
        writer.commit()
        return key


def _as_model(check: Callable[[Any], None], base: Any) -> None:
    """The base's refusals (`services.adapters`) name `model`, the field a job names its base in."""
    try:
        check(base)
    except InvalidRequest as exc:
        raise InvalidRequest(exc.message, param="model", code=exc.code) from None


def _token_counter(model_dir: Path) -> Callable[[str], int] | None:
    """The base's tokenizer (its `tokenizer.json`, read by `tokenizers`: no model code), as a counter."""
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path))
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)
