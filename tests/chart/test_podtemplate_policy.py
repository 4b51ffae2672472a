"""The chart's podTemplate policy (ValidatingAdmissionPolicy + binding, as `manifests/` ships
it) on the real API server: each thing it refuses is one apply that fails naming the field,
the settings next to them still pass, and a namespace labelled pdd.dev/pod-policy=privileged
is left out of it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from helpers.factories import pdd_body
from helpers.waits import wait_for

from .support import (
    apply,
    delete_documents,
    ensure_namespace,
    exists,
    manifest_documents,
    wait_crd_established,
)

POLICY_KINDS = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
NAMESPACE, EXEMPT_NAMESPACE = "policy-team", "policy-exempt"
EXEMPT_LABEL = {"pdd.dev/pod-policy": "privileged"}


def container(name: str, **fields: Any) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": name, **fields}]}}


def init_container(name: str, **fields: Any) -> dict[str, Any]:
    return {"spec": {"initContainers": [{"name": name, **fields}]}}


# (case, role, podTemplate, what the refusal must name)
REFUSED: list[tuple[str, str, dict[str, Any], str]] = [
    (
        "hostNetwork",
        "prefill",
        {"spec": {"hostNetwork": True}},
        "spec.prefill.podTemplate.spec.hostNetwork",
    ),
    ("hostPID", "decode", {"spec": {"hostPID": True}}, "spec.decode.podTemplate.spec.hostPID"),
    ("hostIPC", "router", {"spec": {"hostIPC": True}}, "spec.router.podTemplate.spec.hostIPC"),
    (
        "privileged engine",
        "prefill",
        container("engine", securityContext={"privileged": True}),
        "spec.prefill.podTemplate.spec.containers[engine].securityContext.privileged",
    ),
    (
        "privileged init container",
        "decode",
        init_container("setup", image="busybox", securityContext={"privileged": True}),
        "spec.decode.podTemplate.spec.initContainers[setup].securityContext.privileged",
    ),
    (
        "privilege escalation",
        "decode",
        container("engine", securityContext={"allowPrivilegeEscalation": True}),
        "containers[engine].securityContext.allowPrivilegeEscalation",
    ),
    (
        "SYS_ADMIN",
        "prefill",
        container("engine", securityContext={"capabilities": {"add": ["IPC_LOCK", "SYS_ADMIN"]}}),
        "containers[engine].securityContext.capabilities.add",
    ),
    (
        "hostPath /",
        "prefill",
        {"spec": {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}},
        "spec.prefill.podTemplate.spec.volumes[root].hostPath",
    ),
    (
        "sidecar command",
        "prefill",
        container("nixl-sidecar", command=["sh", "-c", "cat /var/run/pdd/token"]),
        "containers[nixl-sidecar] sets command",
    ),
    ("sidecar args", "decode", container("nixl-sidecar", args=["--debug"]), "sets args"),
    (
        "sidecar env",
        "decode",
        container("nixl-sidecar", env=[{"name": "HTTP_PROXY", "value": "http://evil"}]),
        "containers[nixl-sidecar] sets env",
    ),
    (
        "sidecar mounts",
        "prefill",
        container("nixl-sidecar", volumeMounts=[{"name": "model", "mountPath": "/m"}]),
        "sets volumeMounts",
    ),
    ("sidecar image", "prefill", container("nixl-sidecar", image="evil:1"), "sets image"),
    (
        "sidecar securityContext",
        "decode",
        container("nixl-sidecar", securityContext={"runAsUser": 0}),
        "sets securityContext",
    ),
    (
        "preflight command",
        "prefill",
        init_container("preflight", command=["sh"]),
        "spec.prefill.podTemplate.spec.initContainers[preflight] sets command",
    ),
    (
        "preflight env",
        "decode",
        init_container("preflight", env=[{"name": "X", "value": "1"}]),
        "initContainers[preflight] sets env",
    ),
]  # fmt: skip

ALLOWED: list[tuple[str, str, dict[str, Any]]] = [
    (
        "IPC_LOCK",
        "prefill",
        container("engine", securityContext={"capabilities": {"add": ["IPC_LOCK"]}}),
    ),
    ("nodeSelector", "decode", {"spec": {"nodeSelector": {"pool": "h200"}}}),
    (
        "tolerations",
        "prefill",
        {"spec": {"tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]}},
    ),
    ("engine env", "decode", container("engine", env=[{"name": "HF_HUB_OFFLINE", "value": "1"}])),
    (
        "emptyDir volume",
        "prefill",
        {
            "spec": {
                "volumes": [{"name": "scratch", "emptyDir": {}}],
                "containers": [
                    {"name": "engine", "volumeMounts": [{"name": "scratch", "mountPath": "/s"}]}
                ],
            }
        },
    ),
    ("hostNetwork false", "router", {"spec": {"hostNetwork": False}}),
    (
        "sidecar resources",
        "decode",
        container("nixl-sidecar", resources={"limits": {"memory": "1Gi"}}),
    ),
]


@pytest.fixture(scope="module")
def policy(api_client: client.ApiClient, dynamic: DynamicClient) -> Iterator[None]:
    """The CRD and the policy objects of `manifests/`, applied as `kubectl apply -k` would,
    once the API server enforces the policy (its admission plugin loads it asynchronously)."""
    docs = manifest_documents()
    policy_docs = [d for d in docs if d["kind"] in POLICY_KINDS]
    assert {d["kind"] for d in policy_docs} == POLICY_KINDS, "manifests/ lacks the policy"
    for doc in docs:
        if doc["kind"] == "CustomResourceDefinition":
            apply(dynamic, doc)
            wait_crd_established(api_client, doc["metadata"]["name"])
    core = client.CoreV1Api(api_client)
    ensure_namespace(api_client, NAMESPACE)
    ensure_namespace(api_client, EXEMPT_NAMESPACE)
    core.patch_namespace(EXEMPT_NAMESPACE, {"metadata": {"labels": EXEMPT_LABEL}})
    for doc in policy_docs:
        apply(dynamic, doc)
    wait_for(
        lambda: _refusal(dynamic, _body(NAMESPACE, "prefill", {"spec": {"hostNetwork": True}})),
        timeout=60,
        what="the podTemplate policy to be enforced",
    )
    yield
    delete_documents(dynamic, policy_docs)


def _body(namespace: str, role: str, template: dict[str, Any]) -> dict[str, Any]:
    name = f"pt-{uuid.uuid4().hex[:8]}"
    body = pdd_body(name, namespace)
    body["spec"][role] = {**body["spec"][role], "podTemplate": template}
    return body


def _refusal(dynamic: DynamicClient, body: dict[str, Any]) -> str | None:
    """The API server's refusal of the apply, or None where it stored the object."""
    try:
        apply(dynamic, body)
    except ApiException as err:
        return str(err.body)
    _delete(dynamic, body)
    return None


