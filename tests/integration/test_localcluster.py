"""The local cluster itself: real control plane, real scheduler and controllers, simulated nodes.

These pin down what every other integration test takes for granted."""

from __future__ import annotations

import ipaddress
import time
from collections import Counter
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from helpers.waits import wait_for, wait_namespaces_gone
from pdd_localcluster import LocalControlPlane, NodeSimulator, SimNode
from pdd_localcluster.nodes import SIMULATED_RANGE


def gpu_statefulset(name: str, replicas: int, gpus: int = 8) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "initContainers": [{"name": "preflight", "image": "busybox:1.36"}],
                    "containers": [
                        {
                            "name": "engine",
                            "image": "vllm/vllm-openai:v0.11.0",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                        }
                    ],
                },
            },
        },
    }


def pod_body(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "initContainers": [{"name": "preflight", "image": "busybox:1.36"}],
            "containers": [{"name": "main", "image": "busybox:1.36"}],
            **spec,
        },
    }


def create_once(apps: client.AppsV1Api, ns: str, body: dict[str, Any]) -> bool:
    """Creates the StatefulSet; an earlier try that got through but lost its answer counts."""
    try:
        apps.create_namespaced_stateful_set(ns, body)
    except ApiException as e:
        if e.status != 409:
            raise
    return True


def ready_replicas(apps: client.AppsV1Api, ns: str, name: str) -> int:
    return apps.read_namespaced_stateful_set(name, ns).status.ready_replicas or 0


def pods(core: client.CoreV1Api, ns: str) -> list[client.V1Pod]:
    return list(core.list_namespaced_pod(ns).items)


def condition(pod: client.V1Pod, ctype: str) -> str | None:
    return next((c.status for c in pod.status.conditions or [] if c.type == ctype), None)


def pod_ready(core: client.CoreV1Api, ns: str, name: str) -> str | None:
    return condition(core.read_namespaced_pod(name, ns), "Ready")


