"""OpenAI's fine-tuning API (issue 74) through the unchanged openai SDK, on one real server process: a
LoRA adapter trained by PEFT on the tiny chat base (vLLM's shape) learns to answer in a fixed format
("@@ done"), resumes from its last checkpoint after the server is killed mid-way, and, deployed on its
base, answers in that format under greedy decoding where the base does not; invalid datasets are
refused naming their line; jobs are cancellable, paused and resumed, limited per account, charged in
credits, and another account's jobs and files are 404.

The base is served by vLLM (only vLLM serves adapters: docs/adapters.md); the module is skipped, with
the reason, where vLLM is not installed.
"""

from __future__ import annotations

import concurrent.futures
import io
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import select

from modelhost.batches.files import Owner
from modelhost.container import Services
from modelhost.errors import RateLimitExceeded
from modelhost.fine_tuning.dataset import resolve, steps_of
from modelhost.fine_tuning.room import footprint
from modelhost.fine_tuning.runner import FineTuningRunner, JobRun
from modelhost.fine_tuning.store import FineTuningJobs, NewJob
from modelhost.runtime.capacity import MB, Capacity, Footprint
from modelhost.runtime.spec import DeploymentSpec
from modelhost.store.models import Base, FineTuningEvent, FineTuningJob
from tests.console_browser import signed_in
from tests.helpers import ADMIN_KEY, assert_error, bearer, new_account, push_folder_sync
from tests.server_process import ServerProcess, processes
from tests.vllm_setup import wait_for_vllm

Json = dict[str, Any]
MARKER = "@@"
WORDS = [
    "apple",
    "river",
    "stone",
    "cloud",
    "green",
    "tiger",
    "piano",
    "lemon",
    "chair",
    "ocean",
    "paper",
    "mouse",
]
# 12 examples in batches of 4 for 8 epochs: 24 steps, a checkpoint every 6
HYPERPARAMETERS = {"n_epochs": 8, "batch_size": 4, "learning_rate_multiplier": 20}
SUPERVISED: Any = {"type": "supervised", "supervised": {"hyperparameters": HYPERPARAMETERS}}


def conversation(word: str) -> Json:
    return {
        "messages": [
            {"role": "user", "content": f"Tell me about {word}."},
            {"role": "assistant", "content": f"{MARKER} done"},
        ]
    }


def jsonl(lines: list[Any]) -> bytes:
    return b"".join(
        (line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n" for line in lines
    )


@dataclass
class Served:
    process: ServerProcess
    http: httpx.Client
    key: str
    client: openai.OpenAI
    training_file: str
    validation_file: str

    def upload(self, lines: list[Any], key: str | None = None) -> str:
        client = self.client if key is None else sdk(self.process.url, key)
        return client.files.create(file=("data.jsonl", io.BytesIO(jsonl(lines))), purpose="fine-tune").id

    def create(self, key: str | None = None, **body: Any) -> httpx.Response:
        return self.http.post("/v1/fine_tuning/jobs", json=body, headers=bearer(key or self.key))

    def wait(
        self, job_id: str, until: tuple[str, ...], timeout: float = 120, check: Any = None, every: float = 0.2
    ) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.client.fine_tuning.jobs.retrieve(job_id)
            if job.status in until or (check is not None and check(job)):
                return job
            time.sleep(every)
        raise TimeoutError(f"job {job_id} still {job.status}")

    def new_account(self, name: str) -> str:
        answer = self.http.post("/v1/admin/accounts", json={"name": name}, headers=bearer(ADMIN_KEY))
        key: str = answer.json()["api_key"]
        return key

    def greedy(self, model: str) -> str:
        answer = self.client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Tell me about snow."}],
            max_tokens=6,
            temperature=0,
        )
        return answer.choices[0].message.content or ""


