"""The operator against the real kube-apiserver, controllers, scheduler and simulated GPU nodes."""

from __future__ import annotations

import time
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from helpers.factories import pdd_body
from helpers.operator_proc import OPERATOR_USER, OperatorProcess
from helpers.pdd_objects import condition, get_pdd, ready_body
from helpers.waits import wait_for, wait_namespaces_gone

GROUP, VERSION, PLURAL = "pdd.dev", "v1alpha1", "pddeployments"

UNPLACED = {"placement": "none"}


def custom(api_client: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api_client)


def patch_spec(api_client: client.ApiClient, ns: str, name: str, spec: dict[str, Any]) -> None:
    custom(api_client).patch_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, name, {"spec": spec}
    )


def wait_ready(
    api_client: client.ApiClient, ns: str, name: str, timeout: float = 120
) -> dict[str, Any]:
    return wait_for(lambda: ready_body(api_client, ns, name), timeout, what=f"{ns}/{name} Ready")


def statefulset(api_client: client.ApiClient, ns: str, name: str) -> client.V1StatefulSet:
    return client.AppsV1Api(api_client).read_namespaced_stateful_set(name, ns)


def exists(read: Any, *args: Any) -> bool:
    try:
        read(*args)
        return True
    except ApiException as err:
        if err.status == 404:
            return False
        raise


def test_lifecycle_create_scale_upgrade_router_delete(
    operator: OperatorProcess, api_client: client.ApiClient, namespace: str
) -> None:
    custom(api_client).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, pdd_body("llama", namespace, topology=UNPLACED)
    )
    apps, core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)

    # create -> children with the right fields
    sts = wait_for(
        lambda: statefulset(api_client, namespace, "llama-decode"), 30, what="decode sts"
    )
    assert sts.spec.replicas == 4
    assert sts.metadata.owner_references[0].kind == "PDDeployment"
    engine = sts.spec.template.spec.containers[0]
    assert engine.image == "vllm/vllm-openai:v0.11.0"
    assert engine.resources.limits["nvidia.com/gpu"] == "2"
    svc = core.read_namespaced_service("llama-prefill", namespace)
    assert svc.spec.cluster_ip == "None"
    assert apps.read_namespaced_deployment("llama-router", namespace).spec.replicas == 1

    body = wait_ready(api_client, namespace, "llama")
    assert body["status"]["prefillReplicas"] == "2/2"
    assert body["status"]["decodeReplicas"] == "4/4"
    assert condition(body, "Progressing")["status"] == "False"

    # scale a role
    patch_spec(api_client, namespace, "llama", {"decode": {"replicas": 2}})
    wait_for(
        lambda: statefulset(api_client, namespace, "llama-decode").spec.replicas == 2,
        30,
        what="scale",
    )
    body = wait_ready(api_client, namespace, "llama")
    assert body["status"]["decodeReplicas"] == "2/2"

    # change the engine image: both roles roll to a new revision
    old_revision = body["status"]["prefill"]["revision"]
    patch_spec(api_client, namespace, "llama", {"engine": {"image": "vllm/vllm-openai:v0.12.0"}})
    wait_for(
        lambda: (
            statefulset(api_client, namespace, "llama-prefill")
            .spec.template.spec.containers[0]
            .image
            == "vllm/vllm-openai:v0.12.0"
        ),
        30,
        what="image change",
    )
    body = wait_ready(api_client, namespace, "llama")
    assert body["status"]["prefill"]["revision"] != old_revision
    assert statefulset(api_client, namespace, "llama-decode").status.updated_replicas == 2

    # disable the router -> its Deployment and Service go away
    patch_spec(api_client, namespace, "llama", {"router": {"enabled": False}})
    wait_for(
        lambda: not exists(apps.read_namespaced_deployment, "llama-router", namespace),
        30,
        what="router gone",
    )
    wait_for(
        lambda: not exists(core.read_namespaced_service, "llama-router", namespace),
        30,
        what="router svc gone",
    )

    # every child read back as rendered through all of that: no drift seen where none was
    assert "another spelling" not in operator.tail(10**7)
    assert operator.metric("pdd_operator_drift_corrections_total") == 0

    # delete -> the garbage collector removes every child
    custom(api_client).delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "llama")
    wait_for(
        lambda: not apps.list_namespaced_stateful_set(namespace).items,
        60,
        what="statefulsets collected",
    )
    wait_for(lambda: not core.list_namespaced_pod(namespace).items, 60, what="pods collected")


def test_status_follows_pods_from_pending_to_ready(
    operator: OperatorProcess, api_client: client.ApiClient, namespace: str
) -> None:
    unschedulable = {"replicas": 1, "gpusPerInstance": 1, "nodeSelector": {"no-such-label": "x"}}
    body = pdd_body(
        "pending",
        namespace,
        prefill=unschedulable,
        decode=dict(unschedulable),
        router={"enabled": False},
        topology=UNPLACED,
    )
    custom(api_client).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

    def degraded() -> dict[str, Any] | None:
        current = get_pdd(api_client, namespace, "pending")
        return current if condition(current, "Degraded").get("status") == "True" else None

    current = wait_for(degraded, 60, what="Degraded=True for unschedulable pods")
    assert condition(current, "Ready")["status"] == "False"
    assert condition(current, "Degraded")["reason"] == "Unschedulable"
    assert "node" in condition(current, "Degraded")["message"]

    patch_spec(
        api_client,
        namespace,
        "pending",
        {"prefill": {"nodeSelector": None}, "decode": {"nodeSelector": None}},
    )
    current = wait_ready(api_client, namespace, "pending")
    assert condition(current, "Degraded")["status"] == "False"


def test_resync_of_an_unchanged_deployment_writes_nothing(
    operator: OperatorProcess, control_plane: Any, api_client: client.ApiClient, namespace: str
) -> None:
    custom(api_client).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, pdd_body("steady", namespace, topology=UNPLACED)
    )
    wait_ready(api_client, namespace, "steady")
    wait_namespaces_gone(api_client)  # other tests' clean-up writes are not ours
    time.sleep(3)  # let the last status write and child events settle
    reconciles_before = operator.metric("pdd_operator_reconciles_total")
    writes_before = control_plane.writes_by(OPERATOR_USER, namespace=namespace)
    time.sleep(8)  # four resync periods of 2 s
    writes_after = control_plane.writes_by(OPERATOR_USER, namespace=namespace)
    reconciles_after = operator.metric("pdd_operator_reconciles_total")
    assert reconciles_after - reconciles_before >= 3, "the resync did not run"
    assert writes_after == writes_before, (
        f"the operator made {writes_after - writes_before} writes during a no-op resync"
    )
