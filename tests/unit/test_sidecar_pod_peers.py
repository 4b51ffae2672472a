"""Which pods the sidecar's k8s peer source counts as peers."""

from __future__ import annotations

import pytest
from kubernetes import client

from pdd_sidecar.peers import PeerEndpoint, endpoints_from_pods, role_of_statefulset

WORKLOADS = {"kv-prefill": "prefill", "kv-decode": "decode"}


def pod(
    name: str,
    owner: str | None,
    *,
    ip: str | None = "10.0.0.1",
    phase: str = "Running",
    kind: str = "StatefulSet",
    controller: bool = True,
    deleting: bool = False,
    labels: dict[str, str] | None = None,
) -> client.V1Pod:
    refs = (
        [client.V1OwnerReference(api_version="apps/v1", kind=kind, name=owner, uid="u",
                                 controller=controller)]
        if owner
        else None
    )  # fmt: skip
    return client.V1Pod(
        metadata=client.V1ObjectMeta(
            name=name,
            uid=f"uid-{name}",
            labels=labels,
            owner_references=refs,
            deletion_timestamp="2026-11-30T00:00:00Z" if deleting else None,
        ),
        status=client.V1PodStatus(pod_ip=ip, phase=phase),
    )


def test_pods_of_the_role_statefulsets_are_peers_ready_or_not() -> None:
    pods = [pod("kv-prefill-0", "kv-prefill"), pod("kv-decode-0", "kv-decode", ip="10.0.0.2")]
    assert endpoints_from_pods(pods, WORKLOADS, 8099) == [
        PeerEndpoint("prefill", "10.0.0.1", 8099, "kv-prefill-0", "uid-kv-prefill-0"),
        PeerEndpoint("decode", "10.0.0.2", 8099, "kv-decode-0", "uid-kv-decode-0"),
    ]


def test_ranks_of_instances_that_span_nodes_are_peers_of_their_role() -> None:
    # Multi-node instances are StatefulSets <role's>-<i>; their pods are <that>-<rank>.
    pods = [
        pod("kv-prefill-1-1", "kv-prefill-1"),
        pod("kv-decode-0-0", "kv-decode-0", ip="10.0.0.2"),
        pod("kv-decode-x-0", "kv-decode-x"),  # not an instance: no number
        pod("kv-router-0-0", "kv-router-0"),  # not a role's
    ]
    assert [(e.role, e.pod) for e in endpoints_from_pods(pods, WORKLOADS, 1)] == [
        ("prefill", "kv-prefill-1-1"),
        ("decode", "kv-decode-0-0"),
    ]


def test_pods_of_a_slice_of_a_role_are_peers_of_that_role() -> None:
    pods = [pod("kv-prefill-s1-0", "kv-prefill-s1"), pod("kv-decode-s12-3", "kv-decode-s12")]
    assert [(p.role, p.pod) for p in endpoints_from_pods(pods, WORKLOADS, 8099)] == [
        ("prefill", "kv-prefill-s1-0"),
        ("decode", "kv-decode-s12-3"),
    ]


@pytest.mark.parametrize(
    ("name", "role"),
    [
        ("kv-prefill", "prefill"),
        ("kv-prefill-s1", "prefill"),
        ("kv-decode-s99", "decode"),
        ("kv-prefill-s0", None),  # slice 0 is the role StatefulSet itself
        ("kv-prefill-s01", None),
        ("kv-prefill-s", None),
        ("kv-prefill-sx", None),
        ("kv-prefill-0", "prefill"),  # an instance over nodes
        ("kv-router-s1", None),
        ("other-s1", None),
    ],
)
def test_the_role_of_a_statefulset_by_its_name(name: str, role: str | None) -> None:
    assert role_of_statefulset(name, WORKLOADS) == role


def test_a_deleting_pod_is_listed_as_terminating() -> None:
    (peer,) = endpoints_from_pods([pod("kv-decode-0", "kv-decode", deleting=True)], WORKLOADS, 1)
    assert peer.terminating


def test_pods_that_only_copy_the_labels_or_cannot_serve_are_left_out() -> None:
    pods = [
        pod("stray", None),  # no owner
        pod("other", "other-prefill"),  # another workload
        pod("rs", "kv-prefill", kind="ReplicaSet"),
        pod("adopted", "kv-prefill", controller=False),
        pod("pending", "kv-prefill", ip=None),
        pod("done", "kv-decode", phase="Succeeded"),
        pod("failed", "kv-decode", phase="Failed"),
    ]
    assert endpoints_from_pods(pods, WORKLOADS, 8099) == []


def test_a_peer_carries_its_pod_index_the_rank_where_instances_span_nodes() -> None:
    index = {"apps.kubernetes.io/pod-index": "1"}
    pods = [
        pod("kv-prefill-1-1", "kv-prefill-1", labels=index),
        pod("kv-decode-0", "kv-decode", ip="10.0.0.2"),  # no label (an older cluster)
    ]
    assert [e.pod_index for e in endpoints_from_pods(pods, WORKLOADS, 1)] == [1, None]
