"""The operator's own status writes: recognising their watch echo and an index that lags them."""

from __future__ import annotations

from typing import Any

import pytest

from pdd_operator.status.own_writes import OwnObjectWrites, OwnStatusWrites, OwnWrite

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
    writes = OwnStatusWrites()
    read = body("m", {"phase": "old"})
    assert writes.latest(KEY, read) is read  # nothing written yet
    writes.remember(KEY, read, "c", {"phase": "new"})
    assert writes.latest(KEY, read) == body("m", {"phase": "new"})
    echo = body("c", {"phase": "new"})
    assert writes.latest(KEY, echo) is echo
    theirs = body("k", {"phase": "theirs"})
    assert writes.latest(KEY, theirs) is theirs
    assert writes.latest(("team-b", "llama"), read) is read


@pytest.mark.parametrize(
    ("version", "echo"),
    [("c", True), ("m", False), ("x", False), ("", False)],
)
def test_the_echo_is_the_version_the_write_returned(version: str, echo: bool) -> None:
    writes = OwnStatusWrites()
    writes.remember(KEY, body("m", {}), "c", {})
    assert writes.is_echo(KEY, version) is echo
    assert not writes.is_echo(("team-b", "llama"), version)


def test_a_write_to_a_deleted_object_and_a_forgotten_one_are_nothing() -> None:
    writes = OwnStatusWrites()
    writes.remember(KEY, body("m", {}), "", {"phase": "new"})  # the object was gone
    assert not writes.is_echo(KEY, "") and writes.latest(KEY, body("m", {})) == body("m", {})
    writes.remember(KEY, body("m", {}), "c", {"phase": "new"})
    writes.forget(KEY)
    assert not writes.is_echo(KEY, "c") and writes.latest(KEY, body("m", {})) == body("m", {})


def test_an_earlier_writes_echo_coming_after_a_later_write_is_still_an_echo() -> None:
    """Two passes wrote "c" then "q" before the watch brought "c" back: both are ours."""
    writes = OwnStatusWrites()
    writes.remember(KEY, body("m", {}), "c", {})
    writes.remember(KEY, body("m", {}), "q", {})  # its pass still read "m": the index lagged
    assert writes.is_echo(KEY, "c") and writes.is_echo(KEY, "q")
    writes.remember(KEY, body("q", {}), "z", {})  # the index had caught up: "c" came back
    assert not writes.is_echo(KEY, "c") and not writes.is_echo(KEY, "q")
    assert writes.is_echo(KEY, "z")


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
