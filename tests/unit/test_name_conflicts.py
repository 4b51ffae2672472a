"""A child's name held by an object that is not the deployment's: the Reconciler reads whose it
is, holds that child and what runs against it (and nothing else), reports Stalled=NameConflict
naming it and what is held, and resumes once it is gone. A child that lost its owner reference
and carries the proof of being the deployment's gets it back. And the pure ownership rules."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from helpers.factories import BASE_BODY
from helpers.fake_cluster import FakeCluster, reconciler_for
from pdd_operator.api import names
from pdd_operator.reconcile import Reconciler
from pdd_operator.status import ownership
from pdd_operator.status.token import MountFailure

NS = "team-a"
KEY = (NS, "llama")
TOKEN = names.token_secret_name("llama", "uid-llama")


def body(name: str = "llama") -> dict[str, Any]:
    result = copy.deepcopy(BASE_BODY)
    result["metadata"].update(name=name, uid=f"uid-{name}", resourceVersion="1")
    result["spec"]["topology"] = {"placement": "none"}
    return result


def conditions(cluster: FakeCluster, key: tuple[str, str] = KEY) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in cluster.stored[key]["status"]["conditions"]}


def foreign(kind: str, api_version: str, name: str, owners: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"foreign-{name}",
            "resourceVersion": "7",
            "ownerReferences": owners,
        },
        "spec": {"note": "someone else's"},
    }


def reconciler(cluster: FakeCluster) -> Reconciler:
    rec = reconciler_for(cluster)
    rec.conflict_retry_seconds = 3600.0  # the test drives the passes itself
    return rec


NOT_OURS = [
    ("no owner", [], "no owner"),
    (
        "another PDDeployment",
        [{"kind": "PDDeployment", "name": "other", "uid": "uid-other", "controller": True}],
        "PDDeployment other",
    ),
    (
        "a Deployment",
        [{"kind": "Deployment", "name": "web", "uid": "u-web", "controller": True}],
        "Deployment web",
    ),
    (
        # Named like this deployment but another object (a deleted namesake's uid).
        "a namesake's old uid",
        [{"kind": "PDDeployment", "name": "llama", "uid": "uid-old", "controller": True}],
        "PDDeployment llama",
    ),
    (
        "ours but not as controller",
        [{"kind": "PDDeployment", "name": "llama", "uid": "uid-llama", "controller": False}],
        "PDDeployment llama",
    ),
]
TAKEN = [
    ("StatefulSet", "apps/v1", "llama-prefill"),
    ("Service", "v1", "llama-decode"),
    ("ServiceAccount", "v1", "llama-sidecar"),
    ("Role", "rbac.authorization.k8s.io/v1", "llama-router"),
    ("NetworkPolicy", "networking.k8s.io/v1", "llama-kv-transfer"),
    ("Deployment", "apps/v1", "llama-router"),
    ("PodDisruptionBudget", "policy/v1", "llama-decode"),
]


# What a taken name holds besides its own child: what would run against the object holding
# it (rendering.dependencies), in apply order.
HELD = {
    "StatefulSet llama-prefill": [],
    "Service llama-decode": ["StatefulSet llama-decode", "Deployment llama-router"],
    "ServiceAccount llama-sidecar": [
        "RoleBinding llama-sidecar",
        "StatefulSet llama-prefill",
        "StatefulSet llama-decode",
    ],
    "Role llama-router": ["RoleBinding llama-router", "Deployment llama-router"],
    "NetworkPolicy llama-kv-transfer": [],
    "Deployment llama-router": [],
    "PodDisruptionBudget llama-decode": [],
}


async def applied_children(cluster: FakeCluster) -> set[tuple[str, str]]:
    """(kind, name) of every child a first pass applies."""
    await reconciler(cluster).reconcile(KEY)
    return {(kind, name) for verb, kind, name in cluster.writes if verb == "apply"}


def held_message(held: list[str]) -> str:
    if not held:
        return "Held until the name is free (neither created nor changed): that child only"
    return f"that child and what runs against it, {', '.join(held)}; every other child is kept"


@pytest.mark.parametrize("kind,api_version,name", TAKEN, ids=[f"{k} {n}" for k, _, n in TAKEN])
@pytest.mark.parametrize(
    "owners,holder", [(o, h) for _, o, h in NOT_OURS], ids=[i for i, _, _ in NOT_OURS]
)
async def test_a_taken_name_holds_its_child_and_what_runs_against_it_and_nothing_else(
    kind: str, api_version: str, name: str, owners: list[dict[str, Any]], holder: str
) -> None:
    everything = await applied_children(FakeCluster(body()))
    cluster = FakeCluster(body())
    theirs = foreign(kind, api_version, name, owners)
    cluster.objects[(NS, api_version, kind, name)] = copy.deepcopy(theirs)

    await reconciler(cluster).reconcile(KEY)

    held = HELD[f"{kind} {name}"]
    not_written = {(kind, name), *(tuple(h.split(" ", 1)) for h in held)}
    assert {(k, n) for verb, k, n in cluster.writes if verb == "apply"} == everything - not_written
    assert cluster.objects[(NS, api_version, kind, name)] == theirs
    stalled = conditions(cluster)["Stalled"]
    assert (stalled["status"], stalled["reason"]) == ("True", "NameConflict")
    assert f"{kind} {name} (owned by {holder})" in stalled["message"]
    assert held_message(held) in stalled["message"]
    assert conditions(cluster)["Ready"]["status"] == "False"
    assert ("Warning", "NameConflict", stalled["message"]) in cluster.events


def service_taken() -> tuple[FakeCluster, Reconciler, tuple[str, str, str, str]]:
    """A deployment whose prefill Service name an object of someone else's holds."""
    cluster = FakeCluster(body())
    where = (NS, "v1", "Service", "llama-prefill")
    cluster.objects[where] = foreign("Service", "v1", "llama-prefill", [])
    return cluster, reconciler(cluster), where


