"""The node topology agent as it runs: a separate process (`python -m pdd_node.agent --once`)
with a kubeconfig for a ServiceAccount holding only the chart's agent RBAC (get + patch on
nodes), reading a fixture sysfs/procfs tree and publishing it on a simulated Node of the real
API server. A second run over an unchanged tree must not write at all: thousands of agents
re-publishing every minute would churn the API server and wake every Node watcher."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from helpers.waits import wait_for
from pdd_contract.labels import LABEL_GPUDIRECT, LABEL_RDMA_NICS, LABEL_TOPOLOGY_VERSION
from pdd_localcluster import LocalControlPlane, NodeSimulator, SimNode
from pdd_localcluster.kubejson import KubeJson
from pdd_node.kube import FIELD_MANAGER
from pdd_node.topology.annotation import RETIRED_TOPOLOGY_ANNOTATION
from pdd_node.topology.scan import scan

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "topology"
AGENT = "pdd-topology-agent-it"
AGENT_NAMESPACE = "pdd-topology-agent-it"

# fixture tree -> the GPUDirect mode its node must be labelled with
CASES = {"h100-hgx": "dmabuf", "old-kernel": "peermem"}
MERGE_PATCH = "application/merge-patch+json"


def node_name(fixture: str) -> str:
    return f"topo-{fixture}"


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def admin(kubeconfig: Path) -> Iterator[KubeJson]:
    api = KubeJson(kubeconfig, pool_size=2)
    yield api
    api.close()


@pytest.fixture(scope="module")
def topo_nodes(node_sim: NodeSimulator) -> Iterator[list[str]]:
    """One simulated HGX node per fixture tree; nothing writes them but the agent."""
    names = [node_name(f) for f in CASES]
    node_sim.add_nodes(SimNode(name) for name in names)
    yield names
    for name in names:
        node_sim.delete_node(name)


@pytest.fixture(scope="module")
def agent_kubeconfig(
    admin: KubeJson, control_plane: LocalControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """A kubeconfig with a ServiceAccount token bound to the chart's agent ClusterRole rules
    (charts/pdd-operator/templates/agent.yaml): get + patch on nodes, nothing else."""
    _create(admin, "/api/v1/namespaces", {"metadata": {"name": AGENT_NAMESPACE}})
    _create(
        admin,
        f"/api/v1/namespaces/{AGENT_NAMESPACE}/serviceaccounts",
        {"metadata": {"name": AGENT}},
    )
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    _create(
        admin,
        f"{rbac}/clusterroles",
        {
            "metadata": {"name": AGENT},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}],
        },
    )
    _create(
        admin,
        f"{rbac}/clusterrolebindings",
        {
            "metadata": {"name": AGENT},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": AGENT,
            },
            "subjects": [{"kind": "ServiceAccount", "name": AGENT, "namespace": AGENT_NAMESPACE}],
        },
    )
    token = admin.request(
        "POST",
        f"/api/v1/namespaces/{AGENT_NAMESPACE}/serviceaccounts/{AGENT}/token",
        body={
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600},
        },
    )["status"]["token"]
    doc = yaml.safe_load(control_plane.kubeconfig.read_text())
    doc["users"] = [{"name": AGENT, "user": {"token": token}}]
    doc["contexts"][0]["context"]["user"] = AGENT
    path = tmp_path_factory.mktemp("agent") / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    path.chmod(0o600)
    # The RBAC authorizer learns of the new binding from its informer: wait until it does.
    as_agent = KubeJson(path, pool_size=1)
    try:
        wait_for(lambda: as_agent.request("GET", "/api/v1/nodes/" + node_name("h100-hgx")), 10)
    finally:
        as_agent.close()
    yield path
    for path_ in (f"{rbac}/clusterrolebindings/{AGENT}", f"{rbac}/clusterroles/{AGENT}"):
        _delete(admin, path_)
    _delete(admin, f"/api/v1/namespaces/{AGENT_NAMESPACE}")


def _create(api: KubeJson, path: str, body: dict[str, Any]) -> None:
    try:
        api.request("POST", path, body=body)
    except ApiException as e:
        if e.status != 409:
            raise


def _delete(api: KubeJson, path: str) -> None:
    try:
        api.request("DELETE", path)
    except ApiException as e:
        if e.status != 404:
            raise


# ---------------------------------------------------------------------------- helpers


def run_agent(kubeconfig: Path, node: str, fixture: str) -> float:
    """One `--once` run of the agent process; returns its wall time."""
    root = FIXTURES / fixture
    env = {
        **os.environ,
        "NODE_NAME": node,
        "PYTHONPATH": os.pathsep.join(
            [str(REPO_ROOT / "operator"), os.environ.get("PYTHONPATH", "")]
        ),
    }
    env.pop("KUBECONFIG", None)
    argv = [
        sys.executable,
        "-m",
        "pdd_node.agent",
        "--once",
        f"--sysfs-root={root / 'sys'}",
        f"--procfs-root={root / 'proc'}",
        f"--kubeconfig={kubeconfig}",
    ]
    t0 = time.monotonic()
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    elapsed = time.monotonic() - t0
    assert res.returncode == 0, f"agent exited {res.returncode}:\n{res.stdout}\n{res.stderr}"
    return elapsed


def node_writes(control_plane: LocalControlPlane) -> int:
    """Writes to Node objects themselves (not nodes/status), by any client."""
    return control_plane.mutating_requests({"nodes"})


def read_node(admin: KubeJson, name: str) -> dict[str, Any]:
    return admin.request("GET", f"/api/v1/nodes/{name}")


def agent_fields(node: dict[str, Any]) -> set[str]:
    """The metadata keys the agent's field manager owns on the Node."""
    owned: set[str] = set()
    for entry in node["metadata"].get("managedFields") or []:
        if entry.get("manager") != FIELD_MANAGER:
            continue
        meta = entry.get("fieldsV1", {}).get("f:metadata", {})
        for section in ("f:annotations", "f:labels"):
            owned.update(k.removeprefix("f:") for k in meta.get(section, {}))
    return owned


