"""Instances larger than one node on the real control plane with Kubernetes' gang scheduling
on (GenericWorkload + GangScheduling, scheduling.k8s.io/v1alpha1): the real StatefulSet
controller makes the ranks, the real kube-scheduler binds an instance's pods all or none.

The module runs a control plane of its own (the gates are alpha and off elsewhere in the
suite), with seven simulated 8-GPU nodes: clique-a has three (room for three of four 8-GPU
ranks), clique-b four.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config

from helpers.factories import pdd_body
from helpers.operator_proc import OPERATOR_USER, OperatorProcess, operator_on
from helpers.waits import create_namespace_ready, wait_for
from pdd_localcluster import LocalControlPlane, NodeSimulator, gpu_fleet

GROUP, VERSION, PLURAL = "pdd.dev", "v1alpha1", "pddeployments"
GATES = {"GenericWorkload": True, "GangScheduling": True}
CLIQUE = "nvidia.com/gpu.clique"
# How long a gang that cannot fit is watched for a partial bind: the scheduler tries it
# several times over this window (it retries unschedulable pods at least every few seconds).
WATCH_SECONDS = 20


@pytest.fixture(scope="module")
def gang_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalControlPlane]:
    state = tmp_path_factory.mktemp("gang-controlplane")
    with LocalControlPlane(
        state,
        users={OPERATOR_USER: ["system:masters"]},
        feature_gates=GATES,
        runtime_config=("scheduling.k8s.io/v1alpha1=true",),
    ) as cp:
        yield cp


@pytest.fixture(scope="module")
def api(gang_plane: LocalControlPlane) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(config_file=str(gang_plane.kubeconfig))
    yield api
    api.close()


@pytest.fixture(scope="module")
def fleet(gang_plane: LocalControlPlane) -> Iterator[NodeSimulator]:
    nodes = [n for n in gpu_fleet(2, 4, name_prefix="mn") if n.name != "mn-a-03"]
    with NodeSimulator(gang_plane.kubeconfig, nodes) as sim:
        yield sim


@pytest.fixture(scope="module")
def gang_operator(
    gang_plane: LocalControlPlane,
    api: client.ApiClient,
    fleet: NodeSimulator,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    with operator_on(gang_plane, api, tmp_path_factory.mktemp("gang-operator")) as proc:
        yield proc


@pytest.fixture
def ns(api: client.ApiClient, gang_operator: OperatorProcess) -> Iterator[str]:
    """A namespace of its own; at the end its pods are waited out, so the next test finds
    the fleet's GPUs free."""
    core = client.CoreV1Api(api)
    name = create_namespace_ready(api, f"mn-{secrets.token_hex(3)}")
    yield name
    client.CustomObjectsApi(api).delete_collection_namespaced_custom_object(
        GROUP, VERSION, name, PLURAL
    )
    wait_for(lambda: not core.list_namespaced_pod(name).items, 90, what="pods gone")
    core.delete_namespace(name)


def deployment(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    instance = {"replicas": 1, "gpusPerInstance": 8, "nodesPerInstance": 2}
    fields: dict[str, Any] = {
        "router": {"enabled": False},
        "prefill": dict(instance),
        "decode": dict(instance),
        "topology": {"placement": "none"},
    }
    fields.update(spec)
    return pdd_body(name, namespace, **fields)


def in_clique_a(role: dict[str, Any]) -> dict[str, Any]:
    return {**role, "nodeSelector": {CLIQUE: "clique-a"}}


def create(api: client.ApiClient, body: dict[str, Any]) -> None:
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, body["metadata"]["namespace"], PLURAL, body
    )


def pods(api: client.ApiClient, namespace: str) -> list[Any]:
    return list(client.CoreV1Api(api).list_namespaced_pod(namespace).items)


