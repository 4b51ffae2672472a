"""Per-role autoscaling on the real control plane: the operator's PDDRoleScaler scale targets,
driven through their /scale subresource exactly as the HPA controller and KEDA write it.

What must hold at every step: the follower keeps the ratio, no running pod is replaced (same
uid, same node) and the engine revision does not change, new pods land in the deployment's
topology domain, the PDDeployment's spec and generation stay as the user wrote them, and scale
to zero and back works with its condition.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from helpers.factories import pdd_body
from helpers.operator_proc import OperatorProcess
from helpers.pdd_objects import condition, get_pdd
from helpers.waits import wait_for
from pdd_localcluster import NodeSimulator, SimNode
from pdd_localcluster.nodes import gpu_node_capacity, gpu_node_labels

GROUP, VERSION, PLURAL, SCALERS = "pdd.dev", "v1alpha1", "pddeployments", "pddrolescalers"
CLIQUE = "nvidia.com/gpu.clique"
AUTOSCALING = {
    "decode": {"minReplicas": 0, "maxReplicas": 8},
    "prefill": {"minReplicas": 1, "maxReplicas": 4},
    "follower": "prefill",
    "ratio": {"prefill": 1, "decode": 2},
}


def custom(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def scale(api: client.ApiClient, ns: str, role: str, replicas: int) -> None:
    """A write to the scale target's /scale subresource, as the HPA controller makes it."""
    custom(api).patch_namespaced_custom_object_scale(
        GROUP, VERSION, ns, SCALERS, f"llama-{role}", {"spec": {"replicas": replicas}}
    )


def running(api: client.ApiClient, ns: str, prefill: int, decode: int) -> dict[str, Any] | None:
    """The PDDeployment once Ready at these counts (status written for its generation)."""
    body = get_pdd(api, ns, "llama")
    status = body.get("status", {})
    want = (f"{prefill}/{prefill}", f"{decode}/{decode}")
    if (status.get("prefillReplicas"), status.get("decodeReplicas")) != want:
        return None
    if condition(body, "Ready").get("status") != "True":
        return None
    return body


def engine_pods(api: client.ApiClient, ns: str) -> dict[str, client.V1Pod]:
    pods = client.CoreV1Api(api).list_namespaced_pod(ns, label_selector="pdd.dev/role")
    return {
        p.metadata.name: p
        for p in pods.items
        if p.metadata.labels.get("pdd.dev/role") in ("prefill", "decode")
        and p.metadata.deletion_timestamp is None
    }


def clique_of(api: client.ApiClient, node: str) -> str:
    return str(client.CoreV1Api(api).read_node(node).metadata.labels.get(CLIQUE, ""))


