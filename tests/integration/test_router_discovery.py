"""The real upstream routers, run with the flags the operator rendered, find exactly the pods
they should pair: the deployment's own prefill and decode pods of its engine revision.

The operator renders a PDDeployment on the real control plane. Its pods go to a simulated node
of this test's own whose pods get loopback addresses (127.83.0.0/24), where stand-in engines
answer every GET with 200, so the router's health checks of the workers pass. The router
binary from the pinned wheel (vllm-router for vLLM, smg for SGLang) then runs here as a local
process with the rendered command and arguments, only its listening addresses moved to
loopback ports of its own, and authenticated as the router's own ServiceAccount (a
TokenRequest token: what its pod would get mounted), so the rendered Role is proven to be
enough for its discovery. A second deployment and a pod labelled like the deployment's
prefill but of another revision share the namespace; the router must leave both out.

vllm-router adds a discovered pod only once its /health answers (it waits up to its worker
startup timeout, one pod at a time), so pods at the usual simulated addresses, which answer
nothing, would stall it: hence the reachable stand-ins. The other deployment and the stray pod
run there too, so a router that wrongly selected one would list it.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from helpers.operator_proc import OperatorProcess
from helpers.waits import wait_for
from pdd_localcluster import LocalControlPlane, NodeSimulator, SimNode, gpu_node_labels

GROUP, VERSION, PLURAL = "pdd.dev", "v1alpha1", "pddeployments"
ENGINE_PORT = 18000
NODE = "router-lo-0"
# Only this test's pods go to its node: the taint keeps every other test's pods off it.
TAINT = {"key": "pdd.test/loopback", "value": "true", "effect": "NoSchedule"}
TOLERATION = {"key": "pdd.test/loopback", "operator": "Equal", "value": "true",
              "effect": "NoSchedule"}  # fmt: skip
ON_NODE = {"nodeSelector": {"kubernetes.io/hostname": NODE}, "tolerations": [TOLERATION]}
# engine type -> the router's console script (installed by `make test` from pyproject's dev
# dependencies, at the versions of tests/fixtures/routers/)
ROUTER_SCRIPT = {"vllm": "vllm-router", "sglang": "smg"}
# The flags whose values are addresses to listen on: moved to loopback ports of the test's.
LISTEN_FLAGS = {"--host", "--port", "--prometheus-host", "--prometheus-port"}


def router_binary(script: str) -> str | None:
    """The console script next to this interpreter (the project venv), else on PATH."""
    beside = Path(sys.executable).parent / script
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(script)


def pdd_body(name: str, engine: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PDDeployment",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "m"},
            "engine": {"type": engine, "image": f"example.com/{engine}:1", "port": ENGINE_PORT},
            "prefill": {"replicas": 2, "gpusPerInstance": 1, **ON_NODE},
            "decode": {"replicas": 2, "gpusPerInstance": 1, **ON_NODE},
            "topology": {"placement": "none"},
        },
    }


def ready(api: client.ApiClient, ns: str, name: str) -> bool:
    obj = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, name
    )
    status = obj.get("status", {})
    conds = {c["type"]: c["status"] for c in status.get("conditions", [])}
    return status.get("observedGeneration") == obj["metadata"]["generation"] and (
        conds.get("Ready") == "True"
    )


def pod_urls(core: client.CoreV1Api, ns: str, deployment: str, role: str) -> set[str]:
    """Where the role's pods of the revision the operator rendered serve HTTP."""
    template = (
        client.AppsV1Api(core.api_client)
        .read_namespaced_stateful_set(f"{deployment}-{role}", ns)
        .spec.template
    )
    revision = template.metadata.labels["pdd.dev/revision"]
    selector = f"pdd.dev/deployment={deployment},pdd.dev/role={role},pdd.dev/revision={revision}"
    pods = core.list_namespaced_pod(ns, label_selector=selector).items
    assert all(p.status.pod_ip for p in pods), "every engine pod has its IP by now"
    return {f"http://{p.status.pod_ip}:{ENGINE_PORT}" for p in pods}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def local_args(args: list[str], port: int, metrics_port: int) -> list[str]:
    """The rendered arguments with only the listening addresses replaced."""
    replaced = {
        "--host": "127.0.0.1",
        "--port": str(port),
        "--prometheus-host": "127.0.0.1",
        "--prometheus-port": str(metrics_port),
    }
    assert set(args) >= LISTEN_FLAGS, args
    out = list(args)
    for i, arg in enumerate(args[:-1]):
        if arg in replaced:
            out[i + 1] = replaced[arg]
    return out


