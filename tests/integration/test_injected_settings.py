"""A podTemplate that sets what the operator injects (free-form: past the CRD's rules) is
refused by the operator on the real control plane: Stalled=InvalidSpec naming the field, no
children, and the deployment proceeds once the template is fixed."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from helpers.factories import small_pdd_body
from helpers.operator_proc import OperatorProcess
from helpers.waits import wait_for

GROUP, VERSION, PLURAL = "pdd.dev", "v1alpha1", "pddeployments"

TEMPLATES = [
    ("prefill", {"metadata": {"labels": {"pdd.dev/revision": "mine"}}}, "pdd.dev/revision"),
    (
        "decode",
        {
            "spec": {
                "containers": [{"name": "engine", "env": [{"name": "UCX_TLS", "value": "tcp"}]}]
            }
        },
        "env[UCX_TLS]",
    ),
    (
        "decode",
        {"metadata": {"annotations": {"k8s.v1.cni.cncf.io/networks": "kube-system/host"}}},
        "spec.kvTransfer.rdma.networks",
    ),
    # The injected sidecar, on a cluster without the chart's podTemplate policy.
    (
        "prefill",
        {"spec": {"containers": [{"name": "nixl-sidecar", "command": ["sh"]}]}},
        "containers[nixl-sidecar] sets command",
    ),
    # A volume of the sidecar's name would swap the token it checks its peers with.
    (
        "decode",
        {"spec": {"volumes": [{"name": "sidecar-token", "secret": {"secretName": "mine"}}]}},
        "spec.volumes[sidecar-token] is a volume the operator injects",
    ),
]


@pytest.mark.parametrize("role,template,fragment", TEMPLATES, ids=[f for _, _, f in TEMPLATES])
def test_a_pod_template_overriding_injected_settings_is_stalled(
    operator: OperatorProcess,
    api_client: client.ApiClient,
    namespace: str,
    role: str,
    template: dict[str, Any],
    fragment: str,
) -> None:
    custom = client.CustomObjectsApi(api_client)
    body = small_pdd_body(
        "kv",
        namespace,
    )
    body["spec"][role]["podTemplate"] = template
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

    def stalled() -> dict[str, Any]:
        obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "kv")
        found = {c["type"]: c for c in obj.get("status", {}).get("conditions", [])}
        cond = found.get("Stalled", {})
        return cond if cond.get("reason") == "InvalidSpec" else {}

    message = wait_for(stalled, 30, what="Stalled=InvalidSpec")["message"]
    assert message.startswith(f"spec.{role}.podTemplate: ") and fragment in message, message
    assert client.AppsV1Api(api_client).list_namespaced_stateful_set(namespace).items == []

    custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "kv", {"spec": {role: {"podTemplate": None}}}
    )
    wait_for(
        lambda: (
            len(client.AppsV1Api(api_client).list_namespaced_stateful_set(namespace).items) == 2
        ),
        30,
        what="the children once the template is fixed",
    )