async def test_the_deployment_resumes_once_the_name_is_free() -> None:
    cluster, rec, where = service_taken()
    await rec.reconcile(KEY)
    assert conditions(cluster)["Stalled"]["reason"] == "NameConflict"

    del cluster.objects[where]
    await rec.reconcile(KEY)
    assert cluster.objects[where]["metadata"]["ownerReferences"][0]["uid"] == "uid-llama"
    assert conditions(cluster)["Stalled"]["status"] == "False"


async def test_a_settled_deployment_reads_nothing_to_check_names() -> None:
    cluster = FakeCluster(body())
    rec = reconciler(cluster)
    await rec.reconcile(KEY)
    first = len(cluster.reads)
    assert first > 0  # every new child's name was looked up once
    cluster.workloads_ready(NS)  # no StatefulSet short of pods: no Events to read either
    await rec.reconcile(KEY)
    assert len(cluster.reads) == first  # children listed as its own need no look-up


async def test_a_new_deployments_token_secret_is_created_once_without_a_look() -> None:
    cluster, rec, where = service_taken()
    await rec.reconcile(KEY)
    await rec.reconcile(KEY)  # still held back by the name conflict
    del cluster.objects[where]
    await rec.reconcile(KEY)

    assert [r for r in cluster.reads if r[0] == "Secret"] == []
    assert [w for w in cluster.writes if w[1] == "Secret"] == [("create", "Secret", TOKEN)]


async def test_a_token_secret_reported_missing_after_a_restart_is_created_while_held_back() -> None:
    """An operator restarted (its children listed) takes the Secret for there, asking
    nothing; once a pod reports it cannot mount it, it is created in the next pass (its name
    carries the deployment's uid, so a name conflict elsewhere does not hold it), never read."""
    cluster, rec, where = service_taken()
    del cluster.objects[where]
    await rec.reconcile(KEY)  # children and Secret created
    restarted = reconciler(cluster)
    del cluster.objects[(NS, "v1", "Secret", TOKEN)]
    cluster.objects[where] = foreign("Service", "v1", "llama-prefill", [])
    await restarted.reconcile(KEY)
    assert [w for w in cluster.writes if w[1] == "Secret"] == [("create", "Secret", TOKEN)]

    message = f'MountVolume.SetUp failed for volume "sidecar-token" : secret "{TOKEN}" not found'
    report = MountFailure("llama-decode-0", "2026-12-05T10:00:00Z", message, "e/1")
    cluster.mount_reports[(NS, TOKEN)] = [report]
    await restarted.reconcile(KEY)  # held back by the name conflict
    assert (NS, "v1", "Secret", TOKEN) in cluster.objects
    assert [r for r in cluster.reads if r[0] == "Secret"] == []
    assert [w for w in cluster.writes if w[1] == "Secret"] == [("create", "Secret", TOKEN)] * 2


