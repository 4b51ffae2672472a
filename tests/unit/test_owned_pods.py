"""A deployment's children and pods are found by owner uid (informers.view over the stores),
never by labels or annotations that another object can copy."""

from __future__ import annotations

import copy
from typing import Any

from pdd_operator.api import names
from pdd_operator.informers.owned import OwnedObjects, owned_collections
from pdd_operator.informers.view import IndexView
from pdd_operator.status.own_writes import OwnObjectWrites

Body = dict[str, Any]

NS = "team-a"
KEY = (NS, "kv")
LABELS = {"app.kubernetes.io/managed-by": "pdd-operator", "pdd.dev/role": "prefill"}
COPIED = {names.ANNOTATION_OWNER_NAME: "kv"}  # what a pod of someone else's may copy


def ref(kind: str, name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": "x/v1", "kind": kind, "name": name, "uid": uid, "controller": True}


def child(kind: str, name: str, uid: str, owner_uid: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": uid,
            "labels": LABELS,
            "ownerReferences": [ref("PDDeployment", "kv", owner_uid)],
        },
        "spec": {"replicas": 1},
    }


def pod(name: str, *owners: dict[str, Any]) -> dict[str, Any]:
    meta = {"name": name, "namespace": NS, "uid": f"uid-{name}", "labels": LABELS}
    meta |= {"annotations": COPIED, "ownerReferences": list(owners)}
    return {"metadata": meta, "spec": {}, "status": {}}


def replicaset(uid: str, deployment_uid: str) -> dict[str, Any]:
    meta = {"name": uid, "namespace": NS, "uid": uid, "labels": LABELS}
    return {"metadata": meta | {"ownerReferences": [ref("Deployment", "d", deployment_uid)]}}


def view(children: list[Body], pods: list[Body], sets: dict[str, str]) -> IndexView:
    """The stores as the informers fill them (informers/owned.py), from these bodies."""
    owned = OwnedObjects()
    for collection in owned_collections(owned, (), "pdd-operator", None):
        plural = collection.path.rsplit("/", 1)[-1]
        found = {
            "statefulsets": [c for c in children if c["kind"] == "StatefulSet"],
            "deployments": [c for c in children if c["kind"] == "Deployment"],
            "replicasets": [replicaset(rs, owner) for rs, owner in sets.items()],
            "pods": pods,
        }
        collection.sink.reset(found.get(plural, []))
    body = {"metadata": {"name": "kv", "namespace": NS, "uid": "uid-kv"}}
    return IndexView({KEY: body}, owned)


def test_pods_of_the_deployments_statefulsets_and_router_replicasets_are_its_own() -> None:
    children = [
        child("StatefulSet", "kv-prefill", "uid-sts", "uid-kv"),
        child("Deployment", "kv-router", "uid-dep", "uid-kv"),
    ]
    pods = [
        pod("kv-prefill-0", ref("StatefulSet", "kv-prefill", "uid-sts")),
        pod("kv-router-abc", ref("ReplicaSet", "kv-router-1", "uid-rs")),
        pod("copycat", ref("ReplicaSet", "theirs", "uid-theirs")),  # labels copied
        pod("bare"),  # no owner at all: never indexed
    ]
    found = view(children, pods, {"uid-rs": "uid-dep", "uid-theirs": "uid-their-dep"}).pods(KEY)
    assert sorted(p.name for p in found) == ["kv-prefill-0", "kv-router-abc"]


def test_a_child_naming_the_deployment_but_not_its_uid_and_its_pods_are_not_its() -> None:
    # A namesake's StatefulSet: the same PDDeployment name in its owner reference, another uid
    # (a deleted deployment's leftover, or one written by hand).
    children = [
        child("StatefulSet", "kv-prefill", "uid-sts", "uid-kv"),
        child("StatefulSet", "kv-decode", "uid-other-sts", "uid-someone-else"),
    ]
    pods = [
        pod("kv-prefill-0", ref("StatefulSet", "kv-prefill", "uid-sts")),
        pod("kv-decode-0", ref("StatefulSet", "kv-decode", "uid-other-sts")),
    ]
    v = view(children, pods, {})
    assert [k[2] for k in v.children(KEY)] == ["kv-prefill"]
    assert [p.name for p in v.pods(KEY)] == ["kv-prefill-0"]