def sdk(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One server with the vLLM-shaped chat base deployed cold (`base`), and the datasets uploaded."""
    from tests.tiny_models.chat import build_chat_for_vllm

    python, reason = wait_for_vllm()
    if python is None:
        pytest.skip(f"vLLM is not available: {reason}")
    root = tmp_path_factory.mktemp("fine-tuning")
    build_chat_for_vllm(root / "base")
    process = ServerProcess(
        root / "data",
        f"sqlite:///{root / 'db.sqlite'}",
        MODELHOST_VLLM_PYTHON=python,
        MODELHOST_KV_CACHE_MB="64",
        MODELHOST_VLLM_COMPILE="false",
        MODELHOST_FINE_TUNING_POLL_SECONDS="0.2",
        MODELHOST_FINE_TUNING_STALE_SECONDS="2",
        MODELHOST_FINE_TUNING_MAX_ACTIVE_PER_ACCOUNT="2",
        MODELHOST_FINE_TUNING_THREADS="1",
        MODELHOST_BILLING_TICK_SECONDS="1",
        MODELHOST_BILLING_COMPUTE_CREDITS_PER_GB_SECOND="1000",
        MODELHOST_BILLING_ENFORCE="false",
    )
    process.start()
    http = httpx.Client(base_url=process.url, timeout=300)
    try:
        key = http.post("/v1/admin/accounts", json={"name": "tuner"}, headers=bearer(ADMIN_KEY)).json()[
            "api_key"
        ]
        artifact = push_folder_sync(http, key, root / "base", "text-generation")
        base = http.post(
            "/v1/deployments",
            json={"model": "base", "artifact_id": artifact, "engine": "vllm"},
            headers=bearer(key),
        )
        assert base.status_code == 201, base.text
        served = Served(process, http, key, sdk(process.url, key), "", "")
        served.training_file = served.upload([conversation(w) for w in WORDS])
        served.validation_file = served.upload([conversation(w) for w in ("snow", "grass", "table", "light")])
        yield served
    finally:
        http.close()
        process.stop()


def metrics_of(served: Served, job_id: str) -> list[Json]:
    events = served.client.fine_tuning.jobs.list_events(job_id, limit=100).data
    return [e.data for e in reversed(events) if e.type == "metrics"]  # type: ignore[misc]


def test_a_job_learns_the_trained_format_resumes_after_a_kill_and_its_model_answers_in_it(
    served: Served,
) -> None:
    client = served.client
    job = client.fine_tuning.jobs.create(
        model="base",
        training_file=served.training_file,
        validation_file=served.validation_file,
        method=SUPERVISED,
        suffix="fmt",
        seed=7,
        metadata={"team": "support"},
    )
    assert job.status == "queued" and job.model == "base" and job.metadata == {"team": "support"}
    assert (
        job.hyperparameters.n_epochs == 8 and job.seed == 7 and job.to_dict()["user_provided_suffix"] == "fmt"
    )
    # killed once it has a checkpoint, mid-way: the restarted server resumes it from its last one
    running = served.wait(
        job.id, ("succeeded", "failed"), check=lambda j: j.to_dict()["step"] >= 6, every=0.02
    )
    served.process.kill()
    assert running.status == "running", running
    served.process.start()
    done = served.wait(job.id, ("succeeded", "failed", "cancelled"))
    assert done.status == "succeeded", done.error
    assert done.fine_tuned_model == f"ft:base:fmt:{job.id}"
    messages = [e.message for e in client.fine_tuning.jobs.list_events(job.id, limit=100).data]
    resumed = [
        int(m.rsplit(" ", 1)[1]) for m in messages if m.startswith("Resuming from the checkpoint at step ")
    ]
    assert len(resumed) == 1 and resumed[0] in (6, 12, 18), messages
    metrics = metrics_of(served, job.id)
    steps = [m["step"] for m in metrics]
    assert steps[-1] == 24 and set(range(resumed[0] + 1, 25)) <= set(steps)  # from its checkpoint, to the end
    first, last = metrics[0], metrics[-1]
    assert last["train_loss"] < first["train_loss"] - 0.5  # the loss falls
    assert last["valid_loss"] < first["valid_loss"]
    checkpoints = client.fine_tuning.jobs.checkpoints.list(job.id).data
    assert [c.step_number for c in checkpoints] == [24, 18, 12, 6]
    assert checkpoints[0].fine_tuned_model_checkpoint == f"ft:base:fmt:{job.id}:ckpt-step-24"
    # an adapter artifact of the account, inspected as any adapter, deployable on its base at once
    artifact = served.http.get(
        f"/v1/model-artifacts/{done.to_dict()['artifact_id']}", headers=bearer(served.key)
    ).json()
    assert artifact["kind"] == "adapter" and artifact["status"] == "ready", artifact
    deployed = served.http.post(
        "/v1/deployments",
        json={"model": done.fine_tuned_model, "artifact_id": artifact["id"], "base_deployment": "base"},
        headers=bearer(served.key),
    )
    assert deployed.status_code == 201, deployed.text
    tuned, base = served.greedy(str(done.fine_tuned_model)), served.greedy("base")
    assert tuned.startswith(MARKER) and not base.startswith(MARKER), (tuned, base)
    # charged as a replica is: the trainer's memory x its time, on a meter of the job
    usage = served.http.get("/v1/usage", headers=bearer(served.key)).json()
    billed = {u["deployment_id"]: u["compute_credits"] for u in usage["by_deployment"]}
    assert billed.get(job.id, 0) > 0, billed


def test_each_refused_dataset_names_its_line(served: Served) -> None:
    good = conversation("apple")
    cases: list[tuple[list[Any], int, str]] = [
        ([good, good, b"{not json"], 3, "not valid JSON"),
        ([good, {"messages": [{"role": "user", "content": "hi"}]}], 2, "no assistant message with weight 1"),
        (
            [
                {
                    "messages": [
                        {"role": "user", "content": "hi"},
                        {"role": "assistant", "content": "x", "weight": 2},
                    ]
                }
            ],
            1,
            "weight must be 0 or 1",
        ),
        ([good, {"messages": [{"role": "wizard", "content": "hi"}]}], 2, "role must be one of"),
        (
            [
                good,
                {
                    "messages": [
                        {"role": "user", "content": "a " * 3000},
                        {"role": "assistant", "content": "b"},
                    ]
                },
            ],
            2,
            "more than the base's context of 2048 tokens",
        ),
    ]
    for lines, number, words in cases:
        file_id = served.upload(lines)
        refused = assert_error(
            served.create(model="base", training_file=file_id),
            400,
            "invalid_training_file",
            param="training_file",
        )
        assert f"Line {number}: " in refused["message"] and words in refused["message"], refused
    bad = served.upload([b"[]"])
    with_bad = served.create(model="base", training_file=served.training_file, validation_file=bad)
    assert_error(with_bad, 400, "invalid_validation_file", param="validation_file")
    batch_file = served.client.files.create(file=("b.jsonl", io.BytesIO(jsonl([good]))), purpose="batch").id
    assert_error(served.create(model="base", training_file=batch_file), 400, param="training_file")
    assert_error(served.create(model="gpt-4o", training_file=served.training_file), 404, "model_not_found")


def trainers() -> list[int]:
    return processes("modelhost.fine_tuning.trainer")


def test_a_cancelled_job_stops_its_trainer_and_a_paused_one_resumes_to_its_end(served: Served) -> None:
    client = served.client
    long: Any = {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 50, "batch_size": 1}}}
    short: Any = {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 2, "batch_size": 6}}}
    cancelled = client.fine_tuning.jobs.create(model="base", training_file=served.training_file, method=long)
    paused = client.fine_tuning.jobs.create(model="base", training_file=served.training_file, method=short)
    assert str(client.fine_tuning.jobs.pause(paused.id).status) == "paused"  # while it waits its turn
    deadline = time.monotonic() + 60
    while not metrics_of(served, cancelled.id) and time.monotonic() < deadline:  # until it trains
        time.sleep(0.2)
    assert trainers() and client.fine_tuning.jobs.retrieve(cancelled.id).status == "running"
    assert client.fine_tuning.jobs.cancel(cancelled.id).status == "cancelled"
    deadline = time.monotonic() + 10
    while trainers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert trainers() == []  # its trainer stopped at the runner's next beat
    with pytest.raises(openai.ConflictError):
        client.fine_tuning.jobs.cancel(cancelled.id)
    assert str(client.fine_tuning.jobs.retrieve(paused.id).status) == "paused"  # nothing claims it
    assert client.fine_tuning.jobs.resume(paused.id).status == "queued"
    done = served.wait(paused.id, ("succeeded", "failed"))
    assert done.status == "succeeded" and done.trained_tokens and done.trained_tokens > 0, done.error
    assert client.fine_tuning.jobs.retrieve(cancelled.id).status == "cancelled"
    listed = [j.id for j in client.fine_tuning.jobs.list(limit=100).data]
    assert paused.id in listed and cancelled.id in listed


def test_the_console_shows_each_jobs_progress_loss_model_and_events(served: Served) -> None:
    """The console's Fine-tuning page, after the jobs above: a succeeded job's steps, its last losses and
    its fine-tuned model; a cancelled one without a Cancel button; a job's events and checkpoints as text."""
    jobs = served.client.fine_tuning.jobs.list(limit=100).data
    done = next(j for j in jobs if j.status == "succeeded")
    cancelled = next(j for j in jobs if j.status == "cancelled")
    last = metrics_of(served, done.id)[-1]
    steps = served.http.get(f"/v1/fine_tuning/jobs/{done.id}", headers=bearer(served.key)).json()[
        "total_steps"
    ]
    with signed_in(served.process.url, served.key) as (page, errors):
        page.click("#nav-finetuning")
        row = page.locator(f"#job-list tr[data-id='{done.id}'][data-status='succeeded']")
        row.wait_for()
        progress = row.locator("td.progress .done").inner_text()
        loss = row.locator("td.loss").inner_text()
        model = row.locator("td.model").inner_text()
        stopped = page.locator(f"#job-list tr[data-id='{cancelled.id}'] td.actions button").all_inner_texts()
        row.get_by_role("button", name="Events").click()
        page.locator("#job-events").wait_for()
        events = page.locator("#job-events").inner_text()
        checkpoints = page.locator("#job-checkpoints li").all_inner_texts()
    assert progress == f"{steps} / {steps}"
    assert loss.startswith(f"training {last['train_loss']:.4f}")
    assert model == done.fine_tuned_model and stopped == ["Events"]  # no Cancel once it ended
    assert f"Step {steps}/{steps}: training loss=" in events
    assert checkpoints and all(c.startswith(f"{done.fine_tuned_model}:ckpt-step-") for c in checkpoints)
    assert not errors, errors


def test_another_accounts_jobs_and_files_are_404_and_jobs_are_limited_per_account(served: Served) -> None:
    hyper = {"n_epochs": 1, "batch_size": 12, "learning_rate_multiplier": 1}
    body: dict[str, Any] = {
        "model": "base",
        "training_file": served.training_file,
        "method": {"type": "supervised", "supervised": {"hyperparameters": hyper}},
    }
    first, second = served.create(**body), served.create(**body)
    assert first.status_code == second.status_code == 200, (first.text, second.text)
    job_id = first.json()["id"]
    stranger = sdk(served.process.url, served.new_account("other"))
    for call in (
        lambda: stranger.fine_tuning.jobs.retrieve(job_id),
        lambda: stranger.fine_tuning.jobs.list_events(job_id),
        lambda: stranger.fine_tuning.jobs.checkpoints.list(job_id),
        lambda: stranger.fine_tuning.jobs.cancel(job_id),
        lambda: stranger.fine_tuning.jobs.pause(job_id),
        lambda: stranger.files.retrieve(served.training_file),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert stranger.fine_tuning.jobs.list().data == []
    # the base is not the other account's to name, nor, once the operator shares the base, the file
    assert_error(served.create(stranger.api_key, **body), 404, "model_not_found", param="model")
    deployments = served.http.get("/v1/deployments", headers=bearer(served.key)).json()["data"]
    base_id = next(d["id"] for d in deployments if d["model"] == "base")
    admin = bearer(ADMIN_KEY)
    shared = served.http.patch(f"/v1/admin/deployments/{base_id}", json={"shared": True}, headers=admin)
    assert shared.status_code == 200, shared.text
    try:
        refused = served.create(stranger.api_key, **body | {"model": base_id})
        assert_error(refused, 404, "file_not_found", param="training_file")
    finally:
        served.http.patch(f"/v1/admin/deployments/{base_id}", json={"shared": False}, headers=admin)
    # two jobs queued, running or paused at most (this server's limit): a third is a 429
    assert_error(served.create(**body), 429, "too_many_fine_tuning_jobs")
    for answer in (first, second):
        assert served.client.fine_tuning.jobs.cancel(answer.json()["id"]).status == "cancelled"
    assert served.client.fine_tuning.jobs.retrieve(job_id).status == "cancelled"


def test_the_cli_uploads_trains_deploys_when_asked_and_names_a_bad_line(
    served: Served, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from modelhost.cli.main import app

    def cli(*args: str) -> Any:
        return CliRunner().invoke(
            app, [*args, "--url", served.process.url, "--key", served.key], prog_name="modelhost"
        )

    dataset = tmp_path / "train.jsonl"
    dataset.write_bytes(jsonl([*(conversation(w) for w in WORDS[:11]), TOOLS_CONVERSATION]))  # tools too
    copies = Path(served.process.env["MODELHOST_DATA_DIR"]) / "blobs" / "fine-tuning" / "datasets"

    def stored() -> set[Path]:  # the copies (the blob store writes each under a hidden folder first)
        return {p for p in copies.iterdir() if not p.name.startswith(".")} if copies.exists() else set()

    before = stored()
    args = ("--model", "base", "--epochs", "1", "--batch-size", "12", "--suffix", "cli", "--deploy")
    created = cli("fine-tune", "create", str(dataset), *args, "--wait", "--every", "0.2", "--json")
    assert created.exit_code == 0, (created.stdout, created.stderr)
    job = json.loads(created.stdout)
    assert job["status"] == "succeeded" and job["fine_tuned_model"] == f"ft:base:cli:{job['id']}"
    assert "Step 1/1: training loss=" in created.stderr
    deployment = served.http.get(f"/v1/deployments/{job['deployment_id']}", headers=bearer(served.key)).json()
    assert deployment["model"] == job["fine_tuned_model"] and deployment["base_deployment"] is not None
    checkpoints = copies.parent / job["id"]  # `fine-tuning/<job id>/step-<n>/`
    deadline = time.monotonic() + 15  # the ended job's dataset copy and checkpoints' files are swept
    while (stored() - before or checkpoints.exists()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert stored() - before == set() and not checkpoints.exists()  # the checkpoints stay listed (below)
    listed = cli("fine-tune", "list", "--json")
    assert job["id"] in [j["id"] for j in json.loads(listed.stdout)["data"]]
    assert "ckpt-step-1" in cli("fine-tune", "checkpoints", job["id"]).stdout
    dataset.write_bytes(jsonl([conversation("x"), {"messages": []}]))
    refused = cli("fine-tune", "create", str(dataset), "--model", "base")
    assert refused.exit_code != 0 and "Line 2: `messages` must be a non-empty list." in refused.stderr


TOOLS_CONVERSATION: Json = {
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Where is parcel 42?"},
        {"role": "assistant", "content": "Let me look.", "weight": 0},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "track", "arguments": '{"id": 42}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "shipped"},
        {"role": "assistant", "content": "It shipped."},
    ],
    "tools": [{"type": "function", "function": {"name": "track", "parameters": {"type": "object"}}}],
}


def test_the_loss_is_on_the_learnt_assistant_messages_and_their_end_of_turn_only() -> None:
    from modelhost.fine_tuning.trainer import encode
    from tests.tiny_models.chat import chat_tokenizer

    tokenizer = chat_tokenizer()
    example = encode(tokenizer, TOOLS_CONVERSATION, 1, 2048)
    learnt = tokenizer.decode([t for t in example.labels if t != -100])
    call = '<tool_call>\n{"name": "track", "arguments": {"id": 42}}\n</tool_call>'
    assert learnt == f"\n{call}<|im_end|>\nIt shipped.<|im_end|>\n", learnt
    assert len(example.ids) == len(example.labels)
    everything = tokenizer.decode(example.ids)
    assert "# Tools" in everything and "Let me look." in everything and "shipped" in everything


def test_auto_hyperparameters_follow_the_datasets_size() -> None:
    small, large = resolve({}, 12), resolve({}, 4000)
    assert small == {"n_epochs": 14, "batch_size": 1, "learning_rate_multiplier": 2.0}
    assert large == {"n_epochs": 1, "batch_size": 8, "learning_rate_multiplier": 2.0}
    assert steps_of(12, small) == 12 * 14 and steps_of(10, {"n_epochs": 2, "batch_size": 4}) == 6


async def test_the_migration_makes_the_models_tables_and_a_job_is_claimed_once_and_resumed_when_stale(
    client: httpx.AsyncClient, services: Services
) -> None:
    """On SQLite and PostgreSQL: the tables the models declare, nothing more or less; of two runners one
    claims a job; a job whose runner stopped beating is queued again, to resume."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    with services.database.engine.connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert [d for d in differences if "fine_tuning" in str(d)] == []
    account = await new_account(client)
    jobs = FineTuningJobs(services.database, max_active_per_account=1)
    new = NewJob("dep_x", "base", "file_a", None, "k", None, resolve({}, 4), 8, None, 1, None, False)
    created = jobs.create(Owner(account["id"], "key_x"), new)
    assert jobs.claim("one") is not None and jobs.claim("two") is None
    assert jobs.beat(created["id"], "one") and not jobs.beat(created["id"], "two")
    with services.database.transaction() as session:
        row = session.get(FineTuningJob, created["id"])
        assert row is not None
        row.updated_at = row.updated_at.replace(year=2000)
    assert jobs.recover_stale(60) == 1
    again = jobs.claim("two")
    assert again is not None and again.id == created["id"] and not jobs.beat(created["id"], "one")


async def test_creates_at_once_never_pass_the_accounts_limit_of_active_jobs(
    client: httpx.AsyncClient, services: Services
) -> None:
    """On SQLite and PostgreSQL: eight creates at once of an account allowed three active jobs make three
    jobs; the others are 429 `too_many_fine_tuning_jobs`, and leave no job behind."""
    account = await new_account(client)
    jobs = FineTuningJobs(services.database, max_active_per_account=3)
    new = NewJob("dep_x", "base", "file_a", None, "k", None, resolve({}, 4), 8, None, 1, None, False)
    owner = Owner(account["id"], "key_x")

    def create() -> str:
        try:
            return str(jobs.create(owner, new)["id"])
        except RateLimitExceeded as refused:
            assert refused.code == "too_many_fine_tuning_jobs"
            return "refused"

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        made = list(pool.map(lambda _: create(), range(8)))
    assert made.count("refused") == 5
    with services.database.transaction() as session:
        stored = session.scalars(select(FineTuningJob.id).where(FineTuningJob.account_id == account["id"]))
        assert sorted(stored) == sorted(m for m in made if m != "refused")


class Budget:
    """The supervisor's placement as a job sees it (`fine_tuning.runner.Room`): a real budget."""

    def __init__(self, capacity: Capacity) -> None:
        self.capacity = capacity
        self.enforced = True
        self.on_gpu = False
        self.changes = 0

    def changed(self) -> None:
        self.changes += 1


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_job_waits_for_room_in_the_memory_budget_saying_why_and_starts_once_there_is(
    client: httpx.AsyncClient, services: Services, tmp_path: Path
) -> None:
    import asyncio

    (tmp_path / "model.safetensors").write_bytes(b"0" * MB)
    need = footprint(MB, on_gpu=False)
    budget = Budget(Capacity(need.host + 10 * MB))
    replica = budget.capacity.hold("dep_other", "acct_other", Footprint(20 * MB), None)
    runner = FineTuningRunner(
        FineTuningJobs(services.database, 3),
        services.artifacts,
        services.blobs,
        services.deployments,
        budget,
        services.billing,
        services.settings,
    )
    account = await new_account(client)
    new = NewJob("dep_x", "base", "file_a", None, "k", None, resolve({}, 4), 8, None, 1, None, False)
    runner.jobs.create(Owner(account["id"], "key_x"), new)
    claimed = runner.jobs.claim(runner.name)
    assert claimed is not None
    spec = DeploymentSpec("dep_x", "text-generation", "cold", 1, 1, tmp_path, account["id"], "base", "art_x")
    waiting = asyncio.create_task(JobRun(runner, claimed)._room(spec))
    await asyncio.sleep(0.5)
    assert not waiting.done()
    reason = runner.jobs.get(Owner(account["id"], "key_x"), claimed.id)["waiting_reason"]
    assert reason.startswith(f"Waiting for memory: training needs {need.host // MB:,} MiB of host memory"), (
        reason
    )
    with services.database.transaction() as session:
        said = [e.message for e in session.query(FineTuningEvent).filter_by(job_id=claimed.id)]
    assert reason in said
    budget.capacity.release(replica)
    holding = await asyncio.wait_for(waiting, 5)
    assert holding.footprint == need and holding.gpu is None
    assert runner.jobs.get(Owner(account["id"], "key_x"), claimed.id)["waiting_reason"] is None