async def test_two_deployments_whose_names_would_collide_do_not_share_a_child() -> None:
    """`a.b` hashes to `a-b-<8 hex>`; a deployment named exactly that is hashed too."""
    from pdd_operator.api import names

    twin = names.instance_id("a.b")
    cluster = FakeCluster(body("a.b"), body(twin))
    rec = reconciler(cluster)
    await rec.reconcile((NS, "a.b"))
    await rec.reconcile((NS, twin))
    owners: dict[str, set[str]] = {}
    for (_, _, kind, name), live in cluster.objects.items():
        refs = live["metadata"].get("ownerReferences") or []
        owners.setdefault(f"{kind}/{name}", set()).update(r["uid"] for r in refs)
    assert all(len(uids) == 1 for uids in owners.values()), owners
    for key in ((NS, "a.b"), (NS, twin)):
        assert conditions(cluster, key)["Stalled"]["status"] == "False"


async def test_a_child_taken_by_another_deployment_names_that_deployment() -> None:
    """Past the naming scheme (a 32-bit hash collision, or an object copied by hand), the
    second deployment is refused and told whose the name is."""
    cluster = FakeCluster(body("first"))
    await reconciler(cluster).reconcile((NS, "first"))
    second = body("second")
    cluster.add(second)
    # Its StatefulSet's name is held by the first deployment's (as if the ids collided).
    stolen = copy.deepcopy(cluster.objects[(NS, "apps/v1", "StatefulSet", "first-prefill")])
    stolen["metadata"]["name"] = "second-prefill"
    cluster.objects[(NS, "apps/v1", "StatefulSet", "second-prefill")] = stolen
    before = len(cluster.writes)

    await reconciler(cluster).reconcile((NS, "second"))

    applied = {(k, n) for verb, k, n in cluster.writes[before:] if verb == "apply"}
    assert ("StatefulSet", "second-prefill") not in applied
    assert ("StatefulSet", "second-decode") in applied  # nothing of it runs against prefill's
    assert cluster.objects[(NS, "apps/v1", "StatefulSet", "second-prefill")] == stolen
    message = conditions(cluster, (NS, "second"))["Stalled"]["message"]
    assert "StatefulSet second-prefill (owned by PDDeployment first)" in message


async def test_a_stale_child_replaced_by_someone_elses_object_is_not_deleted() -> None:
    cluster = FakeCluster(body())
    rec = reconciler(cluster)
    await rec.reconcile(KEY)
    router = (NS, "apps/v1", "Deployment", "llama-router")
    assert router in cluster.objects
    # The router is switched off; meanwhile its Deployment was replaced by someone else's
    # object of the same name, which the index has not seen yet.
    index_copy = copy.deepcopy(cluster.objects[router])
    cluster.index_copy(NS, index_copy)
    cluster.index_lag.add(router[1:])
    replacement = foreign("Deployment", "apps/v1", "llama-router", [])
    cluster.objects[router] = copy.deepcopy(replacement)
    replacement_with_ref = copy.deepcopy(replacement)
    replacement_with_ref["metadata"]["ownerReferences"] = index_copy["metadata"]["ownerReferences"]
    cluster.objects[router]["metadata"]["ownerReferences"] = index_copy["metadata"][
        "ownerReferences"
    ]
    cluster.update_spec(KEY, {"router": {"enabled": False}})

    await rec.reconcile(KEY)

    assert ("delete", "Deployment", "llama-router") in cluster.writes
    assert cluster.objects[router] == replacement_with_ref  # the uid precondition held it


@pytest.mark.parametrize(
    "owners,expected",
    [
        ([], "no owner"),
        ([{"kind": "ReplicaSet", "name": "rs", "uid": "1"}], "ReplicaSet rs"),
        (
            [
                {"kind": "ConfigMap", "name": "cm", "uid": "1"},
                {"kind": "Deployment", "name": "d", "uid": "2", "controller": True},
            ],
            "Deployment d",
        ),
    ],
)
def test_holder_names_the_controller_else_the_first_owner(
    owners: list[dict[str, Any]], expected: str
) -> None:
    assert ownership.holder(owners) == expected


def test_an_object_controlled_by_this_uid_is_no_conflict() -> None:
    ref = {"kind": "PDDeployment", "name": "x", "uid": "u1", "controller": True}
    assert ownership.name_conflict("Service", "x-prefill", [ref], "u1") is None
    conflict = ownership.name_conflict("Service", "x-prefill", [ref], "u2")
    assert conflict == ownership.NameConflict("Service", "x-prefill", "PDDeployment x")


