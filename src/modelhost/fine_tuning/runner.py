"""The fine-tuning runner: in the supervisor, beside the video and batch runners, it claims queued jobs and
runs each one's trainer process (`fine_tuning.trainer`) to its end (docs/fine-tuning.md).

- **Placed like a replica.** Before its trainer starts, a job reserves its footprint in the server's
  memory budget (`runtime.capacity`: the base's weights three times over, for weights, gradients of the
  activations and the optimizer's work, plus a worker process's cost), on the GPU with the most free
  budget where the server places replicas on GPUs, else on the CPU. It never evicts a deployment: while
  there is no room it waits, beating, with `waiting_reason` on the job saying what it needs and what is
  free (and an event saying so once).
- **Reported.** Each step's training and validation loss is a `metrics` event; each checkpoint the
  trainer saves is stored in the blob store (`fine-tuning/<job>/step-<n>/`) and recorded, billed as
  the account's storage until the job has ended and the runner's sweep deletes its files.
- **Durable.** A stopped server (SIGTERM) hands its running jobs back to the queue; a killed one's go
  stale and are re-queued (`FineTuningJobs.recover_stale`). Either way the next claim resumes from the
  last checkpoint. Cancel and pause move the row; the runner's next beat finds the job no longer its own
  and kills the trainer.
- **Billed as a replica is.** The trainer's process is metered as a replica (`billing.meter`): its
  measured memory × its running time, in the account's ledger, on a meter named after the job. An
  account out of credits (where credits are enforced) has its job failed `insufficient_credits` at the
  next step.
- **Its end.** The final adapter becomes an artifact of the account through an upload session, as a
  push would (`ArtifactService`: inspected as any adapter), named `ft:<base model>:<suffix>:<job id>`;
  with `deploy` (modelhost's extension), also an adapter deployment on the base under that name.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import os
import shutil
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from modelhost.artifacts.blobstore import BlobStore
from modelhost.artifacts.service import ArtifactService
from modelhost.billing.service import Billing
from modelhost.claims import ClaimLoop
from modelhost.clock import heartbeat_seconds
from modelhost.config import Settings
from modelhost.errors import ModelhostError
from modelhost.fine_tuning import messages as wire
from modelhost.fine_tuning.objects import fine_tuned_name
from modelhost.fine_tuning.room import Room, footprint, place
from modelhost.fine_tuning.store import ENDED, Claimed, FineTuningJobs
from modelhost.runtime.capacity import Holding, describe
from modelhost.runtime.footprint import weight_bytes
from modelhost.runtime.memory import footprint_bytes
from modelhost.runtime.replica import ReplicaStats
from modelhost.runtime.spec import DeploymentSpec
from modelhost.services.deployments import DeploymentService

log = logging.getLogger("modelhost.fine_tuning")
WORK = "fine-tuning-work"  # in the data directory: each running job's trainer folder
WAIT_SECONDS = 1.0  # how often a job waiting for memory looks again


class Stopped(Exception):
    """The job is no longer this runner's (cancelled, paused, taken over): leave it as it stands."""


class Trainer:
    """The trainer's process as billing measures a replica (`billing.meter.Measured`)."""

    shared_meter = None

    def __init__(self, process: asyncio.subprocess.Process, model_dir: Path) -> None:
        self.process = process
        self.model_dir = model_dir
        self.started = time.monotonic()

    def stats(self) -> ReplicaStats:
        used = footprint_bytes(self.process.pid, self.model_dir) if self.process.returncode is None else 0
        return ReplicaStats(self.process.pid, used, None, 0, processes=1 if used else 0)

    def kill(self) -> None:
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()


