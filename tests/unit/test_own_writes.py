"""The operator's own status writes: recognising their watch echo and an index that lags them."""

from __future__ import annotations

from typing import Any

import pytest

from pdd_operator.reconcile.memory import Memory
from pdd_operator.status.own_writes import (
    OwnObjectWrites,
    OwnWrite,
    after_write,
    is_echo,
    latest,
)

KEY = ("team-a", "llama")


@pytest.mark.parametrize(
    ("steps", "predating", "not_predating"),
    [
        # one write by a pass that read "m": only "m" is known to be older
        ([("m", "c")], {"m"}, {"c", "a", "z", ""}),
        # the index still showed "m" when the next pass wrote "q": both "m" and "c" predate it
        ([("m", "c"), ("m", "q")], {"m", "c"}, {"q", "a"}),
        # the index had caught up with "c" before "q" was written
        ([("m", "c"), ("c", "q")], {"c"}, {"m", "q"}),
        # a version this operator never wrote: someone else's change; nothing older is known
        ([("m", "c"), ("k", "q")], {"k"}, {"m", "c", "q"}),
        # a chain of lagging writes keeps every version it passed over
        ([("9", "10"), ("9", "11"), ("10", "12")], {"9", "10", "11"}, {"12", "100"}),
    ],
)
def test_own_writes_are_ordered_by_what_each_pass_read_not_by_comparing_versions(
    steps: list[tuple[str, str]], predating: set[str], not_predating: set[str]
) -> None:
    record = None
    for read, version in steps:
        record = OwnWrite.after(record, read, version, {"n": version})
    assert record is not None and record.version == steps[-1][1]
    assert {v for v in predating | not_predating if record.predates(v)} == predating


def body(version: str, status: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "llama", "resourceVersion": version}, "status": status}


def test_the_last_write_stands_in_for_an_index_copy_that_predates_it() -> None:
    read = body("m", {"phase": "old"})
    assert latest(None, read) is read  # nothing written yet
    written = after_write(None, read, "c", {"phase": "new"})
    assert latest(written, read) == body("m", {"phase": "new"})
    echo = body("c", {"phase": "new"})
    assert latest(written, echo) is echo
    theirs = body("k", {"phase": "theirs"})
    assert latest(written, theirs) is theirs


@pytest.mark.parametrize(
    ("version", "echo"),
    [("c", True), ("m", False), ("x", False), ("", False)],
)
def test_the_echo_is_the_version_the_write_returned(version: str, echo: bool) -> None:
    written = after_write(None, body("m", {}), "c", {})
    assert is_echo(written, version) is echo
    assert not is_echo(None, version)


def test_a_write_to_a_deleted_object_and_a_forgotten_deployment_are_nothing() -> None:
    assert after_write(None, body("m", {}), "", {"phase": "new"}) is None  # the object was gone
    memory = Memory()
    record = memory.record(KEY)
    record.status_write = after_write(None, body("m", {}), "c", {"phase": "new"})
    memory.forget(KEY)
    assert memory.find(KEY) is None and memory.record(KEY).status_write is None


def test_an_earlier_writes_echo_coming_after_a_later_write_is_still_an_echo() -> None:
    """Two passes wrote "c" then "q" before the watch brought "c" back: both are ours."""
    written = after_write(None, body("m", {}), "c", {})
    written = after_write(written, body("m", {}), "q", {})  # its pass still read "m": lagged
    assert is_echo(written, "c") and is_echo(written, "q")
    written = after_write(written, body("q", {}), "z", {})  # the index had caught up
    assert not is_echo(written, "c") and not is_echo(written, "q")
    assert is_echo(written, "z")


def child(version: str, name: str = "llama-decode") -> dict[str, Any]:
    return {"metadata": {"namespace": "team-a", "name": name, "resourceVersion": version}}


def test_an_apply_is_recognised_once_by_the_version_it_returned() -> None:
    applies = OwnObjectWrites()
    applies.expect("statefulsets", child("7"))
    assert not applies.is_echo("statefulsets", "MODIFIED", child("6"))  # an older event
    assert not applies.is_echo("services", "ADDED", child("7"))  # another kind, same name
    assert not applies.is_echo("statefulsets", "ADDED", child("7", "llama-prefill"))
    assert applies.is_echo("statefulsets", "ADDED", child("7"))
    assert len(applies) == 0
    assert not applies.is_echo("statefulsets", "MODIFIED", child("7"))  # only once


def test_an_apply_that_changed_nothing_is_forgotten_when_its_object_goes() -> None:
    """A no-op apply returns the version the object already had, and no event follows."""
    applies = OwnObjectWrites()
    applies.expect("statefulsets", child("7"))
    assert not applies.is_echo("statefulsets", "MODIFIED", child("9"))  # someone else's
    assert len(applies) == 1
    assert not applies.is_echo("statefulsets", "DELETED", child("7"))
    assert len(applies) == 0
    applies.expect("statefulsets", {"metadata": {"name": "x"}})  # no version: nothing to await
    assert len(applies) == 0