@pytest.fixture
def core(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


@pytest.fixture
def apps(api_client: client.ApiClient) -> client.AppsV1Api:
    return client.AppsV1Api(api_client)


def test_apiserver_is_the_pinned_version(
    control_plane: LocalControlPlane, api_client: client.ApiClient
) -> None:
    assert client.VersionApi(api_client).get_code().git_version == "v1.35.4"
    assert control_plane.version == "v1.35.4"


def test_fleet_registers_ready_gpu_nodes(core: client.CoreV1Api, node_sim: NodeSimulator) -> None:
    nodes = {n.metadata.name: n for n in core.list_node().items}
    assert set(node_sim.node_names) <= set(nodes)
    fleet = [nodes[name] for name in node_sim.node_names]
    assert len(fleet) == 8
    cliques = Counter(n.metadata.labels["nvidia.com/gpu.clique"] for n in fleet)
    assert cliques == {"clique-a": 4, "clique-b": 4}
    for node in fleet:
        labels = node.metadata.labels
        assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        assert labels["topology.kubernetes.io/rack"].startswith("rack-")
        assert labels["topology.kubernetes.io/zone"] == "zone-a"
        assert node.status.allocatable["nvidia.com/gpu"] == "8"
        # The admission plugin's not-ready taint must be gone, or nothing would schedule.
        assert not node.spec.taints
        assert condition_status(node, "Ready") == "True"
        ip = next(a.address for a in node.status.addresses if a.type == "InternalIP")
        assert ipaddress.ip_address(ip) in SIMULATED_RANGE


def condition_status(node: client.V1Node, ctype: str) -> str | None:
    return next((c.status for c in node.status.conditions if c.type == ctype), None)


def test_statefulset_is_scheduled_onto_simulated_nodes_and_becomes_ready(
    apps: client.AppsV1Api, core: client.CoreV1Api, node_sim: NodeSimulator, namespace: str
) -> None:
    apps.create_namespaced_stateful_set(namespace, gpu_statefulset("engine", 2))

    wait_for(lambda: ready_replicas(apps, namespace, "engine") == 2, 30, what="2 ready replicas")

    running = pods(core, namespace)
    assert len(running) == 2
    # 8 GPUs each on 8-GPU nodes: the real scheduler had to use two nodes.
    assert len({p.spec.node_name for p in running}) == 2
    assert {p.spec.node_name for p in running} <= set(node_sim.node_names)
    assert len({p.status.pod_ip for p in running}) == 2
    for pod in running:
        assert pod.status.phase == "Running"
        assert ipaddress.ip_address(pod.status.pod_ip) in SIMULATED_RANGE
        assert pod.status.pod_ips[0].ip == pod.status.pod_ip
        assert pod.status.host_ip == node_sim.node_ip(pod.spec.node_name)
        assert pod.status.start_time is not None
        for ctype in ("PodScheduled", "Initialized", "ContainersReady", "Ready"):
            assert condition(pod, ctype) == "True", ctype
        (init,) = pod.status.init_container_statuses
        assert init.state.terminated.exit_code == 0
        (main,) = pod.status.container_statuses
        assert main.ready and main.started and main.state.running is not None


def test_endpointslices_carry_the_simulated_pod_ips(
    api_client: client.ApiClient,
    apps: client.AppsV1Api,
    core: client.CoreV1Api,
    node_sim: NodeSimulator,
    namespace: str,
) -> None:
    apps.create_namespaced_stateful_set(namespace, gpu_statefulset("engine", 2))
    service = {
        "metadata": {"name": "engine"},
        "spec": {"clusterIP": "None", "selector": {"app": "engine"}, "ports": [{"port": 8000}]},
    }
    core.create_namespaced_service(namespace, service)
    wait_for(lambda: ready_replicas(apps, namespace, "engine") == 2, 30, what="2 ready replicas")
    pod_ips = {p.status.pod_ip for p in pods(core, namespace)}
    discovery = client.DiscoveryV1Api(api_client)

    def ready_addresses() -> set[str]:
        slices = discovery.list_namespaced_endpoint_slice(namespace).items
        return {
            addr
            for s in slices
            for ep in s.endpoints or []
            if ep.conditions.ready
            for addr in ep.addresses
        }

    # The EndpointSlice controller refuses loopback addresses; these must pass its checks.
    wait_for(lambda: ready_addresses() == pod_ips, 30, what="EndpointSlices with the pod IPs")


def test_pod_asking_more_gpus_than_a_node_has_stays_pending(
    core: client.CoreV1Api, node_sim: NodeSimulator, namespace: str
) -> None:
    body = pod_body("too-big")
    body["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "16"}}
    core.create_namespaced_pod(namespace, body)

    def unschedulable() -> bool:
        pod = core.read_namespaced_pod("too-big", namespace)
        return any(
            c.type == "PodScheduled" and c.reason == "Unschedulable"
            for c in pod.status.conditions or []
        )

    wait_for(unschedulable, 30, what="the scheduler to give up on 16 GPUs")
    assert core.read_namespaced_pod("too-big", namespace).spec.node_name is None


def test_scale_down_force_deletes_the_pod(
    apps: client.AppsV1Api, core: client.CoreV1Api, node_sim: NodeSimulator, namespace: str
) -> None:
    apps.create_namespaced_stateful_set(namespace, gpu_statefulset("engine", 2))
    wait_for(lambda: ready_replicas(apps, namespace, "engine") == 2, 30, what="2 ready replicas")
    started = time.monotonic()

    apps.patch_namespaced_stateful_set_scale("engine", namespace, {"spec": {"replicas": 1}})

    remaining = lambda: [p.metadata.name for p in pods(core, namespace)]  # noqa: E731
    wait_for(lambda: remaining() == ["engine-0"], 20, what="engine-1 gone")
    # Without a kubelet the pod would sit Terminating for its 30 s grace period.
    assert time.monotonic() - started < 20
    wait_for(lambda: ready_replicas(apps, namespace, "engine") == 1, 30, what="1 ready replica")


def test_deleting_the_owner_garbage_collects_its_pods(
    apps: client.AppsV1Api, core: client.CoreV1Api, node_sim: NodeSimulator, namespace: str
) -> None:
    apps.create_namespaced_stateful_set(namespace, gpu_statefulset("engine", 2))
    wait_for(lambda: ready_replicas(apps, namespace, "engine") == 2, 30, what="2 ready replicas")

    apps.delete_namespaced_stateful_set("engine", namespace, propagation_policy="Background")

    wait_for(lambda: not pods(core, namespace), 30, what="pods collected")


def test_mutating_requests_counts_writes_not_reads(
    control_plane: LocalControlPlane, core: client.CoreV1Api, namespace: str
) -> None:
    # PodTemplates: no controller here writes them, so only this test moves the counter.
    resource = {"podtemplates"}
    wait_namespaces_gone(core.api_client)  # their clean-up deletes podtemplates too
    before = control_plane.mutating_requests(resource)
    template = {"metadata": {"name": "t"}, "template": {"spec": {"containers": []}}}
    template["template"]["spec"]["containers"] = [{"name": "c", "image": "busybox:1.36"}]

    core.create_namespaced_pod_template(namespace, template)

    # The apiserver counts a request just after answering it, so give it a moment.
    wait_for(lambda: control_plane.mutating_requests(resource) > before, 10, what="the count")
    after_create = control_plane.mutating_requests(resource)
    assert after_create == before + 1
    core.read_namespaced_pod_template("t", namespace)
    core.list_namespaced_pod_template(namespace)
    assert control_plane.mutating_requests(resource) == after_create
    assert control_plane.mutating_requests() > after_create  # unfiltered: every writer


def test_failing_init_outcome_shows_in_pod_status(
    core: client.CoreV1Api, node_sim: NodeSimulator, namespace: str
) -> None:
    def preflight(pod: dict[str, Any], node: SimNode) -> tuple[int, str] | None:
        if pod["metadata"].get("labels", {}).get("preflight") == "fail":
            return 3, f"RDMA path check failed on {node.name}: UCX fell back to tcp"
        return None

    with node_sim.using_init_outcome(preflight):
        core.create_namespaced_pod(namespace, pod_body("bad", {"preflight": "fail"}))
        core.create_namespaced_pod(namespace, pod_body("good"))

        def init_failed() -> client.V1Pod | None:
            pod = core.read_namespaced_pod("bad", namespace)
            statuses = pod.status.init_container_statuses or []
            done = statuses and statuses[0].state.terminated
            return pod if done else None

        bad = wait_for(init_failed, 30, what="the preflight failure")
        wait_for(lambda: pod_ready(core, namespace, "good") == "True", 30, what="good pod Ready")

    terminated = bad.status.init_container_statuses[0].state.terminated
    assert terminated.exit_code == 3
    assert terminated.reason == "Error"
    assert (
        terminated.message
        == f"RDMA path check failed on {bad.spec.node_name}: UCX fell back to tcp"
    )
    assert bad.status.phase == "Pending"
    assert condition(bad, "Initialized") == "False"
    assert condition(bad, "Ready") == "False"
    assert bad.status.container_statuses[0].state.waiting.reason == "PodInitializing"


def test_node_not_ready_marks_its_pods_not_ready(
    core: client.CoreV1Api, node_sim: NodeSimulator, namespace: str
) -> None:
    node = SimNode(f"flaky-{namespace[-6:]}")
    node_sim.add_nodes([node])
    try:
        pinned = pod_body("pinned", nodeSelector={"kubernetes.io/hostname": node.name})
        core.create_namespaced_pod(namespace, pinned)
        wait_for(lambda: pod_ready(core, namespace, "pinned") == "True", 30, what="pod Ready")

        node_sim.set_node_ready(node.name, False, "NICDown")

        v1node = core.read_node(node.name)
        assert condition_status(v1node, "Ready") == "False"
        assert [t.key for t in v1node.spec.taints] == ["node.kubernetes.io/not-ready"]
        wait_for(lambda: pod_ready(core, namespace, "pinned") == "False", 30, what="not Ready")

        node_sim.set_node_ready(node.name, True)

        assert not core.read_node(node.name).spec.taints
        wait_for(lambda: pod_ready(core, namespace, "pinned") == "True", 30, what="Ready again")
    finally:
        node_sim.delete_node(node.name)
    with pytest.raises(ApiException) as gone:
        core.read_node(node.name)
    assert gone.value.status == 404
    wait_for(lambda: not pods(core, namespace), 30, what="its pods deleted with it")


def test_simulator_recovers_after_an_apiserver_restart(
    control_plane: LocalControlPlane,
    apps: client.AppsV1Api,
    core: client.CoreV1Api,
    node_sim: NodeSimulator,
    namespace: str,
) -> None:
    control_plane.restart_apiserver()

    # The client's pooled connections died with the old apiserver; the first call may fail.
    wait_for(lambda: create_once(apps, namespace, gpu_statefulset("after", 1)), 20, what="create")
    wait_for(lambda: ready_replicas(apps, namespace, "after") == 1, 90, what="Ready after restart")
