"""Drift corrections (pure): when a child counts as drifted, and what a correction remembers."""

from __future__ import annotations

import pytest

from pdd_operator.status.corrections import Correction, CorrectionLog, drifted
from pdd_operator.status.observe import ChildSummary

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
    log = CorrectionLog()
    assert log.record(KEY, DECODE, DONE)
    assert not log.record(KEY, DECODE, DONE)
    assert log.record(KEY, DECODE, Correction("want", "want", "rv-12", "rv-11"))
    assert log.of(KEY)[DECODE].version == "rv-12"
    assert log.of(("team-b", "llama")) == {}


def test_corrections_toward_a_digest_no_longer_rendered_are_forgotten() -> None:
    log = CorrectionLog()
    log.record(KEY, DECODE, DONE)
    log.record(KEY, PREFILL, Correction("p", "p", "rv-3", "rv-2"))
    log.keep_wanted(KEY, {DECODE: "want", PREFILL: "p2"})
    assert set(log.of(KEY)) == {DECODE}
    log.keep_wanted(KEY, {PREFILL: "p2"})  # the decode StatefulSet is no longer rendered
    assert log.of(KEY) == {}
    log.record(KEY, DECODE, DONE)
    log.forget(KEY)
    assert log.of(KEY) == {}
