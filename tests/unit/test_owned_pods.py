"""A deployment's children and pods are found by owner uid (handlers.view over the indexes),
never by labels or annotations that another object can copy."""

from __future__ import annotations

from typing import Any

from pdd_operator.api import names
from pdd_operator.handlers.view import IndexView
from pdd_operator.status.observe import ChildSummary, PodSummary, summarize_child, summarize_pod

NS = "team-a"
KEY = (NS, "kv")
LABELS = {"app.kubernetes.io/managed-by": "pdd-operator", "pdd.dev/role": "prefill"}
COPIED = {names.ANNOTATION_OWNER_NAME: "kv"}  # what a pod of someone else's may copy


def ref(kind: str, name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": "x/v1", "kind": kind, "name": name, "uid": uid, "controller": True}


def child(kind: str, name: str, uid: str, owner_uid: str) -> ChildSummary:
    body = {
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
    return summarize_child(body, "pdd-operator")


def pod(name: str, *owners: dict[str, Any]) -> PodSummary:
    meta = {"name": name, "namespace": NS, "uid": f"uid-{name}", "labels": LABELS}
    meta |= {"annotations": COPIED, "ownerReferences": list(owners)}
    return summarize_pod({"metadata": meta, "spec": {}, "status": {}})


def view(children: list[ChildSummary], pods: list[PodSummary], sets: dict[str, str]) -> IndexView:
    """The indexes as handlers.operator fills them: pods under their controller's uid."""
    pod_index: dict[tuple[str, str], list[PodSummary]] = {}
    for p in pods:
        pod_index.setdefault((NS, p.owner_uid), []).append(p)
    body = {"metadata": {"name": "kv", "namespace": NS, "uid": "uid-kv"}}
    indexes: dict[str, Any] = {
        "pdd_index": {KEY: [body]},
        "child_statefulsets": {KEY: [c for c in children if c.key[1] == "StatefulSet"]},
        "child_deployments": {KEY: [c for c in children if c.key[1] == "Deployment"]},
        "replicaset_index": {(NS, owner): [rs] for rs, owner in sets.items()},
        "pod_index": pod_index,
    }
    return IndexView(indexes)


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