@pytest.mark.parametrize(
    "conflicts,held,says",
    [
        (
            [ownership.NameConflict("NetworkPolicy", "a", "no owner")],
            [],
            "Held until the name is free (neither created nor changed): that child only "
            "(nothing runs against it); every other child is kept as the spec says",
        ),
        (
            [ownership.NameConflict("Service", "a", "no owner")],
            ["StatefulSet a"],
            "Held until the name is free (neither created nor changed): that child and what "
            "runs against it, StatefulSet a; every other child is kept as the spec says",
        ),
        (
            [
                ownership.NameConflict("Service", "a", "no owner"),
                ownership.NameConflict("Role", "b", "PDDeployment c"),
            ],
            ["StatefulSet a", "RoleBinding b"],
            "Service a (owned by no owner); Role b (owned by PDDeployment c). The operator does "
            "not take over, change or delete it. Held until the name is free (neither created "
            "nor changed): those children and what runs against them, StatefulSet a, "
            "RoleBinding b;",
        ),
    ],
    ids=["holds nothing else", "holds a workload", "two conflicts"],
)
def test_the_message_lists_every_conflict_what_is_held_and_the_fix(
    conflicts: list[ownership.NameConflict], held: list[str], says: str
) -> None:
    message = ownership.conflict_message(conflicts, held)
    assert says in message
    assert "delete or rename that object, or rename this PDDeployment" in message


async def test_a_conflict_is_looked_at_again_by_itself_with_backoff() -> None:
    """The object holding the name is not watched: the reconciler schedules its own passes,
    each later than the one before, and the one after the name is freed applies the child."""
    import asyncio

    cluster = FakeCluster(body())
    rec = reconciler_for(cluster)
    rec.conflict_retry_seconds = 0.05
    where = (NS, "v1", "ServiceAccount", "llama-sidecar")
    cluster.objects[where] = foreign("ServiceAccount", "v1", "llama-sidecar", [])
    await rec.reconcile(KEY)
    await asyncio.sleep(0.4)  # 0.05 + 0.1 + 0.2: three more passes, no more
    looked = [r for r in cluster.reads if r == ("ServiceAccount", "llama-sidecar")]
    assert 3 <= len(looked) <= 4, looked

    del cluster.objects[where]
    await asyncio.sleep(1.0)
    assert cluster.objects[where]["metadata"]["ownerReferences"][0]["uid"] == "uid-llama"
    assert conditions(cluster)["Stalled"]["status"] == "False"
    reads = len(cluster.reads)
    await asyncio.sleep(0.5)
    assert len(cluster.reads) == reads  # resolved: no more passes of its own


# ------------------------------------------------------- with the name-guard policy in force


GUARDED_TAKEN = [t for t in TAKEN if t[0] not in ("StatefulSet", "Deployment")]


@pytest.mark.parametrize(
    "kind,api_version,name", GUARDED_TAKEN, ids=[f"{k} {n}" for k, _, n in GUARDED_TAKEN]
)
async def test_under_the_name_guard_a_refused_apply_is_named_and_holds_what_runs_against_it(
    kind: str, api_version: str, name: str
) -> None:
    """The API server refuses the takeover (the policy); the operator reads whose the
    object is to name it, and applies none of the workloads that would run against it."""
    everything = await applied_children(FakeCluster(body(), name_guard=True))
    cluster = FakeCluster(body(), name_guard=True)
    owners = [{"kind": "Deployment", "name": "web", "uid": "u-web", "controller": True}]
    theirs = foreign(kind, api_version, name, owners)
    cluster.objects[(NS, api_version, kind, name)] = copy.deepcopy(theirs)

    await reconciler(cluster).reconcile(KEY)

    assert cluster.objects[(NS, api_version, kind, name)] == theirs
    held = HELD[f"{kind} {name}"]
    not_written = {(kind, name), *(tuple(h.split(" ", 1)) for h in held)}
    applied = {(k, n) for verb, k, n in cluster.writes if verb == "apply"}
    assert applied == everything - not_written | {(kind, name)}  # its own apply: refused
    stalled = conditions(cluster)["Stalled"]
    assert (stalled["status"], stalled["reason"]) == ("True", "NameConflict")
    assert f"{kind} {name} (owned by Deployment web)" in stalled["message"]
    assert held_message(held) in stalled["message"]
    assert (kind, name) in cluster.reads  # looked up after the refusal, to name the holder


