"""The chart's name-guard policy (ValidatingAdmissionPolicy + binding, as `manifests/` ships
them) on the real API server: an apply that would make an existing object a PDDeployment's
child is refused with a message that names the object and says what to do, whoever sends it;
creating a child, changing one's own child, orphaning it, adopting it back with the operator's
proof (and only with the whole of it), and everyone's ordinary updates pass. And the
operator's start-up check reads the installed pair as in force."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from helpers.waits import wait_for
from pdd_operator.api import names
from pdd_operator.kube.client import KubeApi
from pdd_operator.rendering.context import OperatorSettings

from .support import apply, delete_documents, ensure_namespace, manifest_documents

NAMESPACE = "guard-team"
POLICY = "pdd-operator-child-names"  # the chart's default release name + "-child-names"
MARK = "pdd.dev/name-taken"


def guard_documents() -> list[dict[str, Any]]:
    docs = [d for d in manifest_documents() if d["metadata"]["name"] == POLICY]
    assert sorted(d["kind"] for d in docs) == [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ], "manifests/ lacks the name-guard policy"
    return docs


def pdd_owner(uid: str, name: str = "kv", controller: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": "pdd.dev/v1alpha1",
        "kind": "PDDeployment",
        "name": name,
        "uid": uid,
        "controller": controller,
    }


def service(name: str, owners: list[dict[str, Any]] | None = None, **labels: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NAMESPACE, "labels": labels}
    if owners is not None:
        meta["ownerReferences"] = owners
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {"selector": {"app": name}, "ports": [{"name": "web", "port": 80}]},
    }


def refusal(dynamic: DynamicClient, obj: dict[str, Any]) -> str | None:
    """The API server's refusal of the apply, or None where it took it."""
    try:
        apply(dynamic, obj)
    except ApiException as err:
        return str(err.body)
    return None


def fresh_name() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def guard(api_client: client.ApiClient, dynamic: DynamicClient) -> Iterator[None]:
    """The policy and its binding applied, once the API server enforces them (its admission
    plugin loads them asynchronously)."""
    ensure_namespace(api_client, NAMESPACE)
    docs = guard_documents()
    for doc in docs:
        apply(dynamic, doc)
    probe = fresh_name()
    apply(dynamic, service(probe))
    wait_for(
        lambda: refusal(dynamic, service(probe, [pdd_owner(str(uuid.uuid4()))])),
        timeout=60,
        what="the name-guard policy to be enforced",
    )
    yield
    delete_documents(dynamic, docs)


def live(api_client: client.ApiClient, name: str) -> Any:
    return client.CoreV1Api(api_client).read_namespaced_service(name, NAMESPACE)


@pytest.mark.usefixtures("guard")
def test_an_unowned_object_is_not_made_a_pddeployments_child(
    api_client: client.ApiClient, dynamic: DynamicClient
) -> None:
    name = fresh_name()
    apply(dynamic, service(name, team="web"))
    before = live(api_client, name).metadata.resource_version

    refused = refusal(dynamic, service(name, [pdd_owner(str(uuid.uuid4()))], team="pdd"))

    assert refused is not None and MARK in refused
    assert f"Service {NAMESPACE}/{name} exists and is not the child of the PDDeployment" in refused
    assert "lacks the proof of having been its child" in refused
    assert "delete or rename it, or rename the PDDeployment" in refused
    assert live(api_client, name).metadata.resource_version == before


def claim(dynamic: DynamicClient, obj: dict[str, Any]) -> str | None:
    """An apply under the operator's own field manager (not the one that made the object, so
    the object's owner references are merged with the claim, not replaced); the refusal, or
    None where the API server took it."""
    resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    try:
        dynamic.server_side_apply(
            resource,
            body=obj,
            name=obj["metadata"]["name"],
            namespace=obj["metadata"]["namespace"],
            field_manager="pdd-operator",
            force_conflicts=True,
        )
    except ApiException as err:
        return str(err.body)
    return None


def owner_uids(api_client: client.ApiClient, name: str) -> list[tuple[str, bool]]:
    refs = live(api_client, name).metadata.owner_references or []
    return [(r.uid, bool(r.controller)) for r in refs]


@pytest.mark.usefixtures("guard")
def test_a_non_controller_reference_does_not_let_a_claim_through(
    api_client: client.ApiClient, dynamic: DynamicClient
) -> None:
    """The object names a PDDeployment, but not as its controller: it is nobody's child, and
    another deployment may not make it its own."""
    name, first = fresh_name(), str(uuid.uuid4())
    apply(dynamic, service(name, [pdd_owner(first, "first", controller=False)]))

    refused = claim(dynamic, service(name, [pdd_owner(str(uuid.uuid4()), "second")]))

    assert refused is not None and MARK in refused
    assert owner_uids(api_client, name) == [(first, False)]


@pytest.mark.usefixtures("guard")
def test_another_pddeployments_child_is_not_taken_over(
    api_client: client.ApiClient, dynamic: DynamicClient
) -> None:
    """Its controller is the other deployment. The API server's own validation refuses a
    second controller reference too, before admission; either refusal leaves it as it was."""
    name, first = fresh_name(), str(uuid.uuid4())
    apply(dynamic, service(name, [pdd_owner(first, "first")]))

    refused = claim(dynamic, service(name, [pdd_owner(str(uuid.uuid4()), "second")]))

    assert refused is not None
    assert owner_uids(api_client, name) == [(first, True)]


