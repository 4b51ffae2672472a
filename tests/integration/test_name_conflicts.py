"""Names and ownership on the real control plane: an object holding a child's name that the
PDDeployment does not own is never taken over, changed or deleted; the PDDeployment is
Stalled=NameConflict naming it (and its owner) and what it holds, with a Warning event, keeps
every child that does not run against it as the spec says, and resumes once the name is free.
A child that lost its owner reference but carries the proof of being the deployment's gets
it back. Two PDDeployments whose names used to map to the same children get their own.

Every test runs twice: with the operator looking up each new child's name before its apply,
and as a Helm install runs it, with the chart's name-guard policy refusing the takeover at the
API server (only workloads looked up first)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from helpers.factories import small_pdd_body
from helpers.operator_proc import OPERATOR_USER, OperatorProcess, operator_on
from helpers.waits import wait_for
from pdd_localcluster import LocalControlPlane, NodeSimulator
from pdd_operator.api import names

GROUP, VERSION, PLURAL = "pdd.dev", "v1alpha1", "pddeployments"
FOREIGN_LABELS = {"app": "someone-else"}
GUARDED = "name-guard policy"


@pytest.fixture(scope="module", params=["looked up", GUARDED])
def operator(
    request: pytest.FixtureRequest,
    control_plane: LocalControlPlane,
    api_client: client.ApiClient,
    node_sim: NodeSimulator,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    log_dir = tmp_path_factory.mktemp("operator")
    with operator_on(control_plane, api_client, log_dir, name_guard=request.param == GUARDED) as op:
        yield op


def guarded(operator: OperatorProcess) -> bool:
    return "PDD_NAME_GUARD_POLICY" in operator.extra_env


def create_pdd(api: client.ApiClient, ns: str, name: str = "kv") -> dict[str, Any]:
    body = small_pdd_body(
        name,
        ns,
    )
    return client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, body
    )


def conditions(api: client.ApiClient, ns: str, name: str = "kv") -> dict[str, dict[str, Any]]:
    obj = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, name
    )
    return {c["type"]: c for c in obj.get("status", {}).get("conditions", [])}


def stalled_by_conflict(api: client.ApiClient, ns: str, name: str = "kv") -> dict[str, Any]:
    stalled = conditions(api, ns, name).get("Stalled", {})
    return stalled if stalled.get("reason") == "NameConflict" else {}


# ------------------------------------------------------------------ someone else's objects


def foreign_statefulset(name: str, owners: list[Any] | None = None) -> Any:
    pod = client.V1PodTemplateSpec(
        metadata=client.V1ObjectMeta(labels=FOREIGN_LABELS),
        spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="busybox")]),
    )
    return client.V1StatefulSet(
        metadata=client.V1ObjectMeta(name=name, labels=FOREIGN_LABELS, owner_references=owners),
        spec=client.V1StatefulSetSpec(
            replicas=0,
            service_name=name,
            selector=client.V1LabelSelector(match_labels=FOREIGN_LABELS),
            template=pod,
        ),
    )


def foreign_service(name: str, owners: list[Any] | None = None) -> Any:
    return client.V1Service(
        metadata=client.V1ObjectMeta(name=name, labels=FOREIGN_LABELS, owner_references=owners),
        spec=client.V1ServiceSpec(
            selector=FOREIGN_LABELS, ports=[client.V1ServicePort(name="web", port=80)]
        ),
    )


# kind, the child's name for PDDeployment "kv", create, read, delete (api client, ns, ...)
Ops = tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]


def ops(api: client.ApiClient, kind: str) -> Ops:
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    rbac, net = client.RbacAuthorizationV1Api(api), client.NetworkingV1Api(api)
    table: dict[str, Ops] = {
        "StatefulSet": (
            lambda ns, name: apps.create_namespaced_stateful_set(ns, foreign_statefulset(name)),
            lambda ns, name: apps.read_namespaced_stateful_set(name, ns),
            lambda ns, name: apps.delete_namespaced_stateful_set(name, ns),
        ),
        "Service": (
            lambda ns, name: core.create_namespaced_service(ns, foreign_service(name)),
            lambda ns, name: core.read_namespaced_service(name, ns),
            lambda ns, name: core.delete_namespaced_service(name, ns),
        ),
        "ServiceAccount": (
            lambda ns, name: core.create_namespaced_service_account(
                ns, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name))
            ),
            lambda ns, name: core.read_namespaced_service_account(name, ns),
            lambda ns, name: core.delete_namespaced_service_account(name, ns),
        ),
        "Role": (
            lambda ns, name: rbac.create_namespaced_role(
                ns,
                client.V1Role(
                    metadata=client.V1ObjectMeta(name=name),
                    rules=[
                        client.V1PolicyRule(
                            api_groups=[""], resources=["configmaps"], verbs=["get"]
                        )
                    ],
                ),
            ),
            lambda ns, name: rbac.read_namespaced_role(name, ns),
            lambda ns, name: rbac.delete_namespaced_role(name, ns),
        ),
        "NetworkPolicy": (
            lambda ns, name: net.create_namespaced_network_policy(
                ns,
                client.V1NetworkPolicy(
                    metadata=client.V1ObjectMeta(name=name),
                    spec=client.V1NetworkPolicySpec(
                        pod_selector=client.V1LabelSelector(match_labels=FOREIGN_LABELS)
                    ),
                ),
            ),
            lambda ns, name: net.read_namespaced_network_policy(name, ns),
            lambda ns, name: net.delete_namespaced_network_policy(name, ns),
        ),
    }
    return table[kind]


PREFILL, DECODE = names.role_name("kv", "prefill"), names.role_name("kv", "decode")
SIDECAR = names.sidecar_account_name("kv")
# kind, the child's name for PDDeployment "kv", and what its conflict holds besides it: the
# children that would run against the object holding the name.
CASES = [
    ("StatefulSet", PREFILL, []),
    ("Service", DECODE, [f"StatefulSet {DECODE}"]),
    (
        "ServiceAccount",
        SIDECAR,
        [f"RoleBinding {SIDECAR}", f"StatefulSet {PREFILL}", f"StatefulSet {DECODE}"],
    ),
    (
        "Role",
        SIDECAR,
        [f"RoleBinding {SIDECAR}", f"StatefulSet {PREFILL}", f"StatefulSet {DECODE}"],
    ),
    ("NetworkPolicy", names.network_policy_name("kv"), []),
]


def snapshot(obj: Any) -> tuple[str, Any, Any, Any]:
    """What must not change: version, owners, labels, and the object's content. A workload's
    version is its generation: its own controller writes its status (and so its
    resourceVersion) while its pods come and go."""
    meta = obj.metadata
    content = getattr(obj, "spec", None) or getattr(obj, "rules", None)
    version = meta.generation if meta.generation is not None else meta.resource_version
    return (version, meta.owner_references, meta.labels, content)


def held_message(held: list[str]) -> str:
    if not held:
        return "Held until the name is free (neither created nor changed): that child only"
    return f"that child and what runs against it, {', '.join(held)}; every other child is kept"


def statefulset_or_none(api: client.ApiClient, ns: str, name: str) -> Any:
    try:
        return client.AppsV1Api(api).read_namespaced_stateful_set(name, ns)
    except ApiException as err:
        if err.status == 404:
            return None
        raise


@pytest.mark.parametrize("kind,child,held", CASES, ids=[f"{k} {n}" for k, n, _ in CASES])
def test_an_unowned_object_with_a_childs_name_is_left_alone_and_named(
    operator: OperatorProcess,
    api_client: client.ApiClient,
    namespace: str,
    kind: str,
    child: str,
    held: list[str],
) -> None:
    create, read, _ = ops(api_client, kind)
    create(namespace, child)
    before = snapshot(read(namespace, child))

    create_pdd(api_client, namespace)
    stalled = wait_for(
        lambda: stalled_by_conflict(api_client, namespace), 30, what="Stalled=NameConflict"
    )
    assert stalled["status"] == "True"
    assert f"{kind} {child} (owned by no owner)" in stalled["message"]
    assert held_message(held) in stalled["message"]
    assert conditions(api_client, namespace)["Ready"]["status"] == "False"

    # The workloads that would run against it are not written; the others are.
    for workload in (PREFILL, DECODE):
        if f"StatefulSet {workload}" in held:
            assert statefulset_or_none(api_client, namespace, workload) is None, workload
        elif (kind, child) != ("StatefulSet", workload):
            wait_for_statefulset(api_client, namespace, workload)
    time.sleep(3)  # passes after the first (resyncs every 2 s) leave it alone too
    assert snapshot(read(namespace, child)) == before
    events = client.CoreV1Api(api_client).list_namespaced_event(namespace).items
    assert any(e.reason == "NameConflict" and child in e.message for e in events)

    # Deleting the PDDeployment leaves the object that was never its own.
    client.CustomObjectsApi(api_client).delete_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "kv"
    )
    # A span, not a wait: nothing signals that the deletion's clean-up left the object alone.
    time.sleep(3)
    assert snapshot(read(namespace, child)) == before


def owned_by(obj: Any, uid: str) -> bool:
    refs = obj.metadata.owner_references or []
    return any(r.uid == uid and r.controller for r in refs)


def wait_for_statefulset(api: client.ApiClient, ns: str, name: str) -> Any:
    return wait_for(lambda: statefulset_or_none(api, ns, name), 30, what=f"StatefulSet {name}")


def scaled_by_hand_and_back(api: client.ApiClient, ns: str, scale: Callable[[], None]) -> None:
    """`scale` (a hand `kubectl scale` of the prefill StatefulSet to 4) is undone: replicas
    go back to the spec's."""
    apps = client.AppsV1Api(api)
    wanted = wait_for_statefulset(api, ns, PREFILL).spec.replicas
    assert wanted != 4
    scale()
    wait_for(
        lambda: apps.read_namespaced_stateful_set(PREFILL, ns).spec.replicas == wanted,
        30,
        what=f"{PREFILL} scaled back to {wanted}",
    )