def raw_pod(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    """The pod as the API server sends it (the Python client's models lack alpha fields)."""
    resp = client.CoreV1Api(api).read_namespaced_pod(name, namespace, _preload_content=False)
    pod: dict[str, Any] = json.loads(resp.data)
    return pod


def bound_by_instance(api: client.ApiClient, namespace: str) -> dict[str, int]:
    """Bound pods per instance StatefulSet (a pod `<sts>-<rank>` belongs to `<sts>`)."""
    counts: dict[str, int] = {}
    for pod in pods(api, namespace):
        instance = pod.metadata.name.rsplit("-", 1)[0]
        counts.setdefault(instance, 0)
        if pod.spec.node_name:
            counts[instance] += 1
    return counts


def watch_no_partial_instance(
    api: client.ApiClient, namespace: str, nodes_per_instance: int
) -> dict[str, int]:
    """Bound pods per instance over WATCH_SECONDS, failing at the first instance that is
    partly bound; the last count."""
    deadline = time.monotonic() + WATCH_SECONDS
    counts: dict[str, int] = {}
    while time.monotonic() < deadline:
        counts = bound_by_instance(api, namespace)
        partial = {k: v for k, v in counts.items() if 0 < v < nodes_per_instance}
        assert not partial, f"instances partly bound: {partial} (all: {counts})"
        time.sleep(0.5)
    return counts


def test_room_for_three_of_four_ranks_binds_no_part_of_an_instance(
    api: client.ApiClient, ns: str
) -> None:
    # One 4-node instance (4 ranks of 8 GPUs), three nodes to hold them: not one rank binds.
    create(
        api,
        deployment(
            "wide",
            ns,
            prefill=in_clique_a({"replicas": 1, "gpusPerInstance": 8, "nodesPerInstance": 4}),
            decode={"replicas": 0, "gpusPerInstance": 8},
        ),
    )
    wait_for(lambda: len(pods(api, ns)) == 4, 60, what="the four ranks created")
    counts = watch_no_partial_instance(api, ns, 4)
    assert counts == {"wide-prefill-0": 0}
    workload = client.CustomObjectsApi(api).get_namespaced_custom_object(
        "scheduling.k8s.io", "v1alpha1", ns, "workloads", "wide-prefill"
    )
    assert workload["spec"]["podGroups"][0]["policy"] == {"gang": {"minCount": 4}}


def test_without_a_gang_the_same_instance_starts_half_placed(
    api: client.ApiClient, ns: str
) -> None:
    # The control: gang none, same fleet and instance: the scheduler binds three of four,
    # the half-started instance the gang prevents.
    create(
        api,
        deployment(
            "loose",
            ns,
            prefill=in_clique_a({"replicas": 1, "gpusPerInstance": 8, "nodesPerInstance": 4}),
            decode={"replicas": 0, "gpusPerInstance": 8},
            scheduling={"gang": "none"},
        ),
    )
    wait_for(
        lambda: bound_by_instance(api, ns).get("loose-prefill-0") == 3, 60, what="3 of 4 bound"
    )


def test_two_node_prefill_and_decode_bind_whole_instances_only(
    api: client.ApiClient, ns: str
) -> None:
    # 2-node prefill + 2-node decode = 4 ranks, room for 3: one whole instance binds, the
    # other binds none (never 2 + 1).
    create(
        api,
        deployment(
            "pd",
            ns,
            prefill=in_clique_a({"replicas": 1, "gpusPerInstance": 8, "nodesPerInstance": 2}),
            decode=in_clique_a({"replicas": 1, "gpusPerInstance": 8, "nodesPerInstance": 2}),
        ),
    )
    wait_for(lambda: len(pods(api, ns)) == 4, 60, what="the four ranks created")
    wait_for(lambda: 2 in bound_by_instance(api, ns).values(), 60, what="one instance bound")
    counts = watch_no_partial_instance(api, ns, 2)
    assert sorted(counts.values()) == [0, 2], counts


def test_ranks_leaders_and_one_domain_per_instance(api: client.ApiClient, ns: str) -> None:
    # 32 GPUs, required placement: only clique-b (four nodes) holds them all.
    create(api, deployment("dom", ns, topology={"placement": "required"}))
    core = client.CoreV1Api(api)

    def all_bound() -> list[Any]:
        found = pods(api, ns)
        return found if len(found) == 4 and all(p.spec.node_name for p in found) else []

    bound = wait_for(all_bound, 90, what="all four ranks bound")
    node_clique = {n.metadata.name: n.metadata.labels.get(CLIQUE) for n in core.list_node().items}
    assert {node_clique[p.spec.node_name] for p in bound} == {"clique-b"}
    by_name = {p.metadata.name: p for p in bound}
    for role in ("prefill", "decode"):
        leader, worker = by_name[f"dom-{role}-0-0"], by_name[f"dom-{role}-0-1"]
        # The rank the engine reads (PDD_NODE_RANK) is this label of the real controller.
        assert leader.metadata.labels["apps.kubernetes.io/pod-index"] == "0"
        assert worker.metadata.labels["apps.kubernetes.io/pod-index"] == "1"
        assert leader.spec.node_name != worker.spec.node_name
        assert raw_pod(api, ns, leader.metadata.name)["spec"]["workloadRef"] == {
            "name": f"dom-{role}",
            "podGroup": "instance",
            "podGroupReplicaKey": "0",
        }
        engine = next(c for c in leader.spec.containers if c.name == "engine")
        assert "--data-parallel-address" in engine.args
        assert f"dom-{role}-0-0.dom-{role}-0.{ns}.svc" in engine.args
        assert "--data-parallel-start-rank" in engine.command[2]
    service = core.read_namespaced_service("dom-prefill-0", ns)
    assert service.spec.cluster_ip == "None" and service.spec.publish_not_ready_addresses


def test_a_cluster_without_gang_scheduling_gets_a_condition_not_half_started_instances(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    # The suite's shared control plane: the gates are off, scheduling.k8s.io/v1alpha1 is
    # not served.
    create(api_client, deployment("nogang", namespace))
    custom = client.CustomObjectsApi(api_client)

    def gang_condition() -> dict[str, Any] | None:
        obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "nogang")
        for cond in obj.get("status", {}).get("conditions", []):
            if cond["type"] == "GangScheduling" and cond["status"] == "False":
                return dict(cond)
        return None

    cond = wait_for(gang_condition, 60, what="GangScheduling=False")
    assert cond["reason"] == "GangSchedulerUnavailable"
    assert "GenericWorkload" in cond["message"]
    apps = client.AppsV1Api(api_client)
    assert not apps.list_namespaced_stateful_set(namespace).items
    assert not pods(api_client, namespace)


def test_one_rank_failing_restarts_the_whole_instance(api: client.ApiClient, ns: str) -> None:
    create(
        api,
        deployment(
            "rs",
            ns,
            prefill={"replicas": 1, "gpusPerInstance": 8, "nodesPerInstance": 2},
            decode={"replicas": 0, "gpusPerInstance": 8},
        ),
    )
    core = client.CoreV1Api(api)

    def running() -> dict[str, str]:
        found = pods(api, ns)
        ok = len(found) == 2 and all(p.status.phase == "Running" for p in found)
        return {p.metadata.name: p.metadata.uid for p in found} if ok else {}

    before = wait_for(running, 90, what="both ranks running")
    # The kubelet's report that rank 1's engine exited and was started again alone.
    core.patch_namespaced_pod_status(
        "rs-prefill-0-1",
        ns,
        {"status": {"containerStatuses": [{"name": "engine", "restartCount": 1}]}},
    )

    def replaced() -> dict[str, str]:
        now = running()
        return now if now and not set(now.values()) & set(before.values()) else {}

    after = wait_for(replaced, 120, what="both ranks replaced")
    assert set(after) == {"rs-prefill-0-0", "rs-prefill-0-1"}
    events = core.list_namespaced_event(ns, field_selector="reason=InstanceRestarted").items
    assert any("rs-prefill-0-1" in e.message and "instance 0 starts" in e.message for e in events)


def test_a_rollout_replaces_whole_instances_one_at_a_time(api: client.ApiClient, ns: str) -> None:
    two = {"replicas": 2, "gpusPerInstance": 8, "nodesPerInstance": 2}
    create(
        api,
        deployment(
            "ro",
            ns,
            prefill={**two, "nodeSelector": {CLIQUE: "clique-b"}},
            decode={"replicas": 0, "gpusPerInstance": 8},
        ),
    )

    def ready_by_instance() -> dict[str, list[str]]:
        """Ready, not terminating ranks per instance, by their revision."""
        out: dict[str, list[str]] = {"ro-prefill-0": [], "ro-prefill-1": []}
        for pod in pods(api, ns):
            conditions = pod.status.conditions or []
            ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
            if ready and not pod.metadata.deletion_timestamp:
                instance = pod.metadata.name.rsplit("-", 1)[0]
                out[instance].append(pod.metadata.labels["pdd.dev/revision"])
        return out

    first = wait_for(
        lambda: (r := ready_by_instance()) and all(len(v) == 2 for v in r.values()) and r,
        120,
        what="both instances ready",
    )
    (old,) = {rev for revs in first.values() for rev in revs}
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, "ro", {"spec": {"engine": {"args": ["--max-model-len", "9"]}}}
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        now = ready_by_instance()
        out_of_service = [i for i, revs in now.items() if len(revs) < 2]
        # One instance out at a time, and never two revisions inside one instance.
        assert len(out_of_service) <= 1, now
        assert all(len(set(revs)) <= 1 for revs in now.values()), now
        if all(len(revs) == 2 and revs[0] != old for revs in now.values()):
            break
        time.sleep(0.3)
    else:
        raise AssertionError(f"rollout did not finish: {ready_by_instance()}")
    events = client.CoreV1Api(api).list_namespaced_event(
        ns, field_selector="reason=InstanceReplaced"
    )
    replaced = sorted(e.message.split(": ", 1)[1].split(" starts")[0] for e in events.items)
    assert replaced == ["prefill instance 0", "prefill instance 1"]