class FineTuningRunner(ClaimLoop[Claimed]):
    what = "fine-tuning job"

    def __init__(
        self,
        jobs: FineTuningJobs,
        artifacts: ArtifactService,
        blobs: BlobStore,
        deployments: DeploymentService,
        placement: Room,
        billing: Billing,
        settings: Settings,
    ) -> None:
        super().__init__(log)
        self.jobs = jobs
        self.artifacts = artifacts
        self.blobs = blobs
        self.deployments = deployments
        self.placement = placement
        self.billing = billing
        self.meter = billing.meter
        self.settings = settings
        self._housekept = 0.0

    def concurrency(self) -> int:
        return self.settings.fine_tuning_concurrency

    def poll_seconds(self) -> float:
        return self.settings.fine_tuning_poll_seconds

    def claim(self) -> Claimed | None:
        return self.jobs.claim(self.name)

    def release(self, claim_id: str) -> None:
        """The next claim (this server restarted, or another) resumes it from its last checkpoint."""
        self.jobs.release(claim_id, self.name)

    async def turn(self) -> None:
        stale = self.settings.fine_tuning_stale_seconds
        if time.monotonic() - self._housekept > min(10.0, stale / 2):
            self._housekept = time.monotonic()
            await asyncio.to_thread(self.jobs.recover_stale, stale)
            await asyncio.to_thread(self._sweep)

    def _sweep(self) -> None:
        """Delete what ended jobs no longer need: their dataset copies, and their checkpoints' files
        (nothing resumes an ended job; its adapter is an artifact of its own, and the checkpoints' rows
        stay listed). Each job's files go before its rows say so: a sweep cut short deletes them again."""
        for job_id, keys in self.jobs.ended_datasets():
            for key in keys:
                self.blobs.delete_prefix(key.rsplit("/", 1)[0])
            self.jobs.forget_datasets(job_id)
        for job_id in self.jobs.ended_checkpoints():
            self.blobs.delete_prefix(checkpoints_prefix(job_id))  # those never recorded too
            self.jobs.forget_checkpoints(job_id)

    async def run(self, claimed: Claimed) -> None:
        try:
            await JobRun(self, claimed).run()
        except Stopped:
            log.info("fine-tuning job %s stopped", claimed.id)
        except ModelhostError as exc:
            await asyncio.to_thread(self.jobs.fail, claimed.id, self.name, exc.code, exc.message)
        except Exception as exc:  # a bug here fails the job rather than hand it back to fail again
            log.exception("fine-tuning job %s", claimed.id)
            message = f"The job could not go on: {type(exc).__name__}."
            await asyncio.to_thread(self.jobs.fail, claimed.id, self.name, "training_error", message)


