"""Failures that happen outside the operator's children reach the PDDeployment's status, and the
sidecar token Secret is the operator's own (issue 14, classes 5 and 6), on the real control
plane: pods refused by a ResourceQuota or by Pod Security admission, a Node deleted under a
bound pod, the token Secret deleted or planted beforehand."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from helpers.factories import small_pdd_body
from helpers.operator_proc import OperatorProcess, install_crd
from helpers.pod_security import ENFORCE, violated_rules
from helpers.waits import create_namespace_ready, wait_for
from pdd_localcluster.nodes import SimNode, gpu_node_capacity, gpu_node_labels
from pdd_operator.api import names
from pdd_operator.rendering.sidecar import TOKEN_KEY

GROUP, VERSION, PLURAL = "pdd.dev", "v1alpha1", "pddeployments"


def create(api: client.ApiClient, obj: dict[str, Any]) -> dict[str, Any]:
    ns = obj["metadata"]["namespace"]
    created: dict[str, Any] = client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, obj
    )
    return created


def read(api: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, name
    )
    return obj


def condition_is(
    api: client.ApiClient, ns: str, name: str, kind: str, status: str, reason: str
) -> Callable[[], dict[str, Any] | None]:
    """A check for wait_for: the condition, once it has that status and reason."""

    def check() -> dict[str, Any] | None:
        for cond in read(api, ns, name).get("status", {}).get("conditions", []):
            if cond["type"] == kind and cond["status"] == status and cond["reason"] == reason:
                return dict(cond)
        return None

    return check


def wait_pods_refused(api: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    """The Degraded condition once it says PodsRefused (the API server refused the pods)."""
    return wait_for(
        condition_is(api, ns, name, "Degraded", "True", "PodsRefused"),
        60,
        what=f"Degraded=True PodsRefused for {ns}/{name}",
    )


@pytest.fixture
def operator_later(
    kubeconfig: Path, api_client: client.ApiClient, node_sim: Any, tmp_path: Path
) -> Iterator[Callable[[], OperatorProcess]]:
    """Starts an operator when the test says so: after it prepared what the operator must
    find already there."""
    install_crd(api_client)
    started: list[OperatorProcess] = []

    def start() -> OperatorProcess:
        proc = OperatorProcess(kubeconfig, tmp_path / "operator.log", resync_seconds=2.0)
        started.append(proc.start())
        return proc

    yield start
    for proc in started:
        proc.kill()


# First in the module: the module's `operator` must not be running yet (it would create the
# Secret before the test plants one).
def test_a_planted_token_secret_is_refused_and_left_unchanged(
    operator_later: Callable[[], OperatorProcess],
    api_client: client.ApiClient,
    namespace: str,
) -> None:
    core = client.CoreV1Api(api_client)
    uid = create(api_client, small_pdd_body("plant", namespace))["metadata"]["uid"]
    name = names.token_secret_name("plant", uid)
    planted = core.create_namespaced_secret(
        namespace,
        {"metadata": {"name": name}, "stringData": {TOKEN_KEY: "known-to-someone"}},
    )
    operator_later()

    stalled = wait_for(
        condition_is(api_client, namespace, "plant", "Stalled", "True", "TokenSecretConflict"),
        60,
        what="Stalled=True TokenSecretConflict",
    )
    assert name in stalled["message"]
    assert "existed before this PDDeployment's first engine pod" in stalled["message"]
    after = core.read_namespaced_secret(name, namespace)
    assert after.metadata.resource_version == planted.metadata.resource_version
    assert not after.metadata.owner_references
    apps = client.AppsV1Api(api_client)
    engines = apps.list_namespaced_stateful_set(namespace).items
    assert engines == []  # no engine pod mounts a token someone else knows

    core.delete_namespaced_secret(name, namespace)  # the user removes it: the operator resumes
    wait_for(
        lambda: _secret_or_none(core, name, namespace, other_than=planted.metadata.uid),
        30,
        what="the operator's own token Secret",
    )
    wait_for(
        condition_is(api_client, namespace, "plant", "Stalled", "False", "NotStalled"),
        60,
        what="Stalled=False",
    )


def test_pods_refused_by_a_resource_quota_are_reported_with_the_quota_message(
    operator: Any, api_client: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api_client)
    quota = {"metadata": {"name": "no-gpus"}, "spec": {"hard": {"requests.nvidia.com/gpu": "0"}}}
    core.create_namespaced_resource_quota(namespace, quota)
    # The quota is enforced once its controller has computed its usage.
    wait_for(
        lambda: core.read_namespaced_resource_quota("no-gpus", namespace).status.hard,
        30,
        what="the quota's usage",
    )
    create(api_client, small_pdd_body("quota", namespace))

    degraded = wait_pods_refused(api_client, namespace, "quota")
    assert "pods of quota-" in degraded["message"]
    assert "cannot be created" in degraded["message"]
    assert "exceeded quota: no-gpus" in degraded["message"]
    assert "requests.nvidia.com/gpu" in degraded["message"]
    stalled = condition_is(api_client, namespace, "quota", "Stalled", "True", "PodsRefused")()
    assert stalled is not None

    core.delete_namespaced_resource_quota("no-gpus", namespace)  # the user lifts the quota
    wait_for(
        condition_is(api_client, namespace, "quota", "Ready", "True", "AllReplicasReady"),
        90,
        what="Ready once the quota is gone",
    )
    assert condition_is(api_client, namespace, "quota", "Degraded", "False", "AsExpected")()


def refused_rules(message: str) -> list[set[str]]:
    """The Pod Security rules each refused workload of a PodsRefused message broke."""
    return [violated_rules(refusal) for refusal in message.split("; pods of ")]


def test_pods_refused_by_pod_security_admission_are_reported_naming_the_rule(
    operator: Any, api_client: client.ApiClient, namespace: str
) -> None:
    """Without RDMA only the engine's user keeps a deployment out of `restricted`: the
    refusal names that rule and no other (docs/security.md, Pod Security levels)."""
    core = client.CoreV1Api(api_client)
    core.patch_namespace(namespace, {"metadata": {"labels": {ENFORCE: "restricted"}}})
    create(api_client, small_pdd_body("psa", namespace))

    degraded = wait_pods_refused(api_client, namespace, "psa")
    assert "cannot be created" in degraded["message"]
    assert 'violates PodSecurity "restricted:latest"' in degraded["message"]
    assert 'container "engine" must set securityContext.runAsNonRoot=true' in degraded["message"]
    assert all(rules == {"runAsNonRoot != true"} for rules in refused_rules(degraded["message"]))


def test_rdma_engines_are_admitted_by_privileged_and_refused_by_baseline_for_ipc_lock(
    operator: Any, api_client: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api_client)
    privileged = create_namespace_ready(api_client, f"{namespace[:50]}-priv")
    try:
        for ns, level in ((namespace, "baseline"), (privileged, "privileged")):
            core.patch_namespace(ns, {"metadata": {"labels": {ENFORCE: level}}})
            rdma = {"rdma": {"resourceName": "rdma/rdma_shared_device_a"}}
            create(api_client, small_pdd_body("rdma", ns, kvTransfer=rdma))

        degraded = wait_pods_refused(api_client, namespace, "rdma")  # under baseline
        assert 'violates PodSecurity "baseline:latest"' in degraded["message"]
        assert 'container "engine" must not include "IPC_LOCK"' in degraded["message"]
        rules = refused_rules(degraded["message"])
        assert all(broken == {"non-default capabilities"} for broken in rules)

        selector = f"{names.LABEL_DEPLOYMENT}=rdma"  # both roles' pods exist: admitted
        wait_for(
            lambda: len(core.list_namespaced_pod(privileged, label_selector=selector).items) == 2,
            60,
            what="the engine pods admitted under privileged",
        )
        assert (
            condition_is(api_client, privileged, "rdma", "Degraded", "True", "PodsRefused")()
            is None
        )
    finally:
        core.delete_namespace(privileged)


@pytest.fixture
def own_nodes(node_sim: Any, namespace: str) -> Iterator[list[str]]:
    """Three nodes of this test's own: deleting one must not change the session's fleet that
    other tests count."""
    nodes = [
        SimNode(
            f"lost-{namespace[-6:]}-{i}",
            labels={**gpu_node_labels(8, "clique-lost"), "pdd-test": "failures"},
            capacity=gpu_node_capacity(8),
        )
        for i in range(3)
    ]
    with node_sim.nodes_for_a_while(nodes) as names:
        yield names


def test_a_node_deleted_under_a_bound_pod_is_reported_and_placement_follows(
    operator: Any, api_client: client.ApiClient, namespace: str, node_sim: Any,
    own_nodes: list[str],
) -> None:  # fmt: skip
    core = client.CoreV1Api(api_client)
    spec = small_pdd_body("lost", namespace)
    for role in ("prefill", "decode"):
        spec["spec"][role]["gpusPerInstance"] = 8  # one pod fills one node
        spec["spec"][role]["nodeSelector"] = {"pdd-test": "failures"}
    create(api_client, spec)
    wait_for(
        condition_is(api_client, namespace, "lost", "Ready", "True", "AllReplicasReady"),
        90,
        what="Ready",
    )
    lost = core.read_namespaced_pod("lost-decode-0", namespace).spec.node_name
    wait_for(
        lambda: lost in read(api_client, namespace, "lost")["status"]["placement"]["nodes"],
        30,
        what="placement.nodes listing the decode pod's node",
    )

    # The Node goes away; its pod stays bound to it until something deletes the pod.
    node_sim.delete_node(lost, delete_pods=False)
    degraded = wait_for(
        condition_is(api_client, namespace, "lost", "Degraded", "True", "NodeLost"),
        30,
        what="Degraded=True NodeLost",
    )
    assert lost in degraded["message"]
    assert lost not in read(api_client, namespace, "lost")["status"]["placement"]["nodes"]

    # As the pod garbage collector does with every pod of the node (prefill's may be there
    # too): at once, no kubelet is left to confirm a graceful end.
    for pod in core.list_namespaced_pod(namespace).items:
        if pod.spec.node_name == lost:
            core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
    wait_for(
        condition_is(api_client, namespace, "lost", "Degraded", "False", "AsExpected"),
        60,
        what="Degraded=False once the pod runs elsewhere",
    )
    now = {pod.spec.node_name for pod in core.list_namespaced_pod(namespace).items}
    assert lost not in now and now <= set(own_nodes)
    assert read(api_client, namespace, "lost")["status"]["placement"]["nodes"] == sorted(now)


def _secret_or_none(
    core: client.CoreV1Api, name: str, namespace: str, other_than: str
) -> client.V1Secret | None:
    try:
        secret = core.read_namespaced_secret(name, namespace)
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    return secret if secret.metadata.uid != other_than else None