# ---------------------------------------------------------------------------- tests


@pytest.mark.parametrize("fixture", list(CASES))
def test_agent_publishes_topology_once_and_then_writes_nothing(
    fixture: str,
    admin: KubeJson,
    control_plane: LocalControlPlane,
    topo_nodes: list[str],
    agent_kubeconfig: Path,
) -> None:
    node = node_name(fixture)
    expected = scan(FIXTURES / fixture / "sys", FIXTURES / fixture / "proc")
    before = read_node(admin, node)
    assert LABEL_GPUDIRECT not in (before["metadata"].get("labels") or {})

    writes0 = node_writes(control_plane)
    first_s = run_agent(agent_kubeconfig, node, fixture)
    # The counter moves when the apiserver's handler returns, a hair after the reply.
    wait_for(lambda: node_writes(control_plane) > writes0, 5, 0.05, "the agent's write counted")
    assert node_writes(control_plane) - writes0 == 1, "one merge patch for the labels"

    after = read_node(admin, node)
    meta = after["metadata"]
    assert meta["labels"][LABEL_GPUDIRECT] == CASES[fixture]
    assert meta["labels"][LABEL_RDMA_NICS] == str(expected.active_nic_count)
    assert meta["labels"][LABEL_TOPOLOGY_VERSION] == "v1"
    # Only its own keys, under its own field manager; what others wrote is left alone.
    assert agent_fields(after) == {LABEL_GPUDIRECT, LABEL_RDMA_NICS, LABEL_TOPOLOGY_VERSION}
    for key, value in before["metadata"]["labels"].items():
        assert meta["labels"][key] == value
    for key, value in before["metadata"]["annotations"].items():
        assert meta["annotations"][key] == value

    # Nothing changed on the node: the second run reads and leaves.
    writes1 = node_writes(control_plane)
    second_s = run_agent(agent_kubeconfig, node, fixture)
    time.sleep(0.2)
    assert node_writes(control_plane) == writes1, "an unchanged node was written"
    assert read_node(admin, node)["metadata"]["resourceVersion"] == meta["resourceVersion"]
    print(f"{fixture}: first run {first_s:.2f}s, second run {second_s:.2f}s")


def test_a_changed_node_gets_only_the_changed_keys(
    admin: KubeJson,
    control_plane: LocalControlPlane,
    topo_nodes: list[str],
    agent_kubeconfig: Path,
) -> None:
    """The same node after a kernel/driver downgrade (the old-kernel tree), still carrying the
    annotation an earlier agent wrote: one write, which moves the GPUDirect label to peermem
    and removes the annotation."""
    node = node_name("h100-hgx")
    current = read_node(admin, node)["metadata"].get("labels", {})
    if current.get(LABEL_GPUDIRECT) != "dmabuf":  # run alone: publish the h100 tree first
        run_agent(agent_kubeconfig, node, "h100-hgx")
    old = {"metadata": {"annotations": {RETIRED_TOPOLOGY_ANNOTATION: '{"version":"v1"}'}}}
    admin.request("PATCH", f"/api/v1/nodes/{node}", body=old, content_type=MERGE_PATCH)
    writes0 = node_writes(control_plane)
    run_agent(agent_kubeconfig, node, "old-kernel")
    wait_for(lambda: node_writes(control_plane) > writes0, 5, 0.05, "the agent's write counted")
    assert node_writes(control_plane) - writes0 == 1
    meta = read_node(admin, node)["metadata"]
    assert meta["labels"][LABEL_GPUDIRECT] == "peermem"
    assert RETIRED_TOPOLOGY_ANNOTATION not in (meta.get("annotations") or {})