def test_decode_scales_on_its_target_prefill_follows_and_no_pod_moves(
    operator: OperatorProcess, api_client: client.ApiClient, namespace: str
) -> None:
    ns = namespace
    body = pdd_body(
        "llama",
        ns,
        prefill={"replicas": 1, "gpusPerInstance": 2},
        decode={"replicas": 2, "gpusPerInstance": 2},
        autoscaling=AUTOSCALING,
    )
    custom(api_client).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
    first = wait_for(lambda: running(api_client, ns, 1, 2), 120, what="1P/2D Ready")
    spec, generation = first["spec"], first["metadata"]["generation"]
    revision = first["status"]["decode"]["revision"]
    domain = first["status"]["placement"]["domain"]
    assert domain, first["status"]["placement"]

    # The scale target: the HPA's view of it through /scale, with the role's pod selector.
    target = custom(api_client).get_namespaced_custom_object_scale(
        GROUP, VERSION, ns, SCALERS, "llama-decode"
    )
    assert target["spec"]["replicas"] == 2
    assert target["status"]["replicas"] == 2
    assert target["status"]["selector"] == "pdd.dev/deployment=llama,pdd.dev/role=decode"
    selected = client.CoreV1Api(api_client).list_namespaced_pod(
        ns, label_selector=target["status"]["selector"]
    )
    assert len(selected.items) == 2
    before = {
        name: (p.metadata.uid, p.spec.node_name) for name, p in engine_pods(api_client, ns).items()
    }

    # Scale up: decode 2 -> 5, prefill follows 1:2 -> 3.
    scale(api_client, ns, "decode", 5)
    up = wait_for(lambda: running(api_client, ns, 3, 5), 120, what="3P/5D Ready")
    pods = engine_pods(api_client, ns)
    assert len(pods) == 8
    for name, (uid, node) in before.items():  # every running pod is the same pod, where it was
        assert (pods[name].metadata.uid, pods[name].spec.node_name) == (uid, node), name
        assert all(not s.restart_count for s in pods[name].status.container_statuses or [])
    assert {clique_of(api_client, p.spec.node_name) for p in pods.values()} == {domain}
    assert up["status"]["decode"]["revision"] == revision
    assert up["status"]["placement"]["domain"] == domain
    assert (up["spec"], up["metadata"]["generation"]) == (spec, generation)
    assert condition(up, "ScaledToZero")["status"] == "False"

    # Scale down: decode 5 -> 2, prefill 3 -> 1; the pods left are the ones that ran before.
    scale(api_client, ns, "decode", 2)
    wait_for(lambda: running(api_client, ns, 1, 2), 120, what="1P/2D Ready again")
    wait_for(lambda: set(engine_pods(api_client, ns)) == set(before), 60, what="pods gone")
    after = engine_pods(api_client, ns)
    assert {n: (p.metadata.uid, p.spec.node_name) for n, p in after.items()} == before

    # Scale to zero: both roles, with a condition that says so.
    scale(api_client, ns, "decode", 0)
    zero = wait_for(
        lambda: (
            (b := get_pdd(api_client, ns, "llama"))
            and condition(b, "ScaledToZero").get("status") == "True"
            and b["status"]["decodeReplicas"] == "0/0"
            and b["status"]["prefillReplicas"] == "0/0"
            and b
        ),
        60,
        what="ScaledToZero",
    )
    assert "503" in condition(zero, "ScaledToZero")["message"]
    wait_for(lambda: not engine_pods(api_client, ns), 60, what="no engine pods")

    # And back.
    scale(api_client, ns, "decode", 2)
    back = wait_for(lambda: running(api_client, ns, 1, 2), 120, what="1P/2D from zero")
    assert condition(back, "ScaledToZero")["status"] == "False"
    assert back["status"]["decode"]["revision"] == revision
    assert (back["spec"], back["metadata"]["generation"]) == (spec, generation)


def test_the_operator_clamps_an_ask_beyond_the_bounds_and_the_target_says_why(
    operator: OperatorProcess, api_client: client.ApiClient, namespace: str
) -> None:
    ns = namespace
    body = pdd_body(
        "llama",
        ns,
        prefill={"replicas": 1, "gpusPerInstance": 1},
        decode={"replicas": 1, "gpusPerInstance": 1},
        autoscaling={**AUTOSCALING, "decode": {"minReplicas": 1, "maxReplicas": 3}},
        topology={"placement": "none"},
    )
    custom(api_client).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
    wait_for(lambda: running(api_client, ns, 1, 1), 120, what="1P/1D Ready")
    scale(api_client, ns, "decode", 9)
    wait_for(lambda: running(api_client, ns, 2, 3), 120, what="2P/3D Ready")
    scaler = custom(api_client).get_namespaced_custom_object(
        GROUP, VERSION, ns, SCALERS, "llama-decode"
    )
    assert scaler["spec"]["replicas"] == 9  # the ask stays the HPA's
    assert scaler["status"]["replicas"] == 3
    assert scaler["status"]["message"] == "asked for 9, runs 3: spec.autoscaling maxReplicas is 3"


# A domain of this module's own: three 8-GPU nodes (24 GPUs) under a topology label no other
# node carries (the deployments' only level), tainted so that no other test's pod lands there.
ROOM_LEVEL, ROOM_DOMAIN = "pdd.test/autoscaling-room", "room-1"
ROOM_TAINT = {"key": "pdd.test/autoscaling-room", "value": "true", "effect": "NoSchedule"}
ROOM_TOLERATION = {**ROOM_TAINT, "operator": "Equal"}


