"""Faults the operator must survive, injected into the real control plane."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from helpers.factories import small_pdd_body
from helpers.operator_proc import OPERATOR_USER, OperatorProcess, install_crd
from helpers.waits import wait_for
from pdd_localcluster.nodes import SimNode, gpu_node_capacity, gpu_node_labels

GROUP, VERSION, PLURAL = "pdd.dev", "v1alpha1", "pddeployments"


@pytest.fixture
def operator_factory(
    kubeconfig: Path, api_client: client.ApiClient, node_sim: Any, tmp_path: Path
) -> Iterator[Any]:
    install_crd(api_client)
    started: list[OperatorProcess] = []

    def start() -> OperatorProcess:
        proc = OperatorProcess(kubeconfig, tmp_path / "operator.log", resync_seconds=5).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()


def body(name: str, namespace: str, prefill: int = 1, decode: int = 2) -> dict[str, Any]:
    return small_pdd_body(
        name,
        namespace,
        prefill={"replicas": prefill},
        decode={"replicas": decode},
    )


def objects(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def conditions(api: client.ApiClient, ns: str, name: str) -> dict[str, dict[str, Any]]:
    obj = objects(api).get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    fresh = obj.get("status", {}).get("observedGeneration") == obj["metadata"]["generation"]
    conds = {c["type"]: c for c in obj.get("status", {}).get("conditions", [])}
    return conds if fresh else {}


def is_ready(api: client.ApiClient, ns: str, name: str) -> bool:
    return conditions(api, ns, name).get("Ready", {}).get("status") == "True"


def test_operator_killed_mid_reconcile_converges_without_duplicates_or_orphans(
    operator_factory: Any, api_client: client.ApiClient, namespace: str
) -> None:
    first = operator_factory()
    names = [f"svc-{i}" for i in range(8)]
    for name in names:
        objects(api_client).create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, body(name, namespace)
        )
    apps = client.AppsV1Api(api_client)
    wait_for(
        lambda: apps.list_namespaced_stateful_set(namespace).items,
        30,
        interval=0.05,
        what="the first StatefulSet",
    )
    first.kill(signal.SIGKILL)  # in the middle of creating the children of eight deployments
    partial = len(apps.list_namespaced_stateful_set(namespace).items)

    operator_factory()
    for name in names:
        wait_for(lambda n=name: is_ready(api_client, namespace, n), 120, what=f"{name} Ready")

    statefulsets = apps.list_namespaced_stateful_set(namespace).items
    assert sorted(s.metadata.name for s in statefulsets) == sorted(
        f"{n}-{role}" for n in names for role in ("prefill", "decode")
    ), f"duplicates or orphans after the kill (had {partial} before it)"
    services = client.CoreV1Api(api_client).list_namespaced_service(namespace).items
    assert len(services) == 2 * len(names)
    for obj in [*statefulsets, *services]:
        refs = obj.metadata.owner_references or []
        assert len(refs) == 1 and refs[0].kind == "PDDeployment", obj.metadata.name
    pods = client.CoreV1Api(api_client).list_namespaced_pod(namespace).items
    assert len(pods) == 3 * len(names)


def test_a_restarted_operator_passes_over_a_converged_deployment_and_writes_nothing(
    control_plane: Any, api_client: client.ApiClient, node_sim: Any, namespace: str, tmp_path: Path
) -> None:
    """At start the informers list children, pods and ReplicaSets that already exist (a list's
    items carry no kind of their own); the pass over them finds nothing to change."""
    install_crd(api_client)
    identity = control_plane.kubeconfig_for(OPERATOR_USER)
    first = OperatorProcess(identity, tmp_path / "first.log", resync_seconds=300).start()
    try:
        objects(api_client).create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, body("kept", namespace)
        )
        wait_for(lambda: is_ready(api_client, namespace, "kept"), 120, what="kept Ready")
    finally:
        first.kill(signal.SIGTERM)
    writes_before = control_plane.writes_by(OPERATOR_USER, namespace=namespace)

    second = OperatorProcess(identity, tmp_path / "second.log", resync_seconds=300).start()
    try:
        wait_for(
            lambda: second.metric("pdd_operator_deployments_reconciled") >= 1,
            60,
            what="a pass of the restarted operator",
        )
        time.sleep(3)  # room for a write to show
        assert control_plane.writes_by(OPERATOR_USER, namespace=namespace) == writes_before
        assert is_ready(api_client, namespace, "kept")
    finally:
        second.kill()


def test_apiserver_restart_while_the_operator_runs(
    operator_factory: Any, control_plane: Any, api_client: client.ApiClient, namespace: str
) -> None:
    operator = operator_factory()
    objects(api_client).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body("before", namespace)
    )
    wait_for(lambda: is_ready(api_client, namespace, "before"), 90, what="before Ready")

    control_plane.restart_apiserver(downtime=3)

    # The operator reconnects its watches and serves a PDDeployment created afterwards.
    objects(api_client).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body("after", namespace)
    )
    wait_for(lambda: is_ready(api_client, namespace, "after"), 120, what="after Ready")
    assert operator.proc is not None and operator.proc.poll() is None, operator.tail()
    patch = {"spec": {"decode": {"replicas": 1}}}
    objects(api_client).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "before", patch
    )
    apps = client.AppsV1Api(api_client)
    wait_for(
        lambda: apps.read_namespaced_stateful_set("before-decode", namespace).spec.replicas == 1,
        60,
        what="scale after the restart",
    )


def test_etcd_paused_while_the_operator_runs(
    operator_factory: Any, control_plane: Any, api_client: client.ApiClient, namespace: str
) -> None:
    operator = operator_factory()
    objects(api_client).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body("during", namespace)
    )
    control_plane.pause_etcd(5)  # the apiserver answers errors/timeouts meanwhile
    wait_for(lambda: is_ready(api_client, namespace, "during"), 120, what="during Ready")
    patch = {"spec": {"prefill": {"replicas": 2}}}
    objects(api_client).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "during", patch
    )
    wait_for(lambda: is_ready(api_client, namespace, "during"), 90, what="scaled after the pause")
    assert operator.proc is not None and operator.proc.poll() is None, operator.tail()


@pytest.fixture
def fault_nodes(node_sim: Any) -> Iterator[list[str]]:
    nodes = [
        SimNode(
            f"fault-{i}",
            labels={**gpu_node_labels(8, "clique-fault"), "pdd-test": "faults"},
            capacity=gpu_node_capacity(8),
        )
        for i in range(3)
    ]
    with node_sim.nodes_for_a_while(nodes) as names:
        yield names


def test_node_not_ready_then_deleted_degrades_and_recovers_within_the_domain(
    operator_factory: Any,
    api_client: client.ApiClient,
    namespace: str,
    node_sim: Any,
    fault_nodes: list[str],
) -> None:
    operator_factory()
    spec_body = body("ha", namespace, prefill=1, decode=1)
    for role in ("prefill", "decode"):
        spec_body["spec"][role]["gpusPerInstance"] = 8  # one pod fills one node
        spec_body["spec"][role]["nodeSelector"] = {"pdd-test": "faults"}
    spec_body["spec"]["topology"] = {"placement": "required"}
    objects(api_client).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, spec_body
    )
    wait_for(lambda: is_ready(api_client, namespace, "ha"), 90, what="ha Ready")
    core = client.CoreV1Api(api_client)
    decode_pod = core.read_namespaced_pod("ha-decode-0", namespace)
    failed_node = decode_pod.spec.node_name

    node_sim.set_node_ready(failed_node, False)
    degraded = wait_for(
        lambda: (
            (c := conditions(api_client, namespace, "ha").get("Degraded", {})).get("status")
            == "True"
            and c
        ),
        60,
        what="Degraded=True",
    )
    assert degraded["reason"] == "NodeNotReady"
    assert failed_node in degraded["message"]
    assert conditions(api_client, namespace, "ha")["Ready"]["status"] == "False"

    node_sim.delete_node(failed_node)  # the node is gone: its pods are replaced elsewhere
    wait_for(lambda: is_ready(api_client, namespace, "ha"), 120, what="ha Ready again")
    replacement = core.read_namespaced_pod("ha-decode-0", namespace)
    assert replacement.spec.node_name != failed_node
    assert replacement.spec.node_name in fault_nodes  # still inside the placement domain
    # The pod watch may deliver the old pod's deletion after the StatefulSet's ready count:
    # a pass in between sees it on the deleted node (NodeLost) until that event comes.
    wait_for(
        lambda: conditions(api_client, namespace, "ha")["Degraded"]["status"] == "False",
        15,
        what="Degraded=False",
    )
