"""End to end on kind, for machines with Docker (`make e2e-kind`).

Creates a kind cluster, builds the operator and sidecar images from the repository's Dockerfile
and a stand-in engine image (tests/e2e/engine: answers /health like vLLM, no model, no GPU),
loads them into the cluster, installs the chart, applies examples/vllm-2p4d.yaml with the
stand-in images, and waits for the PDDeployment to report Ready for its current generation.

kind nodes have no GPUs, no RDMA NICs and no NVLink domains, so the node advertises fake
`nvidia.com/gpu` and `rdma/...` capacity (extended resources are plain counters to the
scheduler) and the example's node-level needs are relaxed; everything the operator renders,
the images, the chart and the sidecars run for real.

Skipped, with the reason, where `docker info` fails (no Docker engine) or PDD_E2E_KIND is not
set (the Makefile target sets it; `make test` does not spend minutes on a cluster).

Environment: KIND (a kind binary; default: `kind` on PATH, else built with `go install
sigs.k8s.io/kind@v0.30.0`), PDD_E2E_KEEP=1 keeps the cluster for debugging.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
E2E = Path(__file__).resolve().parent
KIND_VERSION = "v0.30.0"
CLUSTER = "pdd-e2e"
TAG = "e2e"
OPERATOR_IMAGE = f"pdd-operator:{TAG}"
SIDECAR_IMAGE = f"pdd-sidecar:{TAG}"
ROUTER_IMAGE = f"pdd-router:{TAG}"
ENGINE_IMAGE = f"pdd-e2e-engine:{TAG}"
EXAMPLE = ROOT / "examples" / "vllm-2p4d.yaml"
READY_TIMEOUT_S = 600
# Fake node capacity: enough for the example's 2x2 prefill + 4x2 decode GPUs.
FAKE_CAPACITY = {"nvidia.com/gpu": "16", "rdma/rdma_shared_device_a": "64"}
GPU_NODE_LABELS = {
    "nvidia.com/gpu.present": "true",  # the topology agent's node selector
    "nvidia.com/gpu.count": "16",
    "nvidia.com/gpu.product": "stand-in",
}


def _docker_unavailable() -> str | None:
    """Why the e2e cannot run here, or None."""
    if shutil.which("docker") is None:
        return "no Docker engine: the `docker` CLI is not installed"
    try:
        result = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "no Docker engine: `docker info` did not answer within 30s"
    if result.returncode != 0:
        lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
        return (
            f"no Docker engine: `docker info` failed: {lines[-1] if lines else result.returncode}"
        )
    return None


def _skip_reason() -> str | None:
    if reason := _docker_unavailable():
        return reason
    if not os.environ.get("PDD_E2E_KIND"):
        return "kind e2e runs with `make e2e-kind` (set PDD_E2E_KIND=1 to run it from pytest)"
    return None


SKIP_REASON = _skip_reason()
pytestmark = pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")


def run(*cmd: str, cwd: Path = ROOT, timeout: float = 900, **env: str) -> str:
    print("+", " ".join(cmd), flush=True)
    result = subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **env}
    )
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stderr}")
    return result.stdout


def kind_binary(cache: Path) -> str:
    """KIND, or `kind` on PATH, or built once from the Go module proxy into the cache."""
    if explicit := os.environ.get("KIND"):
        return explicit
    if found := shutil.which("kind"):
        return found
    gobin = cache / f"kind-{KIND_VERSION}"
    binary = gobin / "kind"
    if not binary.exists():
        run("go", "install", f"sigs.k8s.io/kind@{KIND_VERSION}", GOBIN=str(gobin))
    return str(binary)


def helm_binary() -> str:
    out = run("bash", str(ROOT / "hack" / "fetch-binaries.sh"))
    return str(Path(out.strip().splitlines()[-1]) / "helm")


def stand_in_example() -> dict[str, Any]:
    """examples/vllm-2p4d.yaml with the stand-in images and what kind nodes cannot give
    relaxed; each change says why."""
    pdd: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    spec = pdd["spec"]
    spec["engine"]["image"] = ENGINE_IMAGE  # answers /health like vLLM; no model download
    # ... so no token Secret or shared cache claim either (kind's class has no ReadWriteMany).
    spec["model"].pop("source", None)
    spec["router"]["image"] = ROUTER_IMAGE  # the real vllm-router, finding the stand-ins
    for role in ("prefill", "decode"):
        spec[role]["resources"] = {}  # the example asks 16 CPUs and 128Gi per pod
    rdma = spec["kvTransfer"].setdefault("rdma", {})
    rdma.pop("networks", None)  # no Multus in kind; the fake rdma/ capacity stays requested
    spec["kvTransfer"]["sharedMemorySize"] = "256Mi"
    spec["topology"]["placement"] = "none"  # kind has no NVLink cliques or racks to place in
    return pdd


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    # The cache hack/fetch-binaries.sh uses.
    xdg = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    cache = Path(os.environ.get("PDD_CACHE", xdg / "pdd-operator")) / "bin"
    kind = kind_binary(cache)
    kubeconfig = tmp_path_factory.mktemp("kind") / "kubeconfig"
    run(kind, "delete", "cluster", "--name", CLUSTER)  # a leftover of an interrupted run
    run(kind, "create", "cluster", "--name", CLUSTER, "--kubeconfig", str(kubeconfig),
        "--wait", "180s")  # fmt: skip
    try:
        targets = (
            ("operator", OPERATOR_IMAGE),
            ("sidecar", SIDECAR_IMAGE),
            ("router", ROUTER_IMAGE),
        )
        for target, tag in targets:
            run("docker", "build", "--target", target, "-t", tag, ".")
        run("docker", "build", "-t", ENGINE_IMAGE, str(E2E / "engine"))
        for image in (OPERATOR_IMAGE, SIDECAR_IMAGE, ROUTER_IMAGE, ENGINE_IMAGE):
            run(kind, "load", "docker-image", image, "--name", CLUSTER)
        yield kubeconfig
    finally:
        if not os.environ.get("PDD_E2E_KEEP"):
            run(kind, "delete", "cluster", "--name", CLUSTER)


@pytest.fixture(scope="module")
def api(cluster: Path) -> Iterator[Any]:
    from kubernetes import config

    client = config.new_client_from_config(config_file=str(cluster))
    yield client
    client.close()


def advertise_fake_gpus(api: Any) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api)
    for node in core.list_node().items:
        name = node.metadata.name
        core.patch_node(name, {"metadata": {"labels": GPU_NODE_LABELS}})
        # Extended resources: the documented way to advertise them is a status patch.
        core.patch_node_status(name, {"status": {"capacity": FAKE_CAPACITY}})


def test_example_becomes_ready_on_kind(cluster: Path, api: Any) -> None:
    from kubernetes import client

    advertise_fake_gpus(api)
    helm = helm_binary()
    image_values = [
        f"image.repository={OPERATOR_IMAGE.split(':')[0]}", f"image.tag={TAG}",
        "image.pullPolicy=Never",
        f"sidecarImage.repository={SIDECAR_IMAGE.split(':')[0]}", f"sidecarImage.tag={TAG}",
        "sidecarImage.pullPolicy=Never",
    ]  # fmt: skip
    run(helm, "install", "pdd-operator", str(ROOT / "charts" / "pdd-operator"),
        "--kubeconfig", str(cluster), "--namespace", "pdd-system", "--create-namespace",
        "--set", ",".join(image_values), "--wait", "--timeout", "5m")  # fmt: skip
    # The chart's own test pod: the operator answers on its metrics Service.
    run(helm, "test", "pdd-operator", "--kubeconfig", str(cluster), "--namespace", "pdd-system",
        "--timeout", "3m")  # fmt: skip

    pdd = stand_in_example()
    namespace = pdd["metadata"].get("namespace", "default")
    name = pdd["metadata"]["name"]
    custom = client.CustomObjectsApi(api)
    custom.create_namespaced_custom_object("pdd.dev", "v1alpha1", namespace, "pddeployments", pdd)

    deadline = time.monotonic() + READY_TIMEOUT_S
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        body = custom.get_namespaced_custom_object(
            "pdd.dev", "v1alpha1", namespace, "pddeployments", name
        )
        status = body.get("status", {})
        ready = [c for c in status.get("conditions", []) if c["type"] == "Ready"]
        fresh = status.get("observedGeneration") == body["metadata"]["generation"]
        if fresh and ready and ready[0]["status"] == "True":
            break
        time.sleep(5)
    else:
        pytest.fail(
            f"{namespace}/{name} not Ready in {READY_TIMEOUT_S}s:\n"
            f"{yaml.safe_dump(body.get('status', {}))}\n{diagnostics(api, namespace)}"
        )

    assert status["prefillReplicas"] == "2/2"
    assert status["decodeReplicas"] == "4/4"
    # The topology agent ran on the (fake) GPU node with the sidecar image.
    agents = client.AppsV1Api(api).read_namespaced_daemon_set(
        "pdd-operator-topology-agent", "pdd-system"
    )
    assert agents.status.number_ready >= 1


def diagnostics(api: Any, namespace: str) -> str:
    """Pods and the operator's log tail, for a failure message that says what went wrong."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    lines = []
    for pod in core.list_namespaced_pod(namespace).items:
        states = [
            f"{s.name}: ready={s.ready} {s.state.waiting or s.state.terminated or ''}"
            for s in (pod.status.container_statuses or [])
            + (pod.status.init_container_statuses or [])
        ]
        lines.append(f"pod {pod.metadata.name} {pod.status.phase}: {'; '.join(states)}")
    for pod in core.list_namespaced_pod("pdd-system").items:
        if pod.metadata.name.startswith("pdd-operator-") and "agent" not in pod.metadata.name:
            log = core.read_namespaced_pod_log(pod.metadata.name, "pdd-system", tail_lines=60)
            lines.append(f"--- {pod.metadata.name} log:\n{log}")
    return "\n".join(lines)
