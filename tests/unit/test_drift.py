"""Drift of a child: the owned-fields digests (status.drift) and the reconciler putting a child
back, against a fake API that answers as the server does (managedFields included)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from typing import Any

import pytest

from helpers.factories import BASE_BODY
from helpers.fake_cluster import MANAGER, FakeCluster, reconciler_for
from pdd_operator.reconcile import Reconciler
from pdd_operator.status.drift import LiveDigests, live_fingerprint, rendered_fingerprint
from pdd_operator.status.observe import ChildKey

RENDERED: dict[str, Any] = {
    "apiVersion": "apps/v1",
    "kind": "StatefulSet",
    "metadata": {"name": "llama-decode", "namespace": "ns", "labels": {"pdd.dev/role": "decode"}},
    "spec": {
        "replicas": 4,
        "template": {
            "spec": {
                "containers": [
                    {
                        "name": "engine",
                        "env": [
                            {"name": "UCX_NET_DEVICES", "value": "mlx5_0:1"},
                            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "x"}}},
                        ],
                        "resources": {"limits": {"nvidia.com/gpu": 2, "memory": "1024Mi"}},
                        "volumeMounts": [],
                    }
                ]
            }
        },
    },
}

# The server's copy of RENDERED, with the fields it owns keyed like the real managedFields.
LIVE: dict[str, Any] = {
    "apiVersion": "apps/v1",
    "kind": "StatefulSet",
    "metadata": {
        "name": "llama-decode",
        "namespace": "ns",
        "uid": "u1",
        "generation": 1,
        "resourceVersion": "10",
        "labels": {"pdd.dev/role": "decode"},
        "managedFields": [
            {
                "manager": MANAGER,
                "operation": "Apply",
                "fieldsType": "FieldsV1",
                "fieldsV1": {
                    "f:metadata": {"f:labels": {"f:pdd.dev/role": {}}},
                    "f:spec": {
                        "f:replicas": {},
                        "f:template": {
                            "f:spec": {
                                "f:containers": {
                                    'k:{"name":"engine"}': {
                                        ".": {},
                                        "f:name": {},
                                        "f:env": {
                                            'k:{"name":"UCX_NET_DEVICES"}': {
                                                ".": {},
                                                "f:name": {},
                                                "f:value": {},
                                            },
                                            'k:{"name":"POD_IP"}': {
                                                ".": {},
                                                "f:name": {},
                                                "f:valueFrom": {"f:fieldRef": {}},
                                            },
                                        },
                                        "f:resources": {
                                            "f:limits": {
                                                "f:nvidia.com/gpu": {},
                                                "f:memory": {},
                                            }
                                        },
                                    }
                                }
                            }
                        },
                    },
                },
            },
            {
                "manager": "kube-controller-manager",
                "operation": "Update",
                "subresource": "status",
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:status": {"f:replicas": {}}},
            },
        ],
    },
    "spec": {
        "replicas": 4,
        "revisionHistoryLimit": 10,  # a server default: not owned, not compared
        "template": {
            "spec": {
                "containers": [
                    {
                        "name": "engine",
                        "env": [
                            {"name": "UCX_NET_DEVICES", "value": "mlx5_0:1"},
                            {
                                "name": "POD_IP",
                                "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "x"}},
                            },
                        ],
                        "resources": {"limits": {"nvidia.com/gpu": "2", "memory": "1Gi"}},
                        "terminationMessagePath": "/dev/termination-log",
                    }
                ]
            }
        },
    },
    "status": {"replicas": 4, "readyReplicas": 4},
}


def _engine(live: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = live["spec"]["template"]["spec"]["containers"][0]
    return container


def _owned_engine_fields(live: dict[str, Any]) -> dict[str, Any]:
    spec = live["metadata"]["managedFields"][0]["fieldsV1"]["f:spec"]
    fields: dict[str, Any] = spec["f:template"]["f:spec"]["f:containers"]['k:{"name":"engine"}']
    return fields


def scaled_by_hand(live: dict[str, Any]) -> None:
    # `kubectl scale` is an update of the scale subresource: replicas changes owner.
    live["spec"]["replicas"] = 1
    del live["metadata"]["managedFields"][0]["fieldsV1"]["f:spec"]["f:replicas"]


def env_removed(live: dict[str, Any]) -> None:
    _engine(live)["env"].pop(0)
    del _owned_engine_fields(live)["f:env"]['k:{"name":"UCX_NET_DEVICES"}']


def env_value_rewritten_keeping_owner(live: dict[str, Any]) -> None:
    _engine(live)["env"][0]["value"] = "mlx5_7:1"  # e.g. by a mutating webhook


def foreign_label_and_env(live: dict[str, Any]) -> None:
    live["metadata"]["labels"]["team"] = "me"
    live["metadata"].setdefault("annotations", {})["note"] = "mine"
    _engine(live)["env"].append({"name": "EXTRA", "value": "1"})


def status_changed(live: dict[str, Any]) -> None:
    live["status"]["readyReplicas"] = 2


def no_change(live: dict[str, Any]) -> None:
    pass


@pytest.mark.parametrize(
    ("change", "drifted"),
    [
        (no_change, False),
        (status_changed, False),
        (foreign_label_and_env, False),
        (scaled_by_hand, True),
        (env_removed, True),
        (env_value_rewritten_keeping_owner, True),
    ],
)
def test_live_digest_equals_the_render_unless_an_owned_field_changed(
    change: Callable[[dict[str, Any]], None], drifted: bool
) -> None:
    live = copy.deepcopy(LIVE)
    change(live)
    assert (live_fingerprint(live, MANAGER) != rendered_fingerprint(RENDERED)) is drifted


def test_an_object_the_manager_owns_nothing_of_has_no_digest() -> None:
    assert live_fingerprint(LIVE, "someone-else") == ""


@pytest.mark.parametrize(
    ("left", "right", "equal"),
    [
        ("1024Mi", "1Gi", True),
        (2, "2", True),
        ("500m", "0.5", True),
        ("1e3", "1k", True),
        ("16Gi", "16G", False),
        ("v1", "v1", True),
        ("true", True, False),
        # A hash that reads as a number with a huge exponent (found by the dry-run property
        # test: it raised decimal.Overflow) is compared as the text it is.
        ("1297e39167626459", "1297e39167626459", True),
        ("1297e39167626459", "1297e39167626458", False),
    ],
)
def test_values_compare_as_the_server_spells_them(left: Any, right: Any, equal: bool) -> None:
    one = {"metadata": {"name": "x"}, "spec": {"v": left}}
    other = {"metadata": {"name": "x"}, "spec": {"v": right}}
    assert (rendered_fingerprint(one) == rendered_fingerprint(other)) is equal


def test_cached_digests_follow_spec_and_metadata_but_skip_status_events() -> None:
    digests = LiveDigests(max_entries=2)
    live = copy.deepcopy(LIVE)
    wanted = rendered_fingerprint(RENDERED)
    assert digests.fingerprint(live, MANAGER) == wanted
    status_changed(live)
    assert digests.fingerprint(live, MANAGER) == wanted
    scaled_by_hand(live)
    live["metadata"]["generation"] = 2  # a spec change bumps it
    assert digests.fingerprint(live, MANAGER) != wanted
    fixed = copy.deepcopy(LIVE)
    fixed["metadata"]["generation"] = 3
    assert digests.fingerprint(fixed, MANAGER) == wanted
    del fixed["metadata"]["labels"]["pdd.dev/role"]  # metadata changes keep the generation
    assert digests.fingerprint(fixed, MANAGER) != wanted
    for uid in ("a", "b", "c"):
        other = copy.deepcopy(LIVE)
        other["metadata"]["uid"] = uid
        digests.fingerprint(other, MANAGER)
    assert len(digests._entries) == 2


# ------------------------------------------------------------ the reconciler putting it back

DECODE: ChildKey = ("apps/v1", "StatefulSet", "llama-decode")
NS = "team-a"


def _cluster(respell: bool = False) -> tuple[FakeCluster, Reconciler]:
    body = copy.deepcopy(BASE_BODY)
    body["metadata"]["resourceVersion"] = "1"
    body["spec"]["topology"] = {"placement": "none"}
    cluster = FakeCluster(body, respell=respell)
    return cluster, reconciler_for(cluster)


def _pass(cluster: FakeCluster, reconciler: Reconciler) -> list[tuple[str, str, bool]]:
    before = len(cluster.applies)
    asyncio.run(reconciler.reconcile((NS, "llama")))
    return cluster.applies[before:]


def _settle(cluster: FakeCluster, reconciler: Reconciler) -> None:
    for _ in range(5):
        if not _pass(cluster, reconciler):
            return
    raise AssertionError("the children never settled")


def _decode(cluster: FakeCluster) -> dict[str, Any]:
    return cluster.child(NS, DECODE)


def _corrected(cluster: FakeCluster) -> list[str]:
    return [message for _, reason, message in cluster.events if reason == "DriftCorrected"]


def test_a_scaled_statefulset_is_put_back_once_and_then_left_alone() -> None:
    cluster, reconciler = _cluster()
    _settle(cluster, reconciler)
    assert _pass(cluster, reconciler) == []

    cluster.changed_by_hand(NS, DECODE, scaled_by_hand)
    assert _pass(cluster, reconciler) == [("StatefulSet", "llama-decode", True)]
    assert _decode(cluster)["spec"]["replicas"] == 4
    assert len(_corrected(cluster)) == 1
    assert "StatefulSet llama-decode" in _corrected(cluster)[0]
    assert _pass(cluster, reconciler) == []


def test_a_removed_env_var_and_a_deleted_child_are_put_back() -> None:
    cluster, reconciler = _cluster()
    _settle(cluster, reconciler)

    def env_removed(live: dict[str, Any]) -> None:
        live["spec"]["template"]["spec"]["containers"][0]["env"].pop(0)
        # the containers list is owned as a whole here (fields_v1): it changes owner
        live["metadata"]["managedFields"][0]["fieldsV1"]["f:spec"]["f:template"]["f:spec"].pop(
            "f:containers"
        )

    cluster.changed_by_hand(NS, DECODE, env_removed)
    service = ("v1", "Service", "llama-prefill")
    cluster.deleted_by_hand(NS, service)
    assert sorted(_pass(cluster, reconciler)) == [
        ("Service", "llama-prefill", False),
        ("StatefulSet", "llama-decode", True),
    ]
    assert cluster.child(NS, service)
    assert _pass(cluster, reconciler) == []


def test_foreign_labels_cause_no_write() -> None:
    cluster, reconciler = _cluster()
    _settle(cluster, reconciler)
    cluster.changed_by_hand(NS, DECODE, lambda live: live["metadata"]["labels"].update(team="me"))
    assert _pass(cluster, reconciler) == []
    assert not _corrected(cluster)


def test_a_stale_index_copy_after_a_correction_is_not_corrected_again() -> None:
    cluster, reconciler = _cluster()
    _settle(cluster, reconciler)
    cluster.changed_by_hand(NS, DECODE, scaled_by_hand)
    cluster.children((NS, "llama"))  # the index sees the scaled copy
    cluster.index_lag.add(DECODE)  # and not yet the correction's
    assert _pass(cluster, reconciler) == [("StatefulSet", "llama-decode", True)]
    assert _pass(cluster, reconciler) == []
    cluster.index_lag.clear()
    assert _pass(cluster, reconciler) == []
    assert len(_corrected(cluster)) == 1


def test_a_drifted_copy_delivered_after_the_correction_makes_no_second_event() -> None:
    """The StatefulSet controller updates the scaled copy's status before the correction
    lands; the index gets that copy (a version the pass never read) after it."""
    cluster, reconciler = _cluster()
    _settle(cluster, reconciler)
    cluster.changed_by_hand(NS, DECODE, scaled_by_hand)
    cluster.children((NS, "llama"))
    cluster.index_lag.add(DECODE)
    late = copy.deepcopy(_decode(cluster))
    late["status"] = {"replicas": 1}
    late["metadata"]["resourceVersion"] = cluster.next_version()
    assert _pass(cluster, reconciler) == [("StatefulSet", "llama-decode", True)]
    cluster.index_copy(NS, late)
    assert _pass(cluster, reconciler) == [("StatefulSet", "llama-decode", True)]  # a no-op
    assert len(_corrected(cluster)) == 1
    cluster.index_lag.clear()
    assert _pass(cluster, reconciler) == []


def test_a_value_the_server_spells_otherwise_costs_one_write_not_a_loop() -> None:
    cluster, reconciler = _cluster(respell=True)
    applies = [a for _ in range(4) for a in _pass(cluster, reconciler)]
    created = sorted(name for kind, name, read in applies if kind == "Service" and not read)
    reread = sorted(name for kind, name, read in applies if kind == "Service" and read)
    assert created == reread == ["llama-decode", "llama-prefill", "llama-router"]
    assert not [a for a in applies if a[0] != "Service" and a[2]]
    assert not [e for e in cluster.events if e[1] == "DriftCorrected"]
    assert _pass(cluster, reconciler) == []
