"""A child's name held by an object that is not the deployment's: the Reconciler reads whose it
is, writes nothing, reports Stalled=NameConflict naming it, and resumes once it is gone; and
the pure ownership rules it uses."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from helpers.factories import BASE_BODY
from helpers.fake_cluster import FakeCluster, reconciler_for
from pdd_operator.api import names
from pdd_operator.reconcile import Reconciler
from pdd_operator.status import ownership

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


@pytest.mark.parametrize("kind,api_version,name", TAKEN, ids=[f"{k} {n}" for k, _, n in TAKEN])
@pytest.mark.parametrize(
    "owners,holder", [(o, h) for _, o, h in NOT_OURS], ids=[i for i, _, _ in NOT_OURS]
)
async def test_a_taken_name_stops_every_child_write_and_is_named_in_stalled(
    kind: str, api_version: str, name: str, owners: list[dict[str, Any]], holder: str
) -> None:
    cluster = FakeCluster(body())
    theirs = foreign(kind, api_version, name, owners)
    cluster.objects[(NS, api_version, kind, name)] = copy.deepcopy(theirs)

    await reconciler(cluster).reconcile(KEY)

    # Only its own sidecar token Secret (created first, named after its uid) was written.
    assert [w for w in cluster.writes if w[0] != "status"] == [("create", "Secret", TOKEN)]
    assert cluster.objects[(NS, api_version, kind, name)] == theirs
    stalled = conditions(cluster)["Stalled"]
    assert (stalled["status"], stalled["reason"]) == ("True", "NameConflict")
    assert f"{kind} {name} (owned by {holder})" in stalled["message"]
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


async def test_a_token_secret_missing_at_a_look_is_created_even_while_held_back() -> None:
    """Past a new deployment's first pass (an operator restarted, its children listed), the
    Secret is looked at; found missing, it is created in that pass, before any child (its
    name carries the deployment's uid, so a name conflict elsewhere does not hold it), and
    not looked at again."""
    cluster, rec, where = service_taken()
    del cluster.objects[where]
    await rec.reconcile(KEY)  # children and Secret created
    restarted = reconciler(cluster)
    del cluster.objects[(NS, "v1", "Secret", TOKEN)]
    cluster.objects[where] = foreign("Service", "v1", "llama-prefill", [])
    await restarted.reconcile(KEY)
    await restarted.reconcile(KEY)  # held back by the name conflict

    assert (NS, "v1", "Secret", TOKEN) in cluster.objects
    assert [r for r in cluster.reads if r[0] == "Secret"] == [("Secret", TOKEN)]
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

    token = names.token_secret_name("second", "uid-second")
    assert [w for w in cluster.writes[before:] if w[0] != "status"] == [("create", "Secret", token)]
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


def test_the_message_lists_every_conflict_and_the_fix() -> None:
    message = ownership.conflict_message(
        [
            ownership.NameConflict("Service", "a", "no owner"),
            ownership.NameConflict("Role", "b", "PDDeployment c"),
        ]
    )
    assert "Service a (owned by no owner); Role b (owned by PDDeployment c)" in message
    assert "delete or rename that object" in message and "resumes" in message


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
async def test_under_the_name_guard_a_refused_apply_is_named_and_no_workload_written(
    kind: str, api_version: str, name: str
) -> None:
    """The API server refuses the takeover (the policy); the operator reads whose the
    object is to name it, and applies no workload: no pod runs against that object."""
    cluster = FakeCluster(body(), name_guard=True)
    owners = [{"kind": "Deployment", "name": "web", "uid": "u-web", "controller": True}]
    theirs = foreign(kind, api_version, name, owners)
    cluster.objects[(NS, api_version, kind, name)] = copy.deepcopy(theirs)

    await reconciler(cluster).reconcile(KEY)

    assert cluster.objects[(NS, api_version, kind, name)] == theirs
    assert not [w for w in cluster.writes if w[1] in ("StatefulSet", "Deployment")]
    stalled = conditions(cluster)["Stalled"]
    assert (stalled["status"], stalled["reason"]) == ("True", "NameConflict")
    assert f"{kind} {name} (owned by Deployment web)" in stalled["message"]
    assert (kind, name) in cluster.reads  # looked up after the refusal, to name the holder


async def test_under_the_name_guard_only_workloads_are_looked_up_before_their_apply() -> None:
    cluster = FakeCluster(body(), name_guard=True)
    await reconciler(cluster).reconcile(KEY)

    workloads = {(k, n) for k, n, _ in cluster.applies if k in ("StatefulSet", "Deployment")}
    assert workloads  # the deployment's StatefulSets and router
    assert set(cluster.reads) == workloads
    assert conditions(cluster)["Stalled"]["status"] == "False"


async def test_under_the_name_guard_a_taken_workload_name_stops_every_workload() -> None:
    """Workloads are still looked up first: a taken StatefulSet name stops its sibling too."""
    cluster = FakeCluster(body(), name_guard=True)
    theirs = foreign("StatefulSet", "apps/v1", "llama-prefill", [])
    cluster.objects[(NS, "apps/v1", "StatefulSet", "llama-prefill")] = copy.deepcopy(theirs)

    await reconciler(cluster).reconcile(KEY)

    assert cluster.objects[(NS, "apps/v1", "StatefulSet", "llama-prefill")] == theirs
    assert not [w for w in cluster.writes if w[1] in ("StatefulSet", "Deployment")]
    assert (
        "StatefulSet llama-prefill (owned by no owner)" in conditions(cluster)["Stalled"]["message"]
    )


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
