"""The chart's KV-lane warning (a ValidatingAdmissionPolicy with a Warn binding, as
`manifests/` ships it) through the real kubectl: a PDDeployment whose KV can only go over TCP
(no RDMA NIC, prefill and decode in separate PID namespaces) is stored with a warning that says
what to change; one with an RDMA NIC, with hostPID on both roles, or with a custom engine is
stored without one; nothing is ever refused."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.dynamic import DynamicClient

from helpers.factories import pdd_body
from helpers.waits import wait_for
from pdd_localcluster.controlplane import LocalControlPlane, resolve_bin_dir

from .support import (
    apply,
    delete_documents,
    ensure_namespace,
    manifest_documents,
    wait_crd_established,
)

NAMESPACE = "kv-lane-team"
POLICY = "pdd-operator-kv-lane"
HOST_PID = {"podTemplate": {"spec": {"hostPID": True}}}
Kubectl = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def kubectl(control_plane: LocalControlPlane, api_client: client.ApiClient,
            dynamic: DynamicClient) -> Iterator[Kubectl]:  # fmt: skip
    docs = manifest_documents()
    lane = [d for d in docs if d["metadata"]["name"] == POLICY]
    assert {d["kind"] for d in lane} == {
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }, "manifests/ lacks the KV-lane warning"
    for doc in docs:
        if doc["kind"] == "CustomResourceDefinition":
            apply(dynamic, doc)
            wait_crd_established(api_client, doc["metadata"]["name"])
    ensure_namespace(api_client, NAMESPACE)
    for doc in lane:
        apply(dynamic, doc)

    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        argv = [str(resolve_bin_dir() / "kubectl"), "--kubeconfig",
                str(control_plane.kubeconfig), *args]  # fmt: skip
        return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=120)

    # The API server loads a new policy asynchronously: wait until it warns.
    wait_for(lambda: "Warning" in _apply(run, {}).stderr, timeout=60,
             what="the KV-lane warning to be enforced")  # fmt: skip
    yield run
    delete_documents(dynamic, lane)


def _apply(kubectl: Kubectl, patch: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    body = pdd_body(f"lane-{uuid.uuid4().hex[:8]}", NAMESPACE, **patch)
    result = kubectl("apply", "-f", "-", stdin=json.dumps(body))
    assert result.returncode == 0, result.stderr  # a warning, never a refusal
    kubectl("-n", NAMESPACE, "delete", "pdd", body["metadata"]["name"], "--wait=false")
    return result


def test_a_tcp_only_deployment_is_stored_with_a_warning_that_says_what_to_change(
    kubectl: Kubectl,
) -> None:
    result = _apply(kubectl, {})
    assert "created" in result.stdout
    warning = result.stderr
    assert "Warning:" in warning and "software emulation over TCP" in warning, warning
    assert "spec.kvTransfer.rdma" in warning and "hostPID: true in both podTemplates" in warning


@pytest.mark.parametrize(
    "patch",
    [
        {"kvTransfer": {"rdma": {"resourceName": "rdma/rdma_shared_device_a"}}},
        {"prefill": HOST_PID, "decode": HOST_PID},
        {"engine": {"type": "custom", "image": "example.com/engine:1"}},
    ],
    ids=["rdma", "host-pid", "custom-engine"],
)
def test_no_warning_where_the_kv_has_another_lane(kubectl: Kubectl, patch: dict[str, Any]) -> None:
    result = _apply(kubectl, patch)
    assert "Warning" not in result.stderr, result.stderr


def test_hostpid_on_one_role_only_still_warns(kubectl: Kubectl) -> None:
    assert "software emulation over TCP" in _apply(kubectl, {"prefill": HOST_PID}).stderr