def test_a_child_that_lost_its_owner_reference_is_listed_apart_and_asks_for_a_pass() -> None:
    """Not its child any more (no uid names it), but the watch still sees it under the name in
    its annotation: a pass looks at whether it is the deployment's (ownership.adoptable)."""
    asked: list[tuple[tuple[str, str], str]] = []
    owned = OwnedObjects()
    collections = owned_collections(owned, (), "pdd-operator", lambda k, c: asked.append((k, c)))
    sets = next(c.sink for c in collections if c.path.endswith("/statefulsets"))
    prefill = child("StatefulSet", "kv-prefill", "uid-sts", "uid-kv")
    prefill["metadata"]["annotations"] = COPIED
    decode = child("StatefulSet", "kv-decode", "uid-decode", "uid-kv")
    sets.reset([prefill, decode])
    stripped = copy.deepcopy(prefill)
    stripped["metadata"]["ownerReferences"] = []
    sets.apply("MODIFIED", stripped)
    theirs = child("StatefulSet", "kv-router", "uid-theirs", "uid-kv")
    theirs["metadata"] |= {"annotations": COPIED, "ownerReferences": [ref("Deployment", "w", "u")]}
    sets.apply("ADDED", theirs)  # another controller's: not listed at all

    v = IndexView({KEY: {"metadata": {"name": "kv", "namespace": NS, "uid": "uid-kv"}}}, owned)
    assert [k[2] for k in v.children(KEY)] == ["kv-decode"]
    assert v.unowned_children(KEY) == {("apps/v1", "StatefulSet", "kv-prefill")}
    assert asked == [(KEY, "statefulsets")]


