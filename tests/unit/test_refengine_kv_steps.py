"""The reference engine's KV-transfer step log: a failed or slow transfer says which step it
reached and how long each took; a quick one logs nothing."""

from __future__ import annotations

import logging

import pytest

from pdd_refengine.engine import KvSteps


def test_a_quick_transfer_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    steps = KvSteps("KV pull from p")
    steps.done("handshake")
    with caplog.at_level(logging.WARNING):
        steps.report()
    assert caplog.records == []


def test_a_failed_transfer_names_its_steps_and_the_error(caplog: pytest.LogCaptureFixture) -> None:
    steps = KvSteps("KV pull from p")
    steps.done("handshake")
    with caplog.at_level(logging.WARNING):
        steps.report(TimeoutError("no answer"))
        steps.report()  # once only
    (record,) = caplog.records
    assert "KV pull from p failed (TimeoutError: no answer)" in record.getMessage()
    assert "steps done: handshake" in record.getMessage()


def test_a_slow_transfer_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    steps = KvSteps("KV pull from p")
    steps.started -= KvSteps.SLOW_S
    with caplog.at_level(logging.WARNING):
        steps.report()
    (record,) = caplog.records
    assert "KV pull from p slow" in record.getMessage()
    assert "steps done: none" in record.getMessage()
