"""Polling helpers with a deadline and a clear failure message (tests only)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    check: Callable[[], T], timeout: float = 60, interval: float = 0.3, what: str = ""
) -> T:
    deadline = time.time() + timeout
    last: object = None
    while time.time() < deadline:
        try:
            result = check()
            if result:
                return result
            last = result
        except Exception as err:  # keep polling; report the last error on timeout
            last = err
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or check}: last={last!r}")