def test_a_pass_is_asked_for_only_when_a_summary_changes_and_names_the_kind() -> None:
    asked: list[tuple[tuple[str, str], str]] = []
    owned = OwnedObjects()
    collections = owned_collections(owned, (), "pdd-operator", lambda k, c: asked.append((k, c)))
    pods = next(c.sink for c in collections if c.path.endswith("/pods"))
    owner = ref("StatefulSet", "kv-prefill", "uid-sts")
    pods.reset([pod("kv-prefill-0", owner)])
    assert asked == []  # the first list: every deployment gets a pass at start anyway
    moved = pod("kv-prefill-0", owner)
    moved["metadata"]["resourceVersion"] = "7"
    moved["status"] = {"phase": "Running", "podIP": "10.0.0.7"}
    pods.apply("MODIFIED", moved)
    assert asked == []  # started, given an IP: nothing a pass reads
    ready = pod("kv-prefill-0", owner)
    ready["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
    pods.apply("MODIFIED", ready)
    assert asked == [(KEY, "pods")]


def test_the_fleet_is_told_each_pod_summary_that_changed_and_each_pod_gone() -> None:
    told: list[tuple[str, str | None, tuple[str, str] | None]] = []
    owned = OwnedObjects()

    def on_pod(uid: str, summary: Any, key: tuple[str, str] | None) -> None:
        told.append((uid, summary.node if summary else None, key))

    collections = owned_collections(owned, (), "pdd-operator", None, on_pod)
    pods = next(c.sink for c in collections if c.path.endswith("/pods"))
    owner = ref("StatefulSet", "kv-prefill", "uid-sts")
    pods.reset([pod("kv-prefill-0", owner), pod("kv-prefill-1", owner)])
    bound = pod("kv-prefill-0", owner)
    bound["spec"] = {"nodeName": "n1"}
    pods.apply("MODIFIED", bound)
    pods.apply("MODIFIED", bound)  # the same summary: nothing to tell
    pods.reset([bound])  # kv-prefill-1 went while no watch ran
    assert told == [
        ("uid-kv-prefill-0", "", KEY),
        ("uid-kv-prefill-1", "", KEY),
        ("uid-kv-prefill-0", "n1", KEY),
        ("uid-kv-prefill-1", None, None),
    ]


Asked = list[tuple[tuple[str, str], str]]


def stores_with_echoes() -> tuple[OwnObjectWrites, Asked, dict[str, Any]]:
    """The stores as the operator wires them, listed empty; (its own writes, the passes asked
    for, each collection's sink by plural)."""
    writes, asked, owned = OwnObjectWrites(), [], OwnedObjects()
    collections = owned_collections(
        owned, (), "pdd-operator", lambda key, cause: asked.append((key, cause)), None, writes
    )
    sinks = {c.path.rsplit("/", 1)[-1]: c.sink for c in collections}
    for sink in sinks.values():
        sink.reset([])
    return writes, asked, sinks


def versioned(body: dict[str, Any], version: str, **status: Any) -> dict[str, Any]:
    copied = copy.deepcopy(body)
    copied["metadata"]["resourceVersion"] = version
    copied.setdefault("status", {}).update(status)
    return copied


def test_the_echo_of_our_own_apply_asks_for_no_pass_and_a_later_change_does() -> None:
    writes, asked, sinks = stores_with_echoes()
    ours = versioned(child("StatefulSet", "kv-prefill", "uid-sts", "uid-kv"), "7")
    writes.expect("statefulsets", ours)
    sinks["statefulsets"].apply("ADDED", ours)
    assert asked == []
    scaled = versioned(ours, "8")
    scaled["spec"]["replicas"] = 3
    sinks["statefulsets"].apply("MODIFIED", scaled)
    assert asked == [(KEY, "statefulsets")]


def test_a_write_that_changed_nothing_hides_no_status_change_under_its_version() -> None:
    """Our apply changed nothing and answered with version 9, the StatefulSet controller's,
    whose event was still on its way: that event's new observed generation asks for a pass."""
    writes, asked, sinks = stores_with_echoes()
    ours = versioned(child("StatefulSet", "kv-prefill", "uid-sts", "uid-kv"), "7")
    sinks["statefulsets"].apply("ADDED", ours)
    asked.clear()
    theirs = versioned(ours, "9", observedGeneration=1, updateRevision="kv-prefill-1")
    writes.expect("statefulsets", theirs)
    sinks["statefulsets"].apply("MODIFIED", theirs)
    assert asked == [(KEY, "statefulsets")]
    respec = versioned(theirs, "10")  # our spec change, the status as it was: an echo
    respec["spec"]["replicas"], respec["metadata"]["generation"] = 3, 2
    writes.expect("statefulsets", respec)
    sinks["statefulsets"].apply("MODIFIED", respec)
    assert asked == [(KEY, "statefulsets")]


def test_a_probe_request_comes_back_asking_nothing_unless_the_pod_changed_too() -> None:
    writes, asked, sinks = stores_with_echoes()
    owner = child("StatefulSet", "kv-prefill", "uid-sts", "uid-kv")
    sinks["statefulsets"].apply("ADDED", versioned(owner, "1"))
    prober = versioned(pod("kv-prefill-0", ref("StatefulSet", "kv-prefill", "uid-sts")), "5")
    sinks["pods"].apply("ADDED", prober)
    asked.clear()
    requested = versioned(prober, "6")
    requested["metadata"]["annotations"] = {**COPIED, names.ANNOTATION_PROBE_REQUEST: "t1"}
    writes.expect("pods", requested)
    sinks["pods"].apply("MODIFIED", requested)
    assert asked == []
    again = versioned(requested, "8", conditions=[{"type": "Ready", "status": "True"}])
    writes.expect("pods", again)  # the same request again answered with the kubelet's version
    sinks["pods"].apply("MODIFIED", again)
    assert asked == [(KEY, "pods")]


def test_a_fresh_list_forgets_the_echoes_its_lost_watch_would_have_brought() -> None:
    writes, _, sinks = stores_with_echoes()
    writes.expect("statefulsets", versioned(child("StatefulSet", "a", "u", "uid-kv"), "7"))
    writes.expect("services", versioned(child("Service", "a", "u2", "uid-kv"), "8"))
    sinks["statefulsets"].reset([])
    assert len(writes) == 1  # the Service's is kept


def test_a_statefulsets_controller_counting_its_pods_asks_for_no_pass() -> None:
    """A pass counts a StatefulSet's replicas from its pods (their own events ask for it):
    the controller's counts coming later ask for nothing; a new generation observed or a
    new update revision does."""
    _, asked, sinks = stores_with_echoes()
    created = versioned(child("StatefulSet", "kv-prefill", "uid-sts", "uid-kv"), "1")
    sinks["statefulsets"].apply("ADDED", created)
    asked.clear()
    counted = versioned(created, "2", replicas=1, readyReplicas=1, updatedReplicas=1)
    counted["status"] |= {"currentReplicas": 1, "availableReplicas": 1, "currentRevision": "a"}
    sinks["statefulsets"].apply("MODIFIED", counted)
    assert asked == []
    sinks["statefulsets"].apply("MODIFIED", versioned(counted, "3", observedGeneration=1))
    assert asked == [(KEY, "statefulsets")]
    sinks["statefulsets"].apply("MODIFIED", versioned(counted, "4", updateRevision="b"))
    assert asked == [(KEY, "statefulsets")] * 2


def test_a_router_deployments_counts_still_ask_for_a_pass() -> None:
    """A Deployment's counts are read as its controller writes them (its pods belong to
    ReplicaSets whose revisions only it tells apart)."""
    _, asked, sinks = stores_with_echoes()
    created = versioned(child("Deployment", "kv-router", "uid-dep", "uid-kv"), "1")
    sinks["deployments"].apply("ADDED", created)
    asked.clear()
    sinks["deployments"].apply("MODIFIED", versioned(created, "2", readyReplicas=1))
    assert asked == [(KEY, "deployments")]
