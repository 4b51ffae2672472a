"""The operator's own list+watch of Nodes and bound Pods (informers/fleet.py, listwatch.py) on a
real API server: what it keeps and what it drops (tests/unit/test_fleet_store.py has the rest)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from helpers.operator_proc import CONFINED_USER
from helpers.waits import wait_for
from pdd_contract.resources import GPU_RESOURCE
from pdd_localcluster import LocalControlPlane, NodeSimulator
from pdd_localcluster.nodes import SimNode, gpu_node_capacity, gpu_node_labels
from pdd_operator.informers.fleet import FleetState, fleet_collections
from pdd_operator.informers.listwatch import Watches
from pdd_operator.kube.client import KubeApi, load_api_client

TAINT = {"key": "pdd.test/fleet-watch", "value": "true", "effect": "NoSchedule"}


class RunningWatch:
    """The fleet's informers on an event loop of their own thread, as the operator runs them."""

    def __init__(self, kube: KubeApi, namespaces: tuple[str, ...] = ()) -> None:
        self.state = FleetState()
        self.watch = Watches(kube)
        self.watch.add(fleet_collections(self.state, namespaces))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _start(self) -> None:
        self.watch.start()

    def wait_synced(self, timeout: float) -> None:
        asyncio.run_coroutine_threadsafe(self.watch.synced(), self.loop).result(timeout)

    def close(self) -> None:
        self.watch.stop()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def running(api_client: client.ApiClient) -> Iterator[RunningWatch]:
    watch = RunningWatch(KubeApi(api_client))
    yield watch
    watch.close()


@pytest.fixture
def own_node(node_sim: NodeSimulator) -> Iterator[str]:
    node = SimNode(
        "fleet-watch-0",
        labels=gpu_node_labels(8, "clique-fleet-watch"),
        capacity=gpu_node_capacity(8),
        taints=(TAINT,),
    )
    with node_sim.nodes_for_a_while([node]) as names:
        yield names[0]


def bound_pod(name: str, node: str, gpus: int) -> dict[str, Any]:
    resources = {"limits": {GPU_RESOURCE: str(gpus)}} if gpus else {}
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "tolerations": [{**TAINT, "operator": "Equal"}],
            "containers": [{"name": "main", "image": "sim", "resources": resources}],
        },
    }


def on_node(state: FleetState, node: str) -> Callable[[], list[dict[str, Any]]]:
    return lambda: [
        p
        for store in list(state.pods_by_namespace.values())
        for p in store.values()
        if p["spec"]["nodeName"] == node
    ]


def used_on(state: FleetState, node: str) -> Callable[[], int]:
    return lambda: state.gpus.usage().used.get(node, 0)


def test_lists_every_node_then_follows_nodes_joining_and_leaving(
    running: RunningWatch, node_sim: NodeSimulator
) -> None:
    running.wait_synced(30)
    assert set(node_sim.node_names) <= {n["metadata"]["name"] for n in running.state.nodes.values()}
    joining = SimNode("fleet-watch-joins", capacity=gpu_node_capacity(4))
    with node_sim.nodes_for_a_while([joining]):
        node = wait_for(lambda: running.state.nodes.get("fleet-watch-joins"), 30, what="the node")
        assert node["status"]["allocatable"] == {GPU_RESOURCE: "4"}
        assert [c["type"] for c in node["status"]["conditions"]] == ["Ready"]
    wait_for(lambda: running.state.nodes.get("fleet-watch-joins") is None, 30, what="the node gone")


def test_keeps_bound_pods_that_hold_gpus_and_drops_them_when_deleted(
    running: RunningWatch, own_node: str, namespace: str, api_client: client.ApiClient
) -> None:
    core = client.CoreV1Api(api_client)
    running.wait_synced(30)
    core.create_namespaced_pod(namespace, bound_pod("cpu-only", own_node, gpus=0))
    core.create_namespaced_pod(namespace, bound_pod("two-gpus", own_node, gpus=2))
    pods = wait_for(on_node(running.state, own_node), 30, what="the GPU pod kept")
    assert [p["spec"]["containers"][0]["resources"]["requests"] for p in pods] == [
        {GPU_RESOURCE: "2"}
    ]
    wait_for(lambda: used_on(running.state, own_node)() == 2, 30, what="its 2 GPUs counted")
    core.delete_namespaced_pod("two-gpus", namespace, grace_period_seconds=0)
    wait_for(lambda: not on_node(running.state, own_node)(), 30, what="the GPU pod dropped")
    wait_for(lambda: used_on(running.state, own_node)() == 0, 30, what="its GPUs uncounted")


@pytest.fixture
def confined_to(
    control_plane: LocalControlPlane, namespace: str, api_client: client.ApiClient
) -> Iterator[KubeApi]:
    """An API client whose user may read Nodes, and pods in `namespace` only (the chart's
    RBAC with watchNamespaces set)."""
    rbac = client.RbacAuthorizationV1Api(api_client)
    name = f"fleet-watch-{namespace}"
    subject = [{"kind": "User", "name": CONFINED_USER, "apiGroup": "rbac.authorization.k8s.io"}]
    read = ["get", "list", "watch"]
    rbac.create_cluster_role(
        {
            "metadata": {"name": name},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": read}],
        }
    )
    rbac.create_cluster_role_binding(
        {"metadata": {"name": name}, "subjects": subject,
         "roleRef": {"kind": "ClusterRole", "name": name, "apiGroup": "rbac.authorization.k8s.io"}}
    )  # fmt: skip
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": name},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": read}],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {"metadata": {"name": name}, "subjects": subject,
         "roleRef": {"kind": "Role", "name": name, "apiGroup": "rbac.authorization.k8s.io"}},
    )  # fmt: skip
    kubeconfig = control_plane.kubeconfig_for(CONFINED_USER)
    try:
        yield KubeApi(load_api_client(str(kubeconfig)))
    finally:
        rbac.delete_cluster_role_binding(name)
        rbac.delete_cluster_role(name)


def test_an_operator_confined_to_namespaces_counts_their_gpu_pods_only(
    confined_to: KubeApi,
    own_node: str,
    namespace: str,
    api_client: client.ApiClient,
) -> None:
    """With Roles in its namespaces only, a cluster-wide pod list is refused: the watch asks
    each namespace, syncs, and keeps that namespace's GPU pods (others' are not its to see)."""
    core = client.CoreV1Api(api_client)
    core.create_namespaced_pod(namespace, bound_pod("ours", own_node, gpus=1))
    core.create_namespaced_pod("default", bound_pod(f"other-{namespace}", own_node, gpus=1))
    try:
        running = RunningWatch(confined_to, namespaces=(namespace,))
        try:
            running.wait_synced(30)
            pods = wait_for(on_node(running.state, own_node), 30, what="the namespace's pod")
            assert [p["metadata"]["namespace"] for p in pods] == [namespace]
        finally:
            running.close()
    finally:
        core.delete_namespaced_pod(f"other-{namespace}", "default", grace_period_seconds=0)
