"""API errors are told apart by the Status the real API server answers with (code, reason,
details), never by the words of its message: the refusals the operator handles, provoked on
the real kube-apiserver."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from helpers.waits import wait_for
from pdd_operator.kube.client import KubeApi, api_status, namespace_unavailable
from pdd_operator.kube.resources import SECRET

HOLD = "pdd.test/hold"  # a finalizer nobody removes but the test: keeps a namespace Terminating


def service_account(namespace: str, name: str = "probe") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": name, "namespace": namespace},
    }


@pytest.fixture
def kube(api_client: client.ApiClient) -> KubeApi:
    return KubeApi(api_client, "pdd-operator-test")


@pytest.fixture
def terminating_namespace(api_client: client.ApiClient) -> Iterator[str]:
    """A namespace being deleted, held in Terminating by a finalizer on an object inside."""
    core = client.CoreV1Api(api_client)
    name = f"t-terminating-{secrets.token_hex(3)}"
    core.create_namespace({"metadata": {"name": name}})
    core.create_namespaced_config_map(name, {"metadata": {"name": "held", "finalizers": [HOLD]}})
    core.delete_namespace(name)
    wait_for(
        lambda: core.read_namespace(name).status.phase == "Terminating",
        30,
        what=f"namespace {name} Terminating",
    )
    yield name
    core.patch_namespaced_config_map("held", name, {"metadata": {"finalizers": None}})


def refusal(call: Any) -> ApiException:
    with pytest.raises(ApiException) as caught:
        call()
    return caught.value


def test_a_create_in_a_terminating_namespace(kube: KubeApi, terminating_namespace: str) -> None:
    err = refusal(lambda: kube.apply(service_account(terminating_namespace)))
    status = api_status(err)
    assert (status.code, status.reason) == (403, "Forbidden")
    assert "NamespaceTerminating" in status.causes
    assert namespace_unavailable(err)


def test_a_create_in_a_namespace_that_does_not_exist(kube: KubeApi) -> None:
    err = refusal(lambda: kube.apply(service_account(f"t-never-{secrets.token_hex(3)}")))
    status = api_status(err)
    assert (status.code, status.reason, status.kind, status.group) == (
        404,
        "NotFound",
        "namespaces",
        "",
    )
    assert namespace_unavailable(err)


def test_other_refusals_are_not_a_namespace_going_away(kube: KubeApi, namespace: str) -> None:
    invalid = service_account(namespace, name="Not_A_DNS_Name")
    err = refusal(lambda: kube.apply(invalid))
    assert (api_status(err).code, api_status(err).reason) == (422, "Invalid")
    assert not namespace_unavailable(err)

    # An object that is not there, in a namespace that is: NotFound about the object.
    missing = refusal(
        lambda: kube._call("GET", SECRET.path(namespace, "absent"), None, [], "application/json")
    )
    assert (api_status(missing).reason, api_status(missing).kind) == ("NotFound", "secrets")
    assert not namespace_unavailable(missing)


def test_already_exists_and_conflict_are_two_different_409s(
    kube: KubeApi, api_client: client.ApiClient, namespace: str
) -> None:
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "token", "namespace": namespace},
        "stringData": {"token": "a"},
    }
    assert kube.create_if_absent(secret) is True
    assert kube.create_if_absent({**secret, "stringData": {"token": "b"}}) is False
    core = client.CoreV1Api(api_client)
    assert core.read_namespaced_secret("token", namespace).data["token"] == "YQ=="  # "a"

    exists = refusal(
        lambda: kube._call("POST", SECRET.path(namespace), secret, [], "application/json")
    )
    assert (api_status(exists).code, api_status(exists).reason) == (409, "AlreadyExists")

    # A write that names a resourceVersion the object no longer has: Conflict, worth a retry.
    stale = core.read_namespaced_secret("token", namespace).metadata.resource_version
    core.patch_namespaced_secret("token", namespace, {"metadata": {"labels": {"a": "1"}}})
    conflict = refusal(
        lambda: kube._call(
            "PATCH",
            SECRET.path(namespace, "token"),
            {"metadata": {"resourceVersion": stale, "labels": {"a": "2"}}},
            [],
            "application/merge-patch+json",
        )
    )
    assert (api_status(conflict).code, api_status(conflict).reason) == (409, "Conflict")