def scale_prefill_to_4(api: client.ApiClient, ns: str) -> None:
    client.AppsV1Api(api).patch_namespaced_stateful_set_scale(
        PREFILL, ns, {"spec": {"replicas": 4}}
    )


def test_a_child_that_lost_its_owner_reference_gets_it_back_and_drift_is_still_undone(
    operator: OperatorProcess, api_client: client.ApiClient, namespace: str
) -> None:
    """What re-applying an exported manifest or a careless `kubectl replace` does: the same
    object without its owner reference. It carries the deployment's labels and the fields the
    operator's field manager applied, so it is the deployment's: the reference is put back
    (a DriftCorrected event says so), and a hand scale of the prefill meanwhile is undone."""
    uid = create_pdd(api_client, namespace)["metadata"]["uid"]
    net = client.NetworkingV1Api(api_client)
    policy = names.network_policy_name("kv")
    wait_for_statefulset(api_client, namespace, PREFILL)
    wait_for(
        lambda: owned_by(net.read_namespaced_network_policy(policy, namespace), uid),
        30,
        what="the NetworkPolicy, the deployment's",
    )

    def strip_and_scale() -> None:
        current = net.read_namespaced_network_policy(policy, namespace)
        current.metadata.owner_references = None
        net.replace_namespaced_network_policy(policy, namespace, current)
        scale_prefill_to_4(api_client, namespace)

    scaled_by_hand_and_back(api_client, namespace, strip_and_scale)

    wait_for(
        lambda: owned_by(net.read_namespaced_network_policy(policy, namespace), uid),
        30,
        what="the owner reference put back",
    )
    (ref,) = net.read_namespaced_network_policy(policy, namespace).metadata.owner_references
    assert (ref.kind, ref.name, ref.uid, ref.controller) == ("PDDeployment", "kv", uid, True)

    def told() -> list[str]:
        events = client.CoreV1Api(api_client).list_namespaced_event(namespace).items
        return [
            e.message
            for e in events
            if e.reason == "DriftCorrected" and f"NetworkPolicy {policy} had lost" in e.message
        ]

    assert "put back" in wait_for(told, 30, what="a DriftCorrected event naming it")[0]
    assert stalled_by_conflict(api_client, namespace) == {}
    events = client.CoreV1Api(api_client).list_namespaced_event(namespace).items
    assert not [e for e in events if e.reason == "NameConflict"]