async def test_under_the_name_guard_only_workloads_are_looked_up_before_their_apply() -> None:
    cluster = FakeCluster(body(), name_guard=True)
    await reconciler(cluster).reconcile(KEY)

    workloads = {(k, n) for k, n, _ in cluster.applies if k in ("StatefulSet", "Deployment")}
    assert workloads  # the deployment's StatefulSets and router
    assert set(cluster.reads) == workloads
    assert conditions(cluster)["Stalled"]["status"] == "False"


async def test_under_the_name_guard_a_taken_workload_name_holds_that_workload_only() -> None:
    """Workloads are still looked up first; a taken StatefulSet name holds that StatefulSet,
    and its sibling and the router, which do not run against it, are applied."""
    cluster = FakeCluster(body(), name_guard=True)
    theirs = foreign("StatefulSet", "apps/v1", "llama-prefill", [])
    cluster.objects[(NS, "apps/v1", "StatefulSet", "llama-prefill")] = copy.deepcopy(theirs)

    await reconciler(cluster).reconcile(KEY)

    assert cluster.objects[(NS, "apps/v1", "StatefulSet", "llama-prefill")] == theirs
    workloads = {w for w in cluster.writes if w[1] in ("StatefulSet", "Deployment")}
    assert workloads == {
        ("apply", "StatefulSet", "llama-decode"),
        ("apply", "Deployment", "llama-router"),
    }
    message = conditions(cluster)["Stalled"]["message"]
    assert "StatefulSet llama-prefill (owned by no owner)" in message
    assert held_message([]) in message


async def test_under_the_name_guard_a_settled_deployment_applies_its_own_children() -> None:
    """Its own objects pass the policy: a changed spec is applied as usual."""
    cluster = FakeCluster(body(), name_guard=True)
    rec = reconciler(cluster)
    await rec.reconcile(KEY)
    changed = copy.deepcopy(cluster.stored[KEY])
    changed["spec"]["decode"]["replicas"] = 3
    changed["metadata"]["generation"] = 2
    cluster.add(changed)
    before = len(cluster.writes)
    await rec.reconcile(KEY)

    assert ("apply", "StatefulSet", "llama-decode") in cluster.writes[before:]
    assert conditions(cluster)["Stalled"]["status"] == "False"


# ------------------------------------------------ a child that lost its owner reference


NETWORK_POLICY = (NS, "networking.k8s.io/v1", "NetworkPolicy", "llama-kv-transfer")
PREFILL = (NS, "apps/v1", "StatefulSet", "llama-prefill")


def strip_owner(cluster: FakeCluster, where: tuple[str, str, str, str]) -> None:
    """What a `kubectl replace` of an exported manifest does: the same object, no owner."""
    cluster.objects[where]["metadata"]["ownerReferences"] = []
    cluster.objects[where]["metadata"]["resourceVersion"] = cluster.next_version()


def scale_by_hand(cluster: FakeCluster, replicas: int) -> None:
    cluster.objects[PREFILL]["spec"]["replicas"] = replicas
    cluster.objects[PREFILL]["metadata"]["resourceVersion"] = cluster.next_version()


@pytest.mark.parametrize("guard", [False, True], ids=["looked up", "name guard"])
async def test_a_child_that_lost_its_owner_reference_gets_it_back_with_an_event(
    guard: bool,
) -> None:
    cluster = FakeCluster(body(), name_guard=guard)
    rec = reconciler(cluster)
    await rec.reconcile(KEY)
    wanted = cluster.objects[PREFILL]["spec"]["replicas"]
    strip_owner(cluster, NETWORK_POLICY)
    scale_by_hand(cluster, 4)  # meanwhile: undone too

    await rec.reconcile(KEY)

    refs = cluster.objects[NETWORK_POLICY]["metadata"]["ownerReferences"]
    assert [(r["uid"], r["controller"]) for r in refs] == [("uid-llama", True)]
    assert cluster.objects[PREFILL]["spec"]["replicas"] == wanted
    message = ownership.adoption_message("NetworkPolicy", "llama-kv-transfer")
    assert ("Normal", "DriftCorrected", message) in cluster.events
    assert conditions(cluster)["Stalled"]["status"] == "False"
    assert ("NetworkPolicy", "llama-kv-transfer") in cluster.reads  # the proof was read