def _delete(dynamic: DynamicClient, body: dict[str, Any]) -> None:
    resource = dynamic.resources.get(api_version=body["apiVersion"], kind=body["kind"])
    meta = body["metadata"]
    dynamic.delete(resource, name=meta["name"], namespace=meta["namespace"])


@pytest.mark.usefixtures("policy")
@pytest.mark.parametrize(
    ("role", "template", "named"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_the_policy_refuses_and_names_the_field(
    dynamic: DynamicClient, role: str, template: dict[str, Any], named: str
) -> None:
    body = _body(NAMESPACE, role, template)
    refusal = _refusal(dynamic, body)
    assert refusal is not None, f"stored a podTemplate the policy must refuse: {template}"
    assert "ValidatingAdmissionPolicy" in refusal and named in refusal, refusal
    # Every message says what to do about it.
    assert "remove" in refusal, refusal
    assert not exists(dynamic, body)


@pytest.mark.usefixtures("policy")
@pytest.mark.parametrize(
    ("role", "template"), [c[1:] for c in ALLOWED], ids=[c[0] for c in ALLOWED]
)
def test_the_policy_lets_the_settings_beside_them_pass(
    dynamic: DynamicClient, role: str, template: dict[str, Any]
) -> None:
    body = _body(NAMESPACE, role, template)
    assert _refusal(dynamic, body) is None


@pytest.mark.usefixtures("policy")
def test_an_exempt_namespace_accepts_host_network(dynamic: DynamicClient) -> None:
    body = _body(EXEMPT_NAMESPACE, "prefill", {"spec": {"hostNetwork": True}})
    stored = apply(dynamic, body)
    assert stored["spec"]["prefill"]["podTemplate"]["spec"]["hostNetwork"] is True
    resource = dynamic.resources.get(api_version=body["apiVersion"], kind=body["kind"])
    dynamic.delete(resource, name=body["metadata"]["name"], namespace=EXEMPT_NAMESPACE)


@pytest.mark.usefixtures("policy")
def test_an_object_stored_before_the_policy_can_still_be_updated(
    api_client: client.ApiClient, dynamic: DynamicClient
) -> None:
    """Only a changed spec is checked: a finalizer or label added to an object from before the
    policy (stored here in the exempt namespace, then the exemption lifted) still goes through,
    so the operator can finish with it and it can be deleted."""
    core = client.CoreV1Api(api_client)
    namespace = "policy-before"
    ensure_namespace(api_client, namespace)
    core.patch_namespace(namespace, {"metadata": {"labels": EXEMPT_LABEL}})
    body = _body(namespace, "decode", {"spec": {"hostPID": True}})
    apply(dynamic, body)
    core.patch_namespace(namespace, {"metadata": {"labels": {"pdd.dev/pod-policy": None}}})
    resource = dynamic.resources.get(api_version=body["apiVersion"], kind=body["kind"])
    name = body["metadata"]["name"]
    # The exemption's removal reaches the admission plugin's namespace cache asynchronously.
    probe = {"spec": {"hostNetwork": True}}
    wait_for(lambda: _refusal(dynamic, _body(namespace, "prefill", probe)), timeout=30)
    changed = {
        **body,
        "spec": {**body["spec"], "decode": {**body["spec"]["decode"], "replicas": 1}},
    }
    refusal = _refusal(dynamic, changed)
    assert refusal is not None and "spec.decode.podTemplate.spec.hostPID" in refusal, refusal
    patched = dynamic.patch(
        resource,
        name=name,
        namespace=namespace,
        body={"metadata": {"labels": {"team": "a"}}},
        content_type="application/merge-patch+json",
    )
    assert patched.metadata.labels["team"] == "a"
    dynamic.delete(resource, name=name, namespace=namespace)