def test_a_foreign_network_policy_holds_nothing_else_and_drift_is_still_undone(
    operator: OperatorProcess, api_client: client.ApiClient, namespace: str
) -> None:
    """A NetworkPolicy of someone else's (no proof) holds the name: NameConflict names it and
    says it holds nothing else, and a hand scale of the prefill is undone meanwhile."""
    create, read, _ = ops(api_client, "NetworkPolicy")
    policy = names.network_policy_name("kv")
    create(namespace, policy)
    before = snapshot(read(namespace, policy))
    create_pdd(api_client, namespace)
    stalled = wait_for(
        lambda: stalled_by_conflict(api_client, namespace), 30, what="Stalled=NameConflict"
    )
    assert f"NetworkPolicy {policy} (owned by no owner)" in stalled["message"]
    assert held_message([]) in stalled["message"]

    scaled_by_hand_and_back(
        api_client, namespace, lambda: scale_prefill_to_4(api_client, namespace)
    )

    assert snapshot(read(namespace, policy)) == before
    assert stalled_by_conflict(api_client, namespace)["status"] == "True"


def test_the_deployment_resumes_once_the_name_is_free(
    operator: OperatorProcess, api_client: client.ApiClient, namespace: str
) -> None:
    create, read, delete = ops(api_client, "Service")
    child = PREFILL
    create(namespace, child)
    pdd = create_pdd(api_client, namespace)
    wait_for(lambda: stalled_by_conflict(api_client, namespace), 30, what="Stalled=NameConflict")

    delete(namespace, child)

    def ours() -> bool:
        refs = read(namespace, child).metadata.owner_references or []
        return any(r.uid == pdd["metadata"]["uid"] and r.controller for r in refs)

    wait_for(ours, 30, what="the Service created as the deployment's own")
    wait_for(
        lambda: conditions(api_client, namespace)["Ready"]["status"] == "True", 90, what="Ready"
    )
    assert conditions(api_client, namespace)["Stalled"]["status"] == "False"


