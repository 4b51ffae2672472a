"""The modules tests/conftest.py starts first on parallel workers exist: a renamed one would
silently fall back to the end of the queue."""

from __future__ import annotations

from pathlib import Path

from helpers.suite_order import LONG_MODULES

ROOT = Path(__file__).resolve().parents[2]


def test_every_long_module_named_first_exists() -> None:
    missing = [module for module in LONG_MODULES if not (ROOT / module).is_file()]
    assert missing == []
