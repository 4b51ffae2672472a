"""Children changed by hand are put back, against the real kube-apiserver and controllers.

The operator here resyncs only every 300 s, so every correction below comes from the watch on
the children within a few seconds, not from the periodic resync.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from helpers.factories import small_pdd_body
from helpers.operator_proc import OPERATOR_USER, OperatorProcess, install_crd
from helpers.waits import wait_for

GROUP, VERSION, PLURAL = "pdd.dev", "v1alpha1", "pddeployments"
NAME = "llama-70b"
DECODE = f"{NAME}-decode"
RNDV_THRESH = "8k"  # a UCX setting of the spec (extraEnv), rendered into the engine env
CORRECTED_WITHIN = 30.0  # seconds; far below the 300 s resync


@pytest.fixture(scope="module")
def operator(
    control_plane: Any,
    api_client: client.ApiClient,
    node_sim: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    """The tier's `operator`, overridden for this module: a resync only every 300 s."""
    install_crd(api_client)
    log: Path = tmp_path_factory.mktemp("operator") / "operator.log"
    identity = control_plane.kubeconfig_for(OPERATOR_USER)
    proc = OperatorProcess(identity, log, resync_seconds=300.0).start()
    yield proc
    proc.kill()


@pytest.fixture
def deployment(
    operator: OperatorProcess, api_client: client.ApiClient, namespace: str
) -> dict[str, Any]:
    """A Ready PDDeployment with UCX_RNDV_THRESH in its spec."""
    body = small_pdd_body(
        NAME,
        namespace,
        decode={"replicas": 2},
        kvTransfer={"ucx": {"extraEnv": [{"name": "UCX_RNDV_THRESH", "value": RNDV_THRESH}]}},
    )
    custom = client.CustomObjectsApi(api_client)
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

    def ready() -> dict[str, Any] | None:
        current = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, NAME)
        status = current.get("status", {})
        ok = any(
            c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", [])
        )
        fresh = status.get("observedGeneration") == current["metadata"]["generation"]
        return current if ok and fresh else None

    return wait_for(ready, 120, what=f"{namespace}/{NAME} Ready")


def decode_statefulset(api_client: client.ApiClient, namespace: str) -> client.V1StatefulSet:
    return client.AppsV1Api(api_client).read_namespaced_stateful_set(DECODE, namespace)


def engine_env(sts: client.V1StatefulSet) -> dict[str, str]:
    engine = next(c for c in sts.spec.template.spec.containers if c.name == "engine")
    return {e.name: e.value for e in engine.env or []}


def drift_events(api_client: client.ApiClient, namespace: str) -> list[str]:
    events = client.CoreV1Api(api_client).list_namespaced_event(namespace).items
    return [e.message for e in events if e.reason == "DriftCorrected"]


def test_a_statefulset_scaled_by_hand_is_scaled_back(
    operator: OperatorProcess,
    api_client: client.ApiClient,
    namespace: str,
    deployment: dict[str, Any],
) -> None:
    apps = client.AppsV1Api(api_client)
    apps.patch_namespaced_stateful_set_scale(DECODE, namespace, {"spec": {"replicas": 1}})

    wait_for(
        lambda: decode_statefulset(api_client, namespace).spec.replicas == 2,
        CORRECTED_WITHIN,
        what="decode StatefulSet scaled back to 2",
    )
    messages = wait_for(lambda: drift_events(api_client, namespace), 10, what="event")
    assert any(f"StatefulSet {DECODE}" in m for m in messages), messages
    assert operator.metric("pdd_operator_drift_corrections_total") >= 1


def test_an_env_var_removed_from_a_container_is_put_back(
    operator: OperatorProcess,
    api_client: client.ApiClient,
    namespace: str,
    deployment: dict[str, Any],
) -> None:
    sts = decode_statefulset(api_client, namespace)
    containers = sts.spec.template.spec.containers
    at = next(i for i, c in enumerate(containers) if c.name == "engine")
    env_at = [e.name for e in containers[at].env].index("UCX_RNDV_THRESH")
    path = f"/spec/template/spec/containers/{at}/env/{env_at}"
    # What `kubectl patch --type=json` or `kubectl edit` sends.
    client.AppsV1Api(api_client).patch_namespaced_stateful_set(
        DECODE, namespace, [{"op": "remove", "path": path}]
    )
    assert "UCX_RNDV_THRESH" not in engine_env(decode_statefulset(api_client, namespace))

    wait_for(
        lambda: (
            engine_env(decode_statefulset(api_client, namespace)).get("UCX_RNDV_THRESH")
            == RNDV_THRESH
        ),
        CORRECTED_WITHIN,
        what="UCX_RNDV_THRESH back in the engine container",
    )


def test_a_deleted_service_is_created_again(
    operator: OperatorProcess,
    api_client: client.ApiClient,
    namespace: str,
    deployment: dict[str, Any],
) -> None:
    core = client.CoreV1Api(api_client)
    old_uid = core.read_namespaced_service(DECODE, namespace).metadata.uid
    core.delete_namespaced_service(DECODE, namespace)

    def recreated() -> bool:
        try:
            service = core.read_namespaced_service(DECODE, namespace)
        except ApiException as err:
            if err.status == 404:
                return False
            raise
        return bool(service.metadata.uid != old_uid)

    wait_for(recreated, CORRECTED_WITHIN, what=f"Service {DECODE} created again")
    service = core.read_namespaced_service(DECODE, namespace)
    assert service.spec.cluster_ip == "None"
    assert service.metadata.owner_references[0].name == NAME


def test_a_foreign_label_and_annotation_are_kept_without_writes(
    operator: OperatorProcess,
    control_plane: Any,
    api_client: client.ApiClient,
    namespace: str,
    deployment: dict[str, Any],
) -> None:
    apps, core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
    time.sleep(3)  # let the last status write and child events settle
    reconciles_before = operator.metric("pdd_operator_reconciles_total")
    writes_before = control_plane.writes_by(OPERATOR_USER, namespace=namespace)

    foreign = {"metadata": {"labels": {"team": "search"}, "annotations": {"owner": "alice"}}}
    apps.patch_namespaced_stateful_set(DECODE, namespace, foreign)
    core.patch_namespaced_service(DECODE, namespace, foreign)
    # Those events change nothing a pass reads, so they may trigger none: a change to the
    # PDDeployment's metadata makes sure that a pass reads the children as they are now.
    client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, NAME, {"metadata": {"annotations": {"pdd.test/x": "1"}}}
    )
    wait_for(
        lambda: operator.metric("pdd_operator_reconciles_total") > reconciles_before,
        CORRECTED_WITHIN,
        what="a pass after the foreign label",
    )
    time.sleep(5)  # room for a write loop to show

    writes_after = control_plane.writes_by(OPERATOR_USER, namespace=namespace)
    assert writes_after == writes_before, (
        f"the operator made {writes_after - writes_before} writes after a foreign label"
    )
    sts = decode_statefulset(api_client, namespace)
    service = core.read_namespaced_service(DECODE, namespace)
    for meta in (sts.metadata, service.metadata):
        assert meta.labels["team"] == "search"
        assert meta.annotations["owner"] == "alice"
    assert not drift_events(api_client, namespace)
