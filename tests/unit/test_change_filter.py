"""Which watch events trigger a pass: only those that change what a pass reads."""

from __future__ import annotations

import dataclasses

from pdd_operator.handlers.changes import ChangeFilter
from pdd_operator.status.compute import WorkloadState
from pdd_operator.status.observe import ChildSummary, PodSummary

CHILD = ChildSummary(
    ("apps/v1", "StatefulSet", "d-decode"),
    "hash-1",
    "decode",
    WorkloadState(exists=True, desired=2, ready=1),
    resource_version="100",
    uid="sts-uid",
)
POD = PodSummary("d-decode-0", "pod-uid", "decode", "n1", "", False, "r1", None)


def test_the_first_look_at_an_object_triggers_a_pass() -> None:
    changes = ChangeFilter()
    changes.saw(CHILD.uid, CHILD)
    assert changes.worth_a_pass(CHILD.uid, None)


def test_a_new_resource_version_alone_triggers_none() -> None:
    changes = ChangeFilter()
    changes.saw(CHILD.uid, CHILD)
    changes.worth_a_pass(CHILD.uid, None)
    changes.saw(CHILD.uid, dataclasses.replace(CHILD, resource_version="101"))
    assert not changes.worth_a_pass(CHILD.uid, "MODIFIED")


def test_a_change_a_pass_reads_triggers_one() -> None:
    changes = ChangeFilter()
    changes.saw(POD.uid, POD)
    changes.worth_a_pass(POD.uid, "ADDED")
    changes.saw(POD.uid, dataclasses.replace(POD, ip="10.0.0.7"))
    assert changes.worth_a_pass(POD.uid, "MODIFIED")
    changes.saw(POD.uid, dataclasses.replace(POD, ip="10.0.0.7"))
    assert not changes.worth_a_pass(POD.uid, "MODIFIED")
    changes.saw(POD.uid, dataclasses.replace(POD, ip="10.0.0.7", ready=True))
    assert changes.worth_a_pass(POD.uid, "MODIFIED")


def test_a_deletion_triggers_one_and_forgets_the_object() -> None:
    changes = ChangeFilter()
    changes.saw(POD.uid, POD)
    changes.worth_a_pass(POD.uid, "ADDED")
    assert changes.worth_a_pass(POD.uid, "DELETED")
    assert len(changes) == 0


def test_an_object_not_indexed_always_triggers_one() -> None:
    changes = ChangeFilter()
    assert changes.worth_a_pass("scaler-uid", "MODIFIED")
    assert changes.worth_a_pass("scaler-uid", "MODIFIED")
    assert len(changes) == 0  # nothing kept for it
