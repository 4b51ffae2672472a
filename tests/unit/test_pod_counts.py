"""A StatefulSet's replicas as a pass counts them: from its pods (status.observe)."""

from __future__ import annotations

from dataclasses import replace

from pdd_operator.status.compute import WorkloadState
from pdd_operator.status.observe import ChildSummary, PodSummary, counted_from_pods

STALE = WorkloadState(
    exists=True,
    desired=3,
    ready=0,  # the controller has not counted yet
    updated=0,
    pods=0,
    current_revision="kv-prefill-a",
    update_revision="kv-prefill-b",
    generation=2,
    observed_generation=2,
)


def statefulset(name: str, uid: str, kind: str = "StatefulSet") -> ChildSummary:
    return ChildSummary(("apps/v1", kind, name), "hash", "prefill", STALE, uid=uid)


def pod(name: str, owner: str, revision: str, ready: bool = True, **more: bool) -> PodSummary:
    return PodSummary(
        name, f"uid-{name}", "prefill", "n1", ready, "r1", None, owner_uid=owner,
        controller_revision=revision, **more,
    )  # fmt: skip


def test_a_statefulset_is_counted_from_its_pods_as_its_controller_would() -> None:
    pods = [
        pod("kv-prefill-0", "uid-sts", "kv-prefill-b"),
        pod("kv-prefill-1", "uid-sts", "kv-prefill-a"),  # ready, of the old revision
        pod("kv-prefill-2", "uid-sts", "kv-prefill-b", ready=False),
        pod("kv-prefill-3", "uid-sts", "kv-prefill-b", terminating=True),  # on its way out
        pod("other-0", "uid-other", "kv-prefill-b"),  # another workload's
    ]
    [counted] = counted_from_pods([statefulset("kv-prefill", "uid-sts")], pods)
    assert counted.workload == replace(STALE, pods=4, ready=2, updated=2)


def test_a_statefulset_its_controller_has_not_seen_counts_none_updated() -> None:
    unseen = replace(statefulset("kv-prefill", "uid-sts"), workload=WorkloadState(exists=True))
    [counted] = counted_from_pods([unseen], [pod("kv-prefill-0", "uid-sts", "")])
    assert counted.workload == WorkloadState(exists=True, pods=1, ready=1, updated=0)


def test_other_children_keep_their_controllers_counts() -> None:
    router = statefulset("kv-router", "uid-dep", kind="Deployment")
    service = ChildSummary(("v1", "Service", "kv"), "hash", "", uid="uid-svc")
    pods = [pod("kv-router-0", "uid-dep", "x")]
    assert counted_from_pods([router, service], pods) == [router, service]
