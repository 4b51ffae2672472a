"""Status and pods are the operator's, on the real control plane: a forged status is put back,
and a pod of someone else's that copies the labels is not counted."""

from __future__ import annotations

import json
import time
from typing import Any

from kubernetes import client

from helpers.factories import small_pdd_body
from helpers.operator_proc import OperatorProcess
from helpers.waits import wait_for

GROUP, VERSION, PLURAL = "pdd.dev", "v1alpha1", "pddeployments"


def create(api: client.ApiClient, ns: str) -> None:
    body = small_pdd_body(
        "kv",
        ns,
    )
    client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)


def pdd(api: client.ApiClient, ns: str) -> dict[str, Any]:
    return client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, "kv"
    )


def condition(api: client.ApiClient, ns: str, type_: str) -> dict[str, Any]:
    conditions = pdd(api, ns).get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == type_), {})


def test_a_forged_status_is_put_back_on_the_next_pass(
    operator: OperatorProcess, api_client: client.ApiClient, namespace: str
) -> None:
    create(api_client, namespace)
    wait_for(lambda: condition(api_client, namespace, "Ready"), 30, what="a first status")
    forged = {
        "status": {
            "transfer": {"measuredGBps": 999.0, "verified": True, "message": "forged"},
            "conditions": [
                *pdd(api_client, namespace)["status"]["conditions"],
                {"type": "KVTransferVerified", "status": "True", "reason": "TransferVerified",
                 "message": "forged", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            ],
        }
    }  # fmt: skip
    client.CustomObjectsApi(api_client).patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "kv", forged
    )

    # No probe has been answered on the prober pod: "not verified yet", whatever was written.
    transfer = wait_for(
        lambda: (
            (t := pdd(api_client, namespace)["status"]["transfer"])["measuredGBps"] != 999.0 and t
        ),
        30,
        what="the forged transfer replaced",
    )
    assert transfer["verified"] is False and transfer["message"].startswith("not verified yet")
    assert condition(api_client, namespace, "KVTransferVerified") == {}


def test_a_pod_that_copies_the_labels_is_not_counted(
    operator: OperatorProcess, api_client: client.ApiClient, namespace: str
) -> None:
    create(api_client, namespace)
    wait_for(
        lambda: condition(api_client, namespace, "Ready").get("status") == "True", 90, what="Ready"
    )
    core = client.CoreV1Api(api_client)
    real = core.read_namespaced_pod("kv-prefill-0", namespace).metadata
    # Labels and annotations copied from the deployment's own pod; a node nobody has, so the
    # scheduler marks it Unschedulable: a problem Degraded would name were it counted.
    copycat = client.V1Pod(
        metadata=client.V1ObjectMeta(
            name="copycat", labels=real.labels, annotations=real.annotations
        ),
        spec=client.V1PodSpec(
            node_selector={"example.com/nowhere": "true"},
            containers=[client.V1Container(name="c", image="busybox")],
        ),
    )
    core.create_namespaced_pod(namespace, copycat)

    def unschedulable() -> bool:
        conditions = core.read_namespaced_pod("copycat", namespace).status.conditions or []
        return any(c.type == "PodScheduled" and c.status == "False" for c in conditions)

    wait_for(unschedulable, 30, what="the copycat pod Unschedulable")
    # Its event and a few resyncs (2 s apart) have had their pass.
    core.patch_namespaced_pod("copycat", namespace, {"metadata": {"labels": {"touch": "1"}}})
    time.sleep(8)
    status = pdd(api_client, namespace)["status"]
    assert "copycat" not in json.dumps(status)
    assert condition(api_client, namespace, "Degraded")["status"] == "False"
