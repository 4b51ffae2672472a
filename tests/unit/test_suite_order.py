"""The modules tests/conftest.py starts first on parallel workers exist: a renamed one would
silently fall back to the end of the queue."""

from __future__ import annotations

from pathlib import Path

from helpers.suite_order import LONG_MODULES, POD_HEAVY_MODULES, POD_HEAVY_UNIT, work_unit

ROOT = Path(__file__).resolve().parents[2]


def test_every_long_module_named_first_exists() -> None:
    missing = [module for module in LONG_MODULES if not (ROOT / module).is_file()]
    assert missing == []


def test_the_pod_heavy_modules_are_one_unit_and_the_rest_one_per_module() -> None:
    heavy = {work_unit(f"{module}::test_x[a]") for module in POD_HEAVY_MODULES}
    assert heavy == {POD_HEAVY_UNIT}
    light = "tests/integration/test_admission.py"
    assert light not in POD_HEAVY_MODULES
    assert work_unit(f"{light}::test_y") == light