def test_a_child_name_held_by_another_pddeployment_names_that_deployment(
    operator: OperatorProcess, api_client: client.ApiClient, namespace: str
) -> None:
    """Past the naming scheme (a hash collision, a copied object): the second deployment is
    refused, told whose the name is, and the first one's object is left as it is."""
    first = create_pdd(api_client, namespace, "first")
    owner = client.V1OwnerReference(
        api_version=f"{GROUP}/{VERSION}",
        kind="PDDeployment",
        name="first",
        uid=first["metadata"]["uid"],
        controller=True,
    )
    child = names.role_name("second", "prefill")
    core = client.CoreV1Api(api_client)
    core.create_namespaced_service(namespace, foreign_service(child, [owner]))
    before = snapshot(core.read_namespaced_service(child, namespace))

    create_pdd(api_client, namespace, "second")
    stalled = wait_for(
        lambda: stalled_by_conflict(api_client, namespace, "second"), 30, what="NameConflict"
    )
    assert f"Service {child} (owned by PDDeployment first)" in stalled["message"]
    time.sleep(3)  # a span: the passes after the first (every 2 s) leave it alone too
    assert snapshot(core.read_namespaced_service(child, namespace)) == before
    assert "NameConflict" not in str(conditions(api_client, namespace, "first"))


def test_a_dotted_name_and_its_hashed_twin_get_separate_children(
    operator: OperatorProcess, api_client: client.ApiClient, namespace: str
) -> None:
    twin = names.instance_id("a.b")  # what "a.b"'s children are named after
    uids = {
        name: create_pdd(api_client, namespace, name)["metadata"]["uid"] for name in ("a.b", twin)
    }
    apps = client.AppsV1Api(api_client)

    def owners() -> dict[str, str]:
        found = {}
        for sts in apps.list_namespaced_stateful_set(namespace).items:
            refs = [r for r in sts.metadata.owner_references or [] if r.controller]
            found[sts.metadata.name] = refs[0].uid if refs else ""
        return found

    def four_statefulsets() -> dict[str, str] | None:
        found = owners()
        return found if len(found) == 4 else None

    found = wait_for(four_statefulsets, 30, what="both deployments' StatefulSets")
    assert sorted(found.values()) == sorted([*uids.values(), *uids.values()])
    generations = {
        s.metadata.name: s.metadata.generation
        for s in apps.list_namespaced_stateful_set(namespace).items
    }
    time.sleep(4)  # two resyncs: no fight over a shared child
    again = {
        s.metadata.name: s.metadata.generation
        for s in apps.list_namespaced_stateful_set(namespace).items
    }
    assert again == generations
    for name in uids:
        assert "NameConflict" not in str(conditions(api_client, namespace, name))


def test_a_new_deployments_names_are_looked_up_only_where_nothing_else_guards_them(
    operator: OperatorProcess,
    control_plane: LocalControlPlane,
    api_client: client.ApiClient,
    namespace: str,
) -> None:
    """Under the name-guard policy the operator reads the names of its new workloads only
    (the API server refuses a takeover of the rest); without it, every new child's name."""
    create_pdd(api_client, namespace)
    wait_for(
        lambda: conditions(api_client, namespace).get("Ready", {}).get("status") == "True",
        90,
        what="Ready",
    )

    def looked_up(resource: str) -> list[str]:
        return [
            uri
            for _, uri in control_plane.reads_by(OPERATOR_USER, resource, verbs=("get",))
            if f"/namespaces/{namespace}/" in uri
        ]

    assert looked_up("statefulsets")  # workloads: always looked up before their creation
    for resource in ("services", "serviceaccounts", "roles", "networkpolicies"):
        assert bool(looked_up(resource)) is not guarded(operator), resource