@pytest.mark.usefixtures("guard")
def test_creating_changing_and_orphaning_ones_own_child_pass(
    api_client: client.ApiClient, dynamic: DynamicClient
) -> None:
    name, uid = fresh_name(), str(uuid.uuid4())
    assert refusal(dynamic, service(name, [pdd_owner(uid)])) is None  # created as a child
    assert refusal(dynamic, service(name, [pdd_owner(uid)], changed="yes")) is None
    assert live(api_client, name).metadata.labels == {"changed": "yes"}
    # Orphaned (what the garbage collector does on `--cascade=orphan`): no PDDeployment left.
    assert refusal(dynamic, service(name, [])) is None
    assert not live(api_client, name).metadata.owner_references


@pytest.mark.usefixtures("guard")
def test_updates_that_name_no_pddeployment_are_not_evaluated(
    api_client: client.ApiClient, dynamic: DynamicClient
) -> None:
    name = fresh_name()
    apply(dynamic, service(name))
    deployment_owner = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "web",
        "uid": str(uuid.uuid4()),
        "controller": True,
    }
    assert refusal(dynamic, service(name, [deployment_owner], team="web")) is None


@pytest.mark.usefixtures("guard")
def test_the_operator_reads_the_installed_policy_as_in_force(api_client: client.ApiClient) -> None:
    kube = KubeApi(api_client)
    assert kube.name_guard_problem(POLICY) == ""
    assert "not found" in kube.name_guard_problem("no-such-policy")


def operators_child(name: str, uid: str, deployment: str = "kv") -> dict[str, Any]:
    """A Service as the operator renders a child of PDDeployment `deployment`: its identity
    label and name annotation, its controller owner reference."""
    obj = service(name, [pdd_owner(uid, deployment)])
    obj["metadata"]["labels"] = {names.LABEL_DEPLOYMENT: names.instance_id(deployment)}
    obj["metadata"]["annotations"] = {names.ANNOTATION_OWNER_NAME: deployment}
    return obj


def strip_owner(api_client: client.ApiClient, name: str) -> None:
    """What a `kubectl replace` of an exported manifest does: the same object, no owner
    reference (an update by another field manager)."""
    core = client.CoreV1Api(api_client)
    current = core.read_namespaced_service(name, NAMESPACE)
    current.metadata.owner_references = None
    core.replace_namespaced_service(name, NAMESPACE, current)
    assert not live(api_client, name).metadata.owner_references


def test_the_policy_checks_the_operators_own_field_manager() -> None:
    (policy,) = [d for d in guard_documents() if d["kind"] == "ValidatingAdmissionPolicy"]
    (adoption,) = [v for v in policy["spec"]["variables"] if v["name"] == "adoption"]
    assert f"m.?manager.orValue('') == '{OperatorSettings.field_manager}'" in adoption["expression"]


@pytest.mark.usefixtures("guard")
def test_a_child_that_lost_its_owner_reference_is_adopted_back_with_the_proof(
    api_client: client.ApiClient, dynamic: DynamicClient
) -> None:
    name, uid = fresh_name(), str(uuid.uuid4())
    assert claim(dynamic, operators_child(name, uid)) is None  # the operator created it
    strip_owner(api_client, name)

    assert claim(dynamic, operators_child(name, uid)) is None

    assert owner_uids(api_client, name) == [(uid, True)]


def made_by_someone_else(dynamic: DynamicClient, obj: dict[str, Any]) -> None:
    """Created with the operator's labels and annotation, by another field manager."""
    copied = {
        **obj,
        "metadata": {k: v for k, v in obj["metadata"].items() if k != "ownerReferences"},
    }
    apply(dynamic, copied)


SPOILED = {
    "no deployment label": lambda obj: obj["metadata"].update(labels={"team": "x"}),
    "named for another deployment": lambda obj: obj["metadata"].update(
        annotations={names.ANNOTATION_OWNER_NAME: "other"}
    ),
}


@pytest.mark.usefixtures("guard")
@pytest.mark.parametrize("spoil", [*SPOILED, "never applied by the operator"])
def test_an_unowned_object_without_the_whole_proof_is_not_adopted(
    api_client: client.ApiClient, dynamic: DynamicClient, spoil: str
) -> None:
    name, uid = fresh_name(), str(uuid.uuid4())
    made = operators_child(name, uid)
    if spoil in SPOILED:
        SPOILED[spoil](made)
        assert claim(dynamic, made) is None
        strip_owner(api_client, name)
    else:
        made_by_someone_else(dynamic, made)
    before = live(api_client, name).metadata.resource_version

    refused = claim(dynamic, operators_child(name, uid))

    assert refused is not None and MARK in refused
    assert live(api_client, name).metadata.resource_version == before


@pytest.mark.usefixtures("guard")
def test_an_object_under_another_controller_is_not_adopted_even_with_the_proof(
    api_client: client.ApiClient,
) -> None:
    """Its labels, annotation and managed fields are the operator's, but another object is its
    controller: an update that swaps that controller for the PDDeployment is refused."""
    name, uid = fresh_name(), str(uuid.uuid4())
    core = client.CoreV1Api(api_client)
    made = operators_child(name, uid)
    made["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": str(uuid.uuid4()),
         "controller": True}
    ]  # fmt: skip
    core.create_namespaced_service(NAMESPACE, made)
    current = core.read_namespaced_service(name, NAMESPACE)
    current.metadata.managed_fields[0].manager = "pdd-operator"  # forged, as the docs admit
    current.metadata.managed_fields[0].operation = "Apply"
    core.replace_namespaced_service(name, NAMESPACE, current)
    current = core.read_namespaced_service(name, NAMESPACE)
    assert any(m.manager == "pdd-operator" for m in current.metadata.managed_fields)
    current.metadata.owner_references = [client.V1OwnerReference(**pdd_owner(uid))]

    with pytest.raises(ApiException) as refused:
        core.replace_namespaced_service(name, NAMESPACE, current)

    assert MARK in str(refused.value.body)