def service_account_kubeconfig(
    cp: LocalControlPlane, api: client.ApiClient, ns: str, account: str, path: Path
) -> Path:
    """A kubeconfig with a TokenRequest token of the ServiceAccount, as its pod would get."""
    token = client.CoreV1Api(api).create_namespaced_service_account_token(
        account, ns, {"spec": {"expirationSeconds": 3600}}
    )
    user = f"system:serviceaccount:{ns}:{account}"
    ca = base64.b64encode(cp.ca_file.read_bytes()).decode()
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "local", "cluster": {"server": cp.server, "certificate-authority-data": ca}}
        ],
        "users": [{"name": user, "user": {"token": token.status.token}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
        "current-context": "local",
    }
    path.write_text(yaml.safe_dump(doc))
    path.chmod(0o600)
    return path


def get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            body = resp.read()
            return resp.status, json.loads(body) if body.startswith((b"{", b"[")) else body
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def discovered(base: str) -> dict[str, set[str]]:
    """URLs the router lists as workers, by type, from GET /workers (the fixtures README:
    vllm-router and smg both answer it with a JSON list of their workers)."""
    status, body = get(f"{base}/workers")
    assert status == 200, (status, body)
    workers = body["workers"] if isinstance(body, dict) else body
    by_type: dict[str, set[str]] = {}
    for worker in workers:
        by_type.setdefault(str(worker["worker_type"]).lower(), set()).add(worker["url"])
    return by_type


class _StandInEngine(BaseHTTPRequestHandler):
    """200 and a small JSON to every GET: /health, /v1/models and whatever else the routers
    poll on a worker."""

    def do_GET(self) -> None:
        body = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def loopback_node(control_plane: LocalControlPlane) -> Iterator[str]:
    """A simulated node whose pods get 127.83.0.x, each with a stand-in engine listening on
    ENGINE_PORT there (Linux routes all of 127.0.0.0/8 to the loopback interface)."""
    addresses = [f"127.83.0.{i}" for i in range(1, 40)]
    servers = [ThreadingHTTPServer((ip, ENGINE_PORT), _StandInEngine) for ip in addresses]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    node = SimNode(NODE, labels=gpu_node_labels(), taints=(TAINT,))
    sim = NodeSimulator(control_plane.kubeconfig, [node], pod_ips=iter(addresses)).start()
    try:
        yield NODE
    finally:
        sim.delete_node(NODE)
        sim.stop()
        for server in servers:
            server.shutdown()
            server.server_close()


@pytest.fixture
def stray_pod(api_client: client.ApiClient, namespace: str, loopback_node: str) -> Iterator[str]:
    """A Running, Ready pod labelled as deployment `alpha`'s prefill, but of another revision
    (what an old pod looks like mid-rollout), bound straight to the loopback node."""
    core = client.CoreV1Api(api_client)
    labels = {"pdd.dev/deployment": "alpha", "pdd.dev/role": "prefill", "pdd.dev/revision": "0ld"}
    pod = {
        "metadata": {"name": "stray-alpha-prefill", "labels": labels},
        "spec": {
            "nodeName": loopback_node,
            "tolerations": [TOLERATION],
            "containers": [{"name": "engine", "image": "example.com/x:1"}],
        },
    }
    core.create_namespaced_pod(namespace, pod)
    ip = wait_for(
        lambda: core.read_namespaced_pod("stray-alpha-prefill", namespace).status.pod_ip,
        30,
        what="stray pod IP",
    )
    yield f"http://{ip}:{ENGINE_PORT}"


@pytest.mark.parametrize("engine", sorted(ROUTER_SCRIPT))
def test_the_rendered_router_discovers_exactly_its_deployments_pods_of_its_revision(
    operator: OperatorProcess,
    control_plane: LocalControlPlane,
    api_client: client.ApiClient,
    namespace: str,
    stray_pod: str,
    tmp_path: Path,
    engine: str,
) -> None:
    binary = router_binary(ROUTER_SCRIPT[engine])
    if binary is None:
        pytest.skip(
            f"{ROUTER_SCRIPT[engine]} is not installed (make test installs it from the dev "
            "dependencies in pyproject.toml)"
        )
    objects = client.CustomObjectsApi(api_client)
    for name in ("alpha", "beta"):
        objects.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, pdd_body(name, engine)
        )
    for name in ("alpha", "beta"):
        wait_for(lambda n=name: ready(api_client, namespace, n), 90, what=f"{name} Ready")  # type: ignore[misc]

    core = client.CoreV1Api(api_client)
    expected = {role: pod_urls(core, namespace, "alpha", role) for role in ("prefill", "decode")}
    others = pod_urls(core, namespace, "beta", "prefill") | pod_urls(
        core, namespace, "beta", "decode"
    )
    assert len(expected["prefill"]) == len(expected["decode"]) == 2
    assert stray_pod not in expected["prefill"]

    deployment = client.AppsV1Api(api_client).read_namespaced_deployment("alpha-router", namespace)
    pod_spec = deployment.spec.template.spec
    container = pod_spec.containers[0]
    port, metrics_port = free_port(), free_port()
    argv = [binary, *local_args(list(container.args), port, metrics_port)]
    assert container.command == [ROUTER_SCRIPT[engine]]
    kubeconfig = service_account_kubeconfig(
        control_plane, api_client, namespace, pod_spec.service_account_name, tmp_path / "kc"
    )
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),  # no ~/.kube/config of the machine's
        "KUBECONFIG": str(kubeconfig),  # kube-rs reads it before any in-cluster config
    }
    log = tmp_path / "router.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        want = {"prefill": expected["prefill"], "decode": expected["decode"]}
        try:
            found = wait_for(
                lambda: (lambda d: d if d == want else None)(discovered(base)),
                60,
                what="the router to list alpha's prefill and decode pods",
            )
        except AssertionError as err:
            raise AssertionError(f"{err}\n--- router log ---\n{log.read_text()[-6000:]}") from err
        everything = found["prefill"] | found["decode"]
        assert not everything & others, "a pod of another deployment was discovered"
        assert stray_pod not in everything, "a pod of another revision was discovered"
        assert proc.poll() is None, log.read_text()[-6000:]
        # The probes' paths: ready once a healthy prefill and decode are known.
        wait_for(lambda: get(f"{base}/readiness")[0] == 200, 60, what="router /readiness 200")
        assert get(f"{base}/liveness")[0] == 200
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    # Only list and watch on pods, as the rendered Role allows: a refusal would show here.
    # The API server refuses with a Status whose reason is Forbidden ("pods is forbidden: ...");
    # a bare "403" also turns up in the router's timestamps.
    assert b"forbidden" not in log.read_bytes().lower()