@pytest.fixture(scope="module")
def room_nodes(node_sim: NodeSimulator) -> Iterator[list[str]]:
    nodes = [
        SimNode(
            f"as-room-{i}",
            labels={**gpu_node_labels(8, "clique-autoscaling"), ROOM_LEVEL: ROOM_DOMAIN},
            capacity=gpu_node_capacity(8),
            taints=(ROOM_TAINT,),
        )
        for i in range(3)
    ]
    node_sim.add_nodes(nodes)
    yield [n.name for n in nodes]
    for node in nodes:
        node_sim.delete_node(node.name)


def test_two_scale_ups_at_once_share_the_room_of_their_domain_without_overcommitting(
    operator: OperatorProcess,
    api_client: client.ApiClient,
    namespace: str,
    room_nodes: list[str],
) -> None:
    ns, core = namespace, client.CoreV1Api(api_client)
    role = {"gpusPerInstance": 4, "tolerations": [ROOM_TOLERATION]}
    autoscaling = {
        "decode": {"minReplicas": 1, "maxReplicas": 8},
        "prefill": {"minReplicas": 1, "maxReplicas": 4},
        "follower": "prefill",
        "ratio": {"prefill": 1, "decode": 4},
    }
    for name in ("alpha", "beta"):  # 1P + 1D at 4 GPUs each: 8 GPUs per slice
        body = pdd_body(
            name,
            ns,
            prefill={"replicas": 1, **role},
            decode={"replicas": 1, **role},
            autoscaling=autoscaling,
            router={"enabled": False},
            topology={"placement": "required", "levels": [ROOM_LEVEL]},
        )
        custom(api_client).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
        placed = wait_for(
            lambda n=name: (
                (b := named(api_client, ns, n))["status"].get("placement", {}).get("domain") and b
            ),
            60,
            what=f"{name} placed",
        )
        assert placed["status"]["placement"]["domain"] == ROOM_DOMAIN
    for name in ("alpha", "beta"):
        wait_for(lambda n=name: counts(api_client, ns, n) == ("1/1", "1/1"), 120, what=name)

    # Both ask for 6 decodes (2 prefills) at once: 32 GPUs each, 16 left in the domain.
    for name in ("alpha", "beta"):
        custom(api_client).patch_namespaced_custom_object_scale(
            GROUP, VERSION, ns, SCALERS, f"{name}-decode", {"spec": {"replicas": 6}}
        )

    def settled() -> bool:
        pods = core.list_namespaced_pod(ns).items
        engine = [p for p in pods if p.metadata.labels.get("pdd.dev/role") in ("prefill", "decode")]
        return (
            bool(engine)
            and all(
                any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
                for p in engine
            )
            and len(engine) > 4
        )

    wait_for(settled, 120, what="every engine pod ready after the scale-ups")
    time.sleep(3)  # a pass that would overcommit would have made its pods by now
    pods = [
        p
        for p in core.list_namespaced_pod(ns).items
        if p.metadata.labels.get("pdd.dev/role") in ("prefill", "decode")
    ]
    pending = [p.metadata.name for p in pods if p.status.phase != "Running"]
    assert pending == []  # nothing waits for GPUs: the domain was not overcommitted
    assert {p.spec.node_name for p in pods} <= set(room_nodes)  # all in the slice's domain
    assert sum(4 for _ in pods) <= 24
    messages = [
        custom(api_client).get_namespaced_custom_object(
            GROUP, VERSION, ns, SCALERS, f"{name}-decode"
        )["status"]["message"]
        for name in ("alpha", "beta")
    ]
    assert any(f"no room for more in {ROOM_LEVEL}={ROOM_DOMAIN}" in m for m in messages)
    # Each grew as far as the room let it, together filling the domain: 24 GPUs, 6 pods.
    assert len(pods) == 6, sorted(p.metadata.name for p in pods)


def named(api: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    return custom(api).get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)


def counts(api: client.ApiClient, ns: str, name: str) -> tuple[str, str]:
    status = named(api, ns, name).get("status", {})
    return status.get("prefillReplicas", ""), status.get("decodeReplicas", "")
