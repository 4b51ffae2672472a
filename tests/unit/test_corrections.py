"""Drift corrections (pure): when a child counts as drifted, and what a correction remembers."""

from __future__ import annotations

import pytest

from pdd_operator.reconcile.memory import Memory
from pdd_operator.status.corrections import Correction, drifted, keep_wanted, recorded
from pdd_operator.status.observe import ChildKey, ChildSummary

DECODE = ("apps/v1", "StatefulSet", "llama-decode")
PREFILL = ("apps/v1", "StatefulSet", "llama-prefill")
KEY = ("team-a", "llama")
# put back to digest "want"; the server answered with digest "spelt" at version "rv-9";
# the drifted copy the pass read was at "rv-5"
DONE = Correction(wanted="want", result="spelt", version="rv-9", read="rv-5")


def seen(fingerprint: str, version: str = "rv-7") -> ChildSummary:
    return ChildSummary(
        DECODE, "h", "decode", owned_fingerprint=fingerprint, resource_version=version
    )


@pytest.mark.parametrize(
    ("child", "correction", "expected"),
    [
        pytest.param(seen("want"), None, False, id="as-rendered"),
        pytest.param(seen("scaled"), None, True, id="changed-by-hand"),
        pytest.param(seen(""), None, True, id="owned-by-another-manager"),
        pytest.param(seen("spelt"), DONE, False, id="the-servers-spelling-of-the-correction"),
        pytest.param(seen("scaled", "rv-5"), DONE, False, id="the-copy-the-correction-answered"),
        pytest.param(seen("scaled", "rv-11"), DONE, True, id="changed-by-hand-again"),
        pytest.param(
            seen("spelt"),
            Correction(wanted="older-render", result="spelt", version="rv-9", read="rv-5"),
            True,
            id="a-correction-toward-another-render-says-nothing",
        ),
    ],
)
def test_drifted(child: ChildSummary, correction: Correction | None, expected: bool) -> None:
    assert drifted(child, "want", correction) is expected


def test_a_correction_that_returned_the_same_version_changed_nothing() -> None:
    done: dict[ChildKey, Correction] = {}
    assert recorded(done, DECODE, DONE)
    assert not recorded(done, DECODE, DONE)
    assert recorded(done, DECODE, Correction("want", "want", "rv-12", "rv-11"))
    assert done[DECODE].version == "rv-12"


def test_corrections_toward_a_digest_no_longer_rendered_are_forgotten() -> None:
    done: dict[ChildKey, Correction] = {}
    recorded(done, DECODE, DONE)
    recorded(done, PREFILL, Correction("p", "p", "rv-3", "rv-2"))
    keep_wanted(done, {DECODE: "want", PREFILL: "p2"})
    assert set(done) == {DECODE}
    keep_wanted(done, {PREFILL: "p2"})  # the decode StatefulSet is no longer rendered
    assert done == {}


def test_a_deployments_corrections_live_and_go_with_its_record() -> None:
    memory = Memory()
    recorded(memory.record(KEY).corrections, DECODE, DONE)
    assert memory.find(("team-b", "llama")) is None
    memory.forget(KEY)
    assert memory.find(KEY) is None and memory.record(KEY).corrections == {}
