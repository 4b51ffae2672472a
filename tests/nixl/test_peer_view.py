"""The versioned view of peer agents that engines watch, the etcd key layout and the
operator's probe requests (pure)."""

from __future__ import annotations

import json

import pytest

from pdd_contract.probe_result import ProbeResult
from pdd_sidecar.etcd_mode import agent_prefix, metadata_key, prefix_range_end
from pdd_sidecar.peer_view import (
    METADATA_CHANGED,
    POD_GONE,
    UID_CHANGED,
    UNPUBLISHED,
    AgentRecord,
    PeerHistory,
    diff_views,
    merge_pods,
    removal_reason,
)
from pdd_sidecar.prober import pending_request, result_annotation


def rec(
    name: str, uid: str = "u1", sha: str = "s1", pod: str = "p0", at: float = 0.0
) -> AgentRecord:
    return AgentRecord(name, "prefill", pod, uid, "10.0.0.1:8790", sha, published_at=at)


def test_identity_change_is_a_removal_and_an_addition() -> None:
    old = {"a": rec("a"), "b": rec("b")}
    new = {"a": rec("a", uid="u2"), "c": rec("c")}
    added, removed = diff_views(old, new)
    assert sorted((r.name, r.pod_uid) for r in added) == [("a", "u2"), ("c", "u1")]
    assert sorted((r.name, r.pod_uid) for r in removed) == [("a", "u1"), ("b", "u1")]


def test_metadata_bytes_are_not_part_of_equality_but_the_digest_is() -> None:
    assert diff_views({"a": rec("a")}, {"a": rec("a")}) == ([], [])
    assert diff_views({"a": rec("a")}, {"a": rec("a", sha="s2")})[1] == [rec("a")]


def test_history_versions_and_watch_diffs() -> None:
    history = PeerHistory(start_version=100)
    assert history.changes_since(100).added == []
    history.update({"a": rec("a")})
    history.update({"a": rec("a")})  # no change, no new version
    assert history.version == 101
    history.update({"a": rec("a", uid="u2")})
    changes = history.changes_since(100)
    assert [(r.name, r.pod_uid) for r in changes.added] == [("a", "u2")]
    assert changes.removed == [] and not changes.resync
    step = history.changes_since(101)
    assert [r.pod_uid for r in step.removed] == ["u1"] and [r.pod_uid for r in step.added] == ["u2"]


@pytest.mark.parametrize("since", [0, 99, 10_000])
def test_unknown_since_is_a_resync(since: int) -> None:
    history = PeerHistory(start_version=100)
    history.update({"a": rec("a")})
    changes = history.changes_since(since)
    assert changes.resync and [r.name for r in changes.added] == ["a"]


def test_history_is_bounded() -> None:
    history = PeerHistory(start_version=0, keep=3)
    for i in range(10):
        history.update({"a": rec("a", sha=str(i))})
    assert history.changes_since(1).resync
    assert not history.changes_since(history.version - 1).resync


def test_for_role_filters_both_lists() -> None:
    history = PeerHistory()
    decode = AgentRecord("d", "decode", "d0", "u", "x", "s")
    history.update({"a": rec("a"), "d": decode})
    changes = history.changes_since(0).for_role("decode")
    assert [r.name for r in changes.added] == ["d"]


def test_merge_prefers_the_latest_publication_of_a_name() -> None:
    view = merge_pods([[rec("a", uid="old", at=1.0)], [rec("a", uid="new", at=2.0)]])
    assert view["a"].pod_uid == "new"


@pytest.mark.parametrize(
    ("record", "new", "live", "reason"),
    [
        (rec("a"), {}, {}, POD_GONE),
        (rec("a"), {}, {"p0": "u2"}, UID_CHANGED),
        (rec("a"), {}, {"p0": "u1"}, UNPUBLISHED),
        (rec("a"), {"a": rec("a", sha="s2")}, {"p0": "u1"}, METADATA_CHANGED),
        (rec("a"), {"a": rec("a", uid="u9", pod="p9")}, {"p0": "u1"}, UID_CHANGED),
    ],
)
def test_removal_reason(
    record: AgentRecord, new: dict[str, AgentRecord], live: dict[str, str], reason: str
) -> None:
    assert removal_reason(record, new, live) == reason


def test_etcd_key_layout_and_prefix_end() -> None:
    # NIXL joins namespace + "/" + agent + "/" + label, even when the namespace ends in "/".
    assert metadata_key("/nixl/agents/", "A") == "/nixl/agents//A/metadata"
    assert agent_prefix("/pdd/ns/dep", "A") == "/pdd/ns/dep/A/"
    assert prefix_range_end(b"/pdd/A/") == b"/pdd/A0"
    assert prefix_range_end(b"a\xff") == b"b"
    assert prefix_range_end(b"\xff\xff") == b"\0"


REQ, RES = "pdd.dev/probe-request", "pdd.dev/probe-result"


@pytest.mark.parametrize(
    ("annotations", "attempted", "pending"),
    [
        ({}, None, None),
        ({REQ: "t1"}, None, "t1"),
        ({"pdd.dev/probe-request": "t1"}, "t1", None),
        (
            {"pdd.dev/probe-request": "t2", "pdd.dev/probe-result": '{"request_id": "t1"}'},
            "t1",
            "t2",
        ),
        (
            {"pdd.dev/probe-request": "t1", "pdd.dev/probe-result": '{"request_id": "t1"}'},
            None,
            None,
        ),
        ({"pdd.dev/probe-request": "t1", "pdd.dev/probe-result": "not json"}, None, "t1"),
    ],
)
def test_pending_probe_request(
    annotations: dict[str, str], attempted: str | None, pending: str | None
) -> None:
    assert pending_request(annotations, attempted) == pending


def test_result_annotation_carries_the_request_id() -> None:
    annotation = result_annotation(ProbeResult(path="VRAM->VRAM", gbps=48.0), "t9")
    document = json.loads(annotation["pdd.dev/probe-result"])
    assert document["request_id"] == "t9" and document["gbps"] == 48.0
