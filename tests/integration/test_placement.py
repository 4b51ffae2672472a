"""Topology-aware placement and the KV-transfer environment on the real control plane.

Two NVLink cliques of four simulated 8-GPU nodes with mixed dma-buf eligibility; the operator
plans, the real kube-scheduler enforces. A failing preflight (the real preflight checks run
against a fixture node topology) surfaces as a condition and an event.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from helpers.factories import pdd_body
from helpers.operator_proc import OperatorProcess
from helpers.waits import wait_for
from pdd_localcluster.nodes import SimNode, gpu_node_capacity, gpu_node_labels
from pdd_node.preflight import (
    ContainerFacts,
    PreflightConfig,
    run_preflight,
    termination_message,
)
from pdd_node.topology.scan import scan

GROUP, VERSION, PLURAL = "pdd.dev", "v1alpha1", "pddeployments"
RDMA = "rdma/hca"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "topology"
FIXTURE_ANNOTATION = "pdd.test/topology-fixture"
# clique-x: two dma-buf nodes (16 GPUs) + two without GPUDirect; clique-y: one dma-buf node.
ELIGIBILITY = {"x-0": "dmabuf", "x-1": "dmabuf", "x-2": "none", "x-3": "none",
               "y-0": "dmabuf", "y-1": "none", "y-2": "none", "y-3": "none"}  # fmt: skip
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def topo_nodes(node_sim: Any) -> Iterator[list[str]]:
    nodes = []
    for suffix, mode in ELIGIBILITY.items():
        clique = "clique-" + suffix[0]
        labels = {
            **gpu_node_labels(8, clique),
            "pdd.dev/gpudirect": mode,
            "topology.kubernetes.io/rack": f"rack-{suffix[0]}",
            "pdd-test": "placement",
        }
        fixture = "h100-hgx" if mode == "dmabuf" else "proprietary-no-peermem"
        nodes.append(
            SimNode(
                f"topo-{suffix}",
                labels=labels,
                annotations={FIXTURE_ANNOTATION: fixture},
                capacity={**gpu_node_capacity(8), RDMA: "64"},
            )
        )
    with node_sim.nodes_for_a_while(nodes) as names:
        yield names


def spec(prefill: int, decode: int, tp: int = 2, **kv: Any) -> dict[str, Any]:
    """The patch to the sample spec."""
    return {
        "router": {"enabled": False},
        "prefill": {"replicas": prefill, "gpusPerInstance": tp},
        "decode": {"replicas": decode, "gpusPerInstance": tp},
        "kvTransfer": {"rdma": {"resourceName": RDMA}, **kv},
        "topology": {"placement": "required"},
    }


def create(api: client.ApiClient, ns: str, name: str, spec_patch: dict[str, Any]) -> None:
    body = pdd_body(name, ns, **spec_patch)
    client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)


def condition(api: client.ApiClient, ns: str, name: str, type_: str) -> dict[str, Any]:
    body = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, name
    )
    return next((c for c in body.get("status", {}).get("conditions", []) if c["type"] == type_), {})


def test_a_slice_too_big_for_any_clique_is_reported_in_placed(
    operator: OperatorProcess, api_client: client.ApiClient, namespace: str, topo_nodes: list[str]
) -> None:
    create(api_client, namespace, "huge", spec(8, 8))  # 32 GPUs; the best clique has 16 eligible
    placed = wait_for(
        lambda: condition(api_client, namespace, "huge", "Placed") or None,
        60,
        what="Placed condition",
    )
    assert placed["status"] == "False", placed
    assert placed["reason"] == "InsufficientCapacity"
    assert "no nvidia.com/gpu.clique has 32 free GPUs" in placed["message"]
    assert "largest has 16" in placed["message"]
    client.CustomObjectsApi(api_client).delete_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "huge"
    )
    core = client.CoreV1Api(api_client)
    wait_for(lambda: not core.list_namespaced_pod(namespace).items, 60, what="huge's pods gone")


def test_2p4d_lands_in_one_clique_on_dmabuf_nodes_only(
    operator: OperatorProcess, api_client: client.ApiClient, namespace: str, topo_nodes: list[str]
) -> None:
    create(api_client, namespace, "llama", spec(2, 4))  # 12 GPUs
    core = client.CoreV1Api(api_client)

    placed = wait_for(
        lambda: (
            (c := condition(api_client, namespace, "llama", "Placed")).get("status") == "True" and c
        ),
        60,
        what="Placed=True",
    )
    assert "nvidia.com/gpu.clique=clique-x" in placed["message"]
    wait_for(lambda: condition(api_client, namespace, "llama", "Ready").get("status") == "True", 90)

    # Converged: every pod of the slice runs in clique-x, on its dma-buf nodes only. (A pod
    # planned while the previous test's GPUs were still counted as held may start elsewhere
    # and is rolled into the domain; the invariant is the converged state.)
    def converged() -> list[client.V1Pod] | None:
        pods = core.list_namespaced_pod(namespace, label_selector="pdd.dev/deployment=llama").items
        live = [p for p in pods if not p.metadata.deletion_timestamp]
        nodes = {p.spec.node_name for p in live}
        return live if len(live) == 6 and nodes <= {"topo-x-0", "topo-x-1"} else None

    pods = wait_for(converged, 90, what="6 pods on the dma-buf nodes of clique-x")

    engine = pods[0].spec.containers[0]
    env = {e.name: e.value for e in engine.env}
    assert env["UCX_TLS"] == "rc_x,ud_x,sm,self,cuda_copy,cuda_ipc"
    assert env["PDD_GPUDIRECT"] == "auto"
    assert engine.resources.limits[RDMA] == "1"
    assert engine.security_context.capabilities.add == ["IPC_LOCK"]
    preflight = pods[0].spec.init_containers[0]
    assert preflight.name == "preflight"
    assert preflight.resources.limits["nvidia.com/gpu"] == "2"  # same GPUs as the engine
    terms = pods[0].spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
    expressions = {e.key: e.values for e in terms.node_selector_terms[0].match_expressions}
    assert expressions == {
        "nvidia.com/gpu.clique": ["clique-x"],
        "pdd.dev/gpudirect": ["dmabuf", "peermem"],
    }
    wait_for(
        lambda: condition(api_client, namespace, "llama", "Ready").get("status") == "True",
        60,
        what="Ready",
    )


def preflight_on_fixture_node(pod: dict[str, Any], node: SimNode) -> tuple[int, str] | None:
    """The real preflight checks, run as the simulated kubelet starts the init container:
    the node's topology is a fixture tree, the container's memlock is containerd's 8 MiB."""
    fixture = FIXTURES / node.annotations[FIXTURE_ANNOTATION]
    init = pod["spec"]["initContainers"][0]
    env = {e["name"]: e.get("value", "") for e in init.get("env", []) if "value" in e}
    report = run_preflight(
        scan(fixture / "sys", fixture / "proc"),
        PreflightConfig.from_env(env),
        ContainerFacts(
            memlock_soft=8 * MIB,
            memlock_hard=8 * MIB,
            uverbs_devices=("uverbs0",),
            shm_bytes=16 * 1024 * MIB,
        ),
    )
    return (1, termination_message(report)) if report.failures else None


