"""Fleet realism on the real control plane: every FleetActivity knob does what it says.

The simulator here has nodes of its own and fast periods (a kubelet renews its Lease every
10 s; here every 0.5 s), so each behaviour shows within seconds."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from helpers.waits import wait_for
from pdd_localcluster import LocalControlPlane, NodeSimulator, SimNode
from pdd_localcluster.fleet_activity import (
    DAEMON_NAMESPACE,
    FOREIGN_NAMESPACE,
    LABEL_SIMULATED,
    LEASE_NAMESPACE,
    FleetActivity,
)

ACTIVITY = FleetActivity(
    lease_renew_s=0.5,
    node_status_report_s=1.0,
    daemon_pods_per_node=2,
    foreign_gpu_pods=2,
    foreign_gpu_pod_lifetime_s=2.0,
    pod_stage_delays_s=(0.5, 0.5),
)
NODES = ("busy-0", "busy-1")


@pytest.fixture(scope="module")
def busy_sim(control_plane: LocalControlPlane) -> Iterator[NodeSimulator]:
    sim = NodeSimulator(control_plane.kubeconfig, [SimNode(n) for n in NODES], activity=ACTIVITY)
    with sim:
        yield sim
        for name in NODES:
            sim.delete_node(name)


@pytest.fixture(scope="module")
def core(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


@pytest.fixture(scope="module")
def leases(api_client: client.ApiClient) -> client.CoordinationV1Api:
    return client.CoordinationV1Api(api_client)


def renew_time(leases: client.CoordinationV1Api, node: str) -> Any:
    try:
        return leases.read_namespaced_lease(node, LEASE_NAMESPACE).spec.renew_time
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def test_each_node_renews_its_lease(
    busy_sim: NodeSimulator, leases: client.CoordinationV1Api
) -> None:
    for node in NODES:
        first = wait_for(lambda n=node: renew_time(leases, n), 10, what=f"lease of {node}")
        wait_for(lambda n=node, t=first: renew_time(leases, n) != t, 5, what="lease renewed")
        lease = leases.read_namespaced_lease(node, LEASE_NAMESPACE)
        assert lease.spec.holder_identity == node
    assert busy_sim.stats.lease_renewals >= 2 * len(NODES)


def test_a_deleted_node_stops_renewing_and_loses_its_lease(
    busy_sim: NodeSimulator, leases: client.CoordinationV1Api
) -> None:
    with busy_sim.nodes_for_a_while([SimNode("busy-gone")]) as (name,):
        wait_for(lambda: renew_time(leases, name), 10, what="lease created")
    # A span, not a wait: a renewal that had not stopped would create the Lease again.
    time.sleep(2 * ACTIVITY.lease_renew_s)  # type: ignore[operator]
    assert renew_time(leases, name) is None


def ready_condition(core: client.CoreV1Api, node: str) -> client.V1NodeCondition:
    return next(c for c in core.read_node(node).status.conditions if c.type == "Ready")


def test_node_status_reports_move_only_the_heartbeat(
    busy_sim: NodeSimulator, core: client.CoreV1Api
) -> None:
    node = NODES[0]
    before = ready_condition(core, node)
    wait_for(
        lambda: ready_condition(core, node).last_heartbeat_time != before.last_heartbeat_time,
        10,
        what="a status report",
    )
    after = ready_condition(core, node)
    assert (after.status, after.reason, after.last_transition_time) == (
        before.status,
        before.reason,
        before.last_transition_time,
    )
    # A report carries no readiness: a node set NotReady stays NotReady through reports.
    busy_sim.set_node_ready(node, False, "NICDown")
    try:
        reports = busy_sim.stats.node_status_reports
        wait_for(lambda: busy_sim.stats.node_status_reports > reports + 1, 10, what="reports")
        assert ready_condition(core, node).status == "False"
    finally:
        busy_sim.set_node_ready(node, True)


def daemon_pods(core: client.CoreV1Api) -> list[client.V1Pod]:
    pods = core.list_namespaced_pod(
        DAEMON_NAMESPACE, label_selector=f"{LABEL_SIMULATED}=daemon"
    ).items
    return [p for p in pods if p.spec.node_name in NODES]


def all_ready(pods: list[client.V1Pod]) -> bool:
    return all(
        any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
        for p in pods
    )


def test_every_node_runs_its_daemon_pods(busy_sim: NodeSimulator, core: client.CoreV1Api) -> None:
    pods = daemon_pods(core)
    per_node = {n: sum(1 for p in pods if p.spec.node_name == n) for n in NODES}
    assert per_node == {n: ACTIVITY.daemon_pods_per_node for n in NODES}
    wait_for(lambda: all_ready(daemon_pods(core)), 20, what="daemon pods Ready")


def test_foreign_gpu_pods_come_and_go(busy_sim: NodeSimulator, core: client.CoreV1Api) -> None:
    created = busy_sim.stats.foreign_pods_created
    wait_for(
        lambda: (
            busy_sim.stats.foreign_pods_created >= created + 2
            and busy_sim.stats.foreign_pods_deleted >= 2
        ),
        15,
        what="foreign pods replaced",
    )
    live = [
        p
        for p in core.list_namespaced_pod(FOREIGN_NAMESPACE).items
        if not p.metadata.deletion_timestamp
    ]
    assert 1 <= len(live) <= ACTIVITY.foreign_gpu_pods
    assert all(p.spec.containers[0].resources.limits["nvidia.com/gpu"] for p in live)
    # They are scheduled like any pod and take GPUs from the fleet.
    wait_for(
        lambda: any(p.spec.node_name for p in core.list_namespaced_pod(FOREIGN_NAMESPACE).items),
        15,
        what="a foreign pod scheduled",
    )


def stage_of(pod: client.V1Pod) -> tuple[str, bool, bool]:
    """(phase, has a pod IP, Ready)."""
    ready = any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
    return pod.status.phase, bool(pod.status.pod_ip), ready


def test_pod_status_moves_through_the_kubelets_stages_in_separate_writes(
    busy_sim: NodeSimulator, core: client.CoreV1Api, namespace: str
) -> None:
    body = {
        "metadata": {"name": "staged"},
        "spec": {"nodeName": NODES[1], "containers": [{"name": "main", "image": "busybox"}]},
    }
    created = core.create_namespaced_pod(namespace, body)
    seen: list[tuple[str, bool, bool]] = []
    w = watch.Watch()
    for event in w.stream(
        core.list_namespaced_pod,
        namespace,
        field_selector="metadata.name=staged",
        resource_version=created.metadata.resource_version,
        timeout_seconds=20,
    ):
        stage = stage_of(event["object"])
        if not seen or seen[-1] != stage:
            seen.append(stage)
        if stage[2]:
            w.stop()
    assert seen == [
        ("Pending", False, False),  # containers being created, no sandbox IP yet
        ("Running", True, False),  # started, readiness not passed
        ("Running", True, True),
    ]