class JobRun:
    """One claim of one job: room, the trainer, its events, and the adapter at its end."""

    def __init__(self, runner: FineTuningRunner, claimed: Claimed) -> None:
        self.runner = runner
        self.jobs = runner.jobs
        self.claimed = claimed
        self.name = runner.name

    async def beat(self, **values: Any) -> None:
        if not await asyncio.to_thread(self.jobs.beat, self.claimed.id, self.name, **values):
            raise Stopped

    async def run(self) -> None:
        claimed = self.claimed
        spec = await asyncio.to_thread(self.runner.deployments.runtime_spec, claimed.base_deployment_id)
        if spec is None:
            await self._fail("base_not_found", f"The base deployment '{claimed.model}' was deleted.")
            return
        holding = await self._room(spec)
        # the trainer's folder: its dataset copies and checkpoints before they are stored (a killed
        # server's is cleared by the next run of the job)
        work = Path(self.runner.settings.data_dir) / WORK / claimed.id
        try:
            await asyncio.to_thread(shutil.rmtree, work, True)
            work.mkdir(parents=True)
            await self._train(spec, holding, work)
        finally:
            self.runner.placement.capacity.release(holding)
            self.runner.placement.changed()
            await asyncio.to_thread(shutil.rmtree, work, True)

    async def _room(self, spec: DeploymentSpec) -> Holding:
        """Reserve the job's footprint, waiting (and saying why) while it does not fit."""
        capacity = self.runner.placement.capacity
        need_bytes = await asyncio.to_thread(weight_bytes, spec.model_dir)
        need = footprint(need_bytes, self.runner.placement.on_gpu)
        never = capacity.never_fits(need)
        if never is not None:
            raise ModelhostError(
                f"The job cannot train on this server: {never}.", code="insufficient_capacity"
            )
        said = False
        while True:
            gpu = place(capacity, need, self.runner.placement.enforced)
            if gpu is not False:
                holding = capacity.hold(self.claimed.id, self.claimed.account_id, need, gpu)
                try:
                    await self.beat(waiting_reason=None)
                except BaseException:
                    capacity.release(holding)
                    raise
                return holding
            reason = f"Waiting for memory: training needs {describe(need.host)} of host memory"
            if need.gpu:
                free = max((capacity.gpu_free(i) for i in range(len(capacity.gpu_budgets))), default=0)
                reason += f" and {describe(need.gpu)} on a GPU, where {describe(free)} is free at most"
            reason += f"; {describe(capacity.free)} of the {describe(capacity.budget)} host budget is free."

            await self.beat(waiting_reason=reason)
            if not said:
                said = True
                await asyncio.to_thread(self.jobs.add_event, self.claimed.id, reason)
            await asyncio.sleep(WAIT_SECONDS)

    def _device(self, holding: Holding) -> str:
        return f"cuda:{holding.gpu}" if holding.gpu is not None else "cpu"

    async def _train(self, spec: DeploymentSpec, holding: Holding, work: Path) -> None:
        claimed = self.claimed
        blobs = self.runner.blobs
        training = work / "training.jsonl"
        await asyncio.to_thread(_copy_blob, blobs, claimed.training_key, training)
        validation = ""
        if claimed.validation_key:
            await asyncio.to_thread(_copy_blob, blobs, claimed.validation_key, work / "validation.jsonl")
            validation = str(work / "validation.jsonl")
        resume_from, start_step = "", 0
        if claimed.last_checkpoint is not None:
            start_step, key = claimed.last_checkpoint
            resume_from = str(await asyncio.to_thread(blobs.local_dir, key))
            await asyncio.to_thread(
                self.jobs.add_event, claimed.id, f"Resuming from the checkpoint at step {start_step}"
            )
        else:
            await asyncio.to_thread(self.jobs.add_event, claimed.id, "Fine-tuning job started")
        total = max(1, claimed.total_steps)
        job = wire.Train(
            base_dir=str(spec.model_dir),
            training_path=str(training),
            validation_path=validation,
            out_dir=str(work / "checkpoints"),
            hyperparameters=wire.Hyperparameters(**claimed.hyperparameters),
            seed=claimed.seed,
            checkpoint_every=max(1, math.ceil(total / self.runner.settings.fine_tuning_checkpoints)),
            resume_from=resume_from,
            start_step=start_step,
            device=self._device(holding),
            threads=self.runner.settings.fine_tuning_threads,
            chat_template=spec.generation.chat_template or "",
            max_model_len=spec.generation.max_model_len or 0,
        )
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "modelhost.fine_tuning.trainer",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=os.environ.copy(),
        )
        trainer = Trainer(process, spec.model_dir)
        metered = dataclasses.replace(spec, id=claimed.id, model=self._name())
        self.runner.meter.replica_started(trainer, metered)
        beating = asyncio.create_task(self._beat_forever(trainer))
        try:
            assert process.stdin is not None and process.stdout is not None
            process.stdin.write(wire.frame(job))
            await process.stdin.drain()
            process.stdin.close()
            async for event in _events(process.stdout):
                if await self._on(event, spec):
                    return
            code = await process.wait()
            await self._fail(
                "training_error", f"The trainer stopped (exit status {code}) before it finished."
            )
        finally:
            beating.cancel()
            trainer.kill()
            with contextlib.suppress(Exception):
                await process.wait()
            self.runner.meter.replica_stopped(trainer)
            await asyncio.to_thread(
                self.jobs.charge, claimed.id, int((time.monotonic() - trainer.started) * 1000)
            )

    async def _beat_forever(self, trainer: Trainer) -> None:
        """Beat between events (loading the model takes seconds); a job no longer ours stops its trainer."""
        while True:
            await asyncio.sleep(heartbeat_seconds(self.runner.settings.fine_tuning_stale_seconds))
            if not await asyncio.to_thread(self.jobs.beat, self.claimed.id, self.name):
                trainer.kill()
                return

    async def _on(self, event: wire.Event, spec: DeploymentSpec) -> bool:
        """Record one event; True once the job has ended."""
        job_id = self.claimed.id
        if isinstance(event, wire.Started):
            await asyncio.to_thread(
                self.jobs.add_event,
                job_id,
                f"Training {event.examples} examples for {event.total_steps} steps "
                f"({event.tokens} trained tokens an epoch)",
            )
        elif isinstance(event, wire.Step):
            await self.beat(trained_tokens=event.trained_tokens)
            await self._require_credits()
            valid = "" if event.valid_loss is None else f", validation loss={event.valid_loss:.4f}"
            data = {
                "step": event.step,
                "train_loss": event.train_loss,
                "valid_loss": event.valid_loss,
                "total_steps": self.claimed.total_steps,
                "trained_tokens": event.trained_tokens,
            }
            message = (
                f"Step {event.step}/{self.claimed.total_steps}: training loss={event.train_loss:.4f}{valid}"
            )
            await asyncio.to_thread(self.jobs.add_event, job_id, message, "metrics", data)
        elif isinstance(event, wire.Checkpointed):
            key = f"{checkpoints_prefix(job_id)}/step-{event.step}"
            size = await asyncio.to_thread(_store_folder, self.runner.blobs, Path(event.folder), key)
            metrics = {"step": event.step, "train_loss": event.train_loss, "valid_loss": event.valid_loss}
            if not await asyncio.to_thread(
                self.jobs.add_checkpoint, job_id, self.name, event.step, metrics, key, size
            ):  # no longer ours; once it has ended (cancelled) no sweep would find these files
                if await asyncio.to_thread(self.jobs.status, job_id) in ENDED:
                    await asyncio.to_thread(self.runner.blobs.delete_prefix, key)
                raise Stopped
        elif isinstance(event, wire.Failed):
            await self._fail(event.code, event.message, event.param)
            return True
        elif isinstance(event, wire.Finished):
            await self._finish(Path(event.folder), spec)
            return True
        return False

    async def _require_credits(self) -> None:
        """A job stops when its account runs out of credits, as its replicas are unloaded then."""
        billing = self.runner.billing
        if billing.enforce and await asyncio.to_thread(billing.balance_micro, self.claimed.account_id) <= 0:
            message = "The account ran out of credits; the job stopped after its last step."
            raise ModelhostError(message, code="insufficient_credits")

    def _name(self) -> str:
        return fine_tuned_name(self.claimed.model, self.claimed.suffix, self.claimed.id)

    async def _finish(self, folder: Path, spec: DeploymentSpec) -> None:
        """The adapter as an artifact of the account (inspected as a pushed one), deployed if asked."""
        claimed, artifacts = self.claimed, self.runner.artifacts
        name = self._name()
        created = await asyncio.to_thread(artifacts.create, claimed.account_id, name, spec.pipeline)
        artifact_id = created.artifact.id
        upload, _ = await asyncio.to_thread(artifacts.start_upload, claimed.account_id, artifact_id)
        for path in sorted(p for p in folder.iterdir() if p.is_file()):
            await artifacts.put_file(
                claimed.account_id, artifact_id, upload.id, path.name, _chunks(path), None
            )
        view, _ = await asyncio.to_thread(artifacts.complete, claimed.account_id, artifact_id, upload.id)
        if view.artifact.status != "ready":
            await self._fail(view.artifact.error_code or "invalid_adapter", view.artifact.error_message or "")
            return
        deployment_id = None
        if claimed.deploy:
            deployment_id = await self._deploy(claimed.deploy, artifact_id)
        if not await asyncio.to_thread(
            self.jobs.succeed, claimed.id, self.name, name, artifact_id, deployment_id
        ):
            raise Stopped

    async def _deploy(self, name: str, artifact_id: str) -> str | None:
        """The adapter deployed on the job's base as `name`; a refusal (the name taken meanwhile, the
        base moved off vLLM) leaves the job succeeded, its artifact deployable, and says why."""
        try:
            deployment = await asyncio.to_thread(
                self.runner.deployments.create,
                self.claimed.account_id,
                name,
                artifact_id,
                "cold",
                1,
                1,
                base_deployment=self.claimed.base_deployment_id,
            )
        except ModelhostError as exc:
            message = f"The adapter was not deployed: {exc.message} Deploy artifact {artifact_id} yourself."
            await asyncio.to_thread(self.jobs.add_event, self.claimed.id, message, level="warn")
            return None
        return deployment.id

    async def _fail(self, code: str, message: str, param: str | None = None) -> None:
        if not await asyncio.to_thread(self.jobs.fail, self.claimed.id, self.name, code, message, param):
            raise Stopped


async def _events(stream: asyncio.StreamReader) -> AsyncIterator[wire.Event]:
    while True:
        try:
            header = await stream.readexactly(wire.HEADER_SIZE)
            body = await stream.readexactly(wire.body_size(header))
        except asyncio.IncompleteReadError:
            return
        yield wire.decode_event(body)


async def _chunks(path: Path) -> AsyncIterator[bytes]:
    yield await asyncio.to_thread(path.read_bytes)


def _copy_blob(blobs: BlobStore, key: str, target: Path) -> None:
    with blobs.open(key) as source, open(target, "wb") as out:
        while chunk := source.read(1 << 20):
            out.write(chunk)


def checkpoints_prefix(job_id: str) -> str:
    """Where a job's checkpoints are stored in the blob store, `step-<n>/` each."""
    return f"fine-tuning/{job_id}"


def _store_folder(blobs: BlobStore, folder: Path, key: str) -> int:
    """The folder's files stored under `key`; their bytes."""
    size = 0
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        data = path.read_bytes()
        writer = blobs.writer(f"{key}/{path.name}")
        writer.write(data)
        writer.commit()
        size += len(data)
    return size