def test_missing_rdma_prerequisite_stops_the_pod_and_says_what_to_fix(
    operator: OperatorProcess,
    api_client: client.ApiClient,
    namespace: str,
    topo_nodes: list[str],
    node_sim: Any,
) -> None:
    node_sim.set_init_outcome(preflight_on_fixture_node)
    try:
        body_spec = spec(1, 1, tp=1, rdma={"resourceName": RDMA, "required": True})
        create(api_client, namespace, "strict", body_spec)
        degraded = wait_for(
            lambda: (
                (c := condition(api_client, namespace, "strict", "Degraded")).get("status")
                == "True"
                and c
            ),
            90,
            what="Degraded=True",
        )
    finally:
        node_sim.set_init_outcome(None)
    assert degraded["reason"] == "PreflightFailed"
    assert "memlock" in degraded["message"] and "unlimited" in degraded["message"]
    assert condition(api_client, namespace, "strict", "Stalled")["status"] == "True"
    assert condition(api_client, namespace, "strict", "Ready")["status"] == "False"

    def warning_event() -> list[Any]:
        events = client.CoreV1Api(api_client).list_namespaced_event(namespace).items
        return [
            e
            for e in events
            if e.reason == "PreflightFailed"
            and e.type == "Warning"
            and e.involved_object.kind == "PDDeployment"
        ]

    events = wait_for(warning_event, 30, what="PreflightFailed event on the PDDeployment")
    assert "memlock" in events[0].message


# Two domains under a level only this test's nodes carry: one node tainted for another tenant
# (8 GPUs free: the best fit by free GPUs), and two untainted nodes.
TENANT_LEVEL = "pdd.test/tenant-clique"
TENANT_TAINT = {"key": "pdd.test/tenant", "value": "other", "effect": "NoSchedule"}


@pytest.fixture
def tenant_nodes(node_sim: Any) -> Iterator[list[str]]:
    def tenant_node(name: str, domain: str, taints: tuple[dict[str, str], ...]) -> SimNode:
        labels = {**gpu_node_labels(8, f"clique-{name}"), TENANT_LEVEL: domain}
        return SimNode(name, labels=labels, capacity=gpu_node_capacity(8), taints=taints)

    nodes = [
        tenant_node("tenant-t0", "tainted", (TENANT_TAINT,)),
        tenant_node("tenant-u0", "open", ()),
        tenant_node("tenant-u1", "open", ()),
    ]
    with node_sim.nodes_for_a_while(nodes) as names:
        yield names


def test_a_domain_the_pods_do_not_tolerate_is_not_planned_and_one_they_do_is(
    operator: OperatorProcess,
    api_client: client.ApiClient,
    namespace: str,
    tenant_nodes: list[str],
) -> None:
    """The planner reads the nodes' taints: without the toleration the slice goes to the open
    domain and its pods are bound there by the real scheduler; with it, to the tainted node
    (the best fit), where the scheduler admits them."""
    core = client.CoreV1Api(api_client)
    base = {**spec(1, 1), "topology": {"placement": "required", "levels": [TENANT_LEVEL]}}
    base["kvTransfer"] = {}
    tolerated = {"tolerations": [{**TENANT_TAINT, "operator": "Equal"}]}
    cases = [
        ("intolerant", base, {"tenant-u0", "tenant-u1"}),
        (
            "tolerant",
            {**base, "prefill": {**base["prefill"], **tolerated},
             "decode": {**base["decode"], **tolerated}},
            {"tenant-t0"},
        ),
    ]  # fmt: skip
    for name, patch, where in cases:
        create(api_client, namespace, name, patch)

        def bound(name: str = name) -> set[str] | None:
            selector = f"pdd.dev/deployment={name}"
            pods = core.list_namespaced_pod(namespace, label_selector=selector).items
            nodes = [p.spec.node_name for p in pods]
            return set(nodes) if len(pods) == 2 and all(nodes) else None

        assert wait_for(bound, 90, what=f"{name}'s 2 pods bound") <= where
        placed = condition(api_client, namespace, name, "Placed")
        assert f"{TENANT_LEVEL}={'tainted' if name == 'tolerant' else 'open'}" in placed["message"]
        client.CustomObjectsApi(api_client).delete_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name
        )