def without_proof(change: str) -> Any:
    def spoil(meta: dict[str, Any]) -> None:
        if change == "no deployment label":
            del meta["labels"][names.LABEL_DEPLOYMENT]
        elif change == "another deployment's name":
            meta["annotations"][names.ANNOTATION_OWNER_NAME] = "other"
        elif change == "applied by another manager":
            meta["managedFields"][0]["manager"] = "kubectl"
        elif change == "written by an update":
            meta["managedFields"][0]["operation"] = "Update"
        elif change == "another controller":
            meta["ownerReferences"] = [
                {"kind": "Deployment", "name": "web", "uid": "u-web", "controller": True}
            ]

    return spoil


SPOILED = [
    "no deployment label",
    "another deployment's name",
    "applied by another manager",
    "written by an update",
    "another controller",
]


@pytest.mark.parametrize("guard", [False, True], ids=["looked up", "name guard"])
@pytest.mark.parametrize("change", SPOILED)
async def test_an_unowned_copy_without_the_whole_proof_is_a_conflict(
    guard: bool, change: str
) -> None:
    cluster = FakeCluster(body(), name_guard=guard)
    rec = reconciler(cluster)
    await rec.reconcile(KEY)
    strip_owner(cluster, NETWORK_POLICY)
    without_proof(change)(cluster.objects[NETWORK_POLICY]["metadata"])
    theirs = copy.deepcopy(cluster.objects[NETWORK_POLICY])
    scale_by_hand(cluster, 4)

    await rec.reconcile(KEY)

    assert cluster.objects[NETWORK_POLICY] == theirs
    stalled = conditions(cluster)["Stalled"]
    assert (stalled["status"], stalled["reason"]) == ("True", "NameConflict")
    assert "NetworkPolicy llama-kv-transfer (owned by" in stalled["message"]
    assert held_message([]) in stalled["message"]
    assert not [e for e in cluster.events if e[1] == "DriftCorrected" and "lost" in e[2]]
    # The NetworkPolicy holds nothing else: the hand scale of the prefill is undone.
    assert cluster.objects[PREFILL]["spec"]["replicas"] != 4


def applied_meta(**changes: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "labels": {names.LABEL_DEPLOYMENT: names.instance_id("llama")},
        "annotations": {names.ANNOTATION_OWNER_NAME: "llama"},
        "managedFields": [{"manager": "pdd-operator", "operation": "Apply"}],
        "ownerReferences": [],
    }
    meta.update(changes)
    return meta


@pytest.mark.parametrize(
    "meta,adoptable",
    [
        (applied_meta(), True),
        (applied_meta(ownerReferences=None), True),
        (
            applied_meta(
                managedFields=[
                    {"manager": "kubectl-replace", "operation": "Update"},
                    {"manager": "pdd-operator", "operation": "Apply"},
                ]
            ),
            True,
        ),
        (applied_meta(ownerReferences=[{"kind": "ConfigMap", "name": "c", "uid": "1"}]), True),
        (
            applied_meta(
                ownerReferences=[
                    {"kind": "PDDeployment", "name": "llama", "uid": "old", "controller": True}
                ]
            ),
            False,
        ),
        (applied_meta(labels={}), False),
        (applied_meta(labels={names.LABEL_DEPLOYMENT: "llama-1234abcd"}), False),
        (applied_meta(annotations={}), False),
        (applied_meta(annotations={names.ANNOTATION_OWNER_NAME: "other"}), False),
        (applied_meta(managedFields=[]), False),
        (applied_meta(managedFields=[{"manager": "pdd-operator", "operation": "Update"}]), False),
        (applied_meta(managedFields=[{"manager": "helm", "operation": "Apply"}]), False),
    ],
    ids=[
        "label, annotation, operator's apply",
        "no owner references at all",
        "replaced by hand since",
        "a non-controller owner",
        "a controller (a namesake's uid)",
        "no deployment label",
        "another deployment's label",
        "no name annotation",
        "another deployment's name",
        "no managed fields",
        "the operator's manager by update",
        "another manager's apply",
    ],
)
def test_an_unowned_object_is_the_deployments_only_with_the_whole_proof(
    meta: dict[str, Any], adoptable: bool
) -> None:
    assert ownership.adoptable(meta, "llama", "pdd-operator") is adoptable
