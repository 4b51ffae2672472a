"""Drift of a child: the owned-fields digests (status.drift) and the reconciler putting a child
back, against a fake API that answers as the server does (managedFields included)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from helpers.factories import BASE_BODY
from pdd_operator.planning.placement import Fleet
from pdd_operator.reconcile import Reconciler
from pdd_operator.rendering.context import OperatorSettings
from pdd_operator.status.drift import LiveDigests, live_fingerprint, rendered_fingerprint
from pdd_operator.status.observe import ChildKey, ChildSummary, PodSummary, summarize_child

MANAGER = "pdd-operator"


def fields_v1(value: Any) -> dict[str, Any]:
    """A fieldsV1 set owning every field of `value`, lists as atomic (a form the server uses
    for atomic lists; good enough to stand for what an apply of `value` owns)."""
    if isinstance(value, dict):
        return {f"f:{k}": fields_v1(v) for k, v in value.items()}
    return {}


def applied(obj: Mapping[str, Any], version: str = "rv-1") -> dict[str, Any]:
    """`obj` as the server stores it after the operator applied it."""
    live = copy.deepcopy(dict(obj))
    owned = {k: v for k, v in live.items() if k not in ("apiVersion", "kind")}
    owned["metadata"] = {k: v for k, v in live["metadata"].items() if k != "name"}
    entry = {"manager": MANAGER, "operation": "Apply", "fieldsV1": fields_v1(owned)}
    live["metadata"]["managedFields"] = [entry]
    live["metadata"]["resourceVersion"] = version
    live["metadata"]["uid"] = f"uid-{live['metadata']['name']}"
    live["metadata"]["generation"] = 1
    return live


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


class FakeCluster:
    """The API server and the operator's indexes in one: applies are stored as the server
    would store them, and the index summarises what is stored."""

    def __init__(self, body: dict[str, Any], respell: bool = False) -> None:
        self.body = body
        self.objects: dict[ChildKey, dict[str, Any]] = {}
        self.applies: list[tuple[str, str, bool]] = []  # kind, name, answer decoded
        self.versions = 0
        self.respell = respell  # the server reads one owned value back in another spelling
        self.events: list[tuple[str, str, str]] = []
        self.index_lag: set[ChildKey] = set()  # children whose watch event has not come yet
        self._indexed: dict[ChildKey, ChildSummary] = {}

    # KubeApi
    def apply(
        self, obj: dict[str, Any], dry_run: bool = False, want_result: bool = True
    ) -> dict[str, Any]:
        key = (obj["apiVersion"], obj["kind"], obj["metadata"]["name"])
        self.applies.append((obj["kind"], obj["metadata"]["name"], want_result))
        if self.respell and obj["kind"] == "Service":  # an owned value the render lacks
            obj = {**obj, "metadata": {**obj["metadata"], "labels": {"respelled": "x"}}}
        live = applied(obj, self.next_version())
        stored = self.objects.get(key)
        if stored is not None and _without_version(stored) == _without_version(live):
            live = stored  # a no-op apply: the server keeps the version
        self.objects[key] = live
        return copy.deepcopy(live) if want_result else {}

    def next_version(self) -> str:
        """Opaque and unordered, as the API promises: only equality may be used."""
        self.versions += 1
        return f"rv-{'qzmkdt'[self.versions % 6]}{self.versions}"

    def changed_by_hand(self, key: ChildKey, change: Callable[[dict[str, Any]], None]) -> None:
        change(self.objects[key])
        self.objects[key]["metadata"]["resourceVersion"] = self.next_version()

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> str:
        version = self.next_version()
        self.body = {**self.body, "status": status}
        self.body["metadata"] = {**self.body["metadata"], "resourceVersion": version}
        return version

    def create_if_absent(self, obj: dict[str, Any]) -> bool:
        return True

    def delete(self, kind: Any, namespace: str, name: str) -> None:
        self.objects = {k: v for k, v in self.objects.items() if k[2] != name}

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        raise AssertionError("no pods here")

    # ClusterView
    def pdd_body(self, key: tuple[str, str]) -> Mapping[str, Any] | None:
        return self.body

    def children(self, key: tuple[str, str]) -> Mapping[ChildKey, ChildSummary]:
        for child, live in self.objects.items():
            if child not in self.index_lag:
                self._indexed[child] = summarize_child(live, MANAGER)
        return {k: v for k, v in self._indexed.items() if k in self.objects}

    def pods(self, key: tuple[str, str]) -> Sequence[PodSummary]:
        return []

    def fleet(self) -> Fleet:
        return Fleet(())

    def node_ready(self, name: str) -> bool | None:
        return True

    def emit(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))


def _without_version(live: Mapping[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in live["metadata"].items() if k != "resourceVersion"}
    return {**live, "metadata": meta}


DECODE: ChildKey = ("apps/v1", "StatefulSet", "llama-decode")


def _cluster(respell: bool = False) -> tuple[FakeCluster, Reconciler]:
    body = copy.deepcopy(BASE_BODY)
    body["metadata"].update(namespace="ns", resourceVersion="1")
    body["spec"]["topology"] = {"placement": "none"}
    cluster = FakeCluster(body, respell)
    reconciler = Reconciler(cluster, cluster, OperatorSettings(), cluster.emit)  # type: ignore[arg-type]
    return cluster, reconciler


def _pass(cluster: FakeCluster, reconciler: Reconciler) -> list[tuple[str, str, bool]]:
    before = len(cluster.applies)
    asyncio.run(reconciler.reconcile(("ns", "llama")))
    return cluster.applies[before:]


def _settle(cluster: FakeCluster, reconciler: Reconciler) -> None:
    for _ in range(5):
        if not _pass(cluster, reconciler):
            return
    raise AssertionError("the children never settled")


def _decode(cluster: FakeCluster) -> dict[str, Any]:
    return cluster.objects[DECODE]


def _corrected(cluster: FakeCluster) -> list[str]:
    return [message for _, reason, message in cluster.events if reason == "DriftCorrected"]


def test_a_scaled_statefulset_is_put_back_once_and_then_left_alone() -> None:
    cluster, reconciler = _cluster()
    _settle(cluster, reconciler)
    assert _pass(cluster, reconciler) == []

    cluster.changed_by_hand(DECODE, scaled_by_hand)
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

    cluster.changed_by_hand(DECODE, env_removed)
    service = ("v1", "Service", "llama-prefill")
    del cluster.objects[service]
    assert sorted(_pass(cluster, reconciler)) == [
        ("Service", "llama-prefill", False),
        ("StatefulSet", "llama-decode", True),
    ]
    assert service in cluster.objects
    assert _pass(cluster, reconciler) == []


def test_foreign_labels_cause_no_write() -> None:
    cluster, reconciler = _cluster()
    _settle(cluster, reconciler)
    cluster.changed_by_hand(DECODE, lambda live: live["metadata"]["labels"].update(team="me"))
    assert _pass(cluster, reconciler) == []
    assert not _corrected(cluster)


def test_a_stale_index_copy_after_a_correction_is_not_corrected_again() -> None:
    cluster, reconciler = _cluster()
    _settle(cluster, reconciler)
    cluster.changed_by_hand(DECODE, scaled_by_hand)
    reconciler.view.children(("ns", "llama"))  # the index sees the scaled copy
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
    cluster.changed_by_hand(DECODE, scaled_by_hand)
    reconciler.view.children(("ns", "llama"))
    cluster.index_lag.add(DECODE)
    late = copy.deepcopy(_decode(cluster))
    late["status"] = {"replicas": 1}
    late["metadata"]["resourceVersion"] = cluster.next_version()
    assert _pass(cluster, reconciler) == [("StatefulSet", "llama-decode", True)]
    reconciler.view._indexed[DECODE] = summarize_child(late, MANAGER)  # type: ignore[attr-defined]
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
