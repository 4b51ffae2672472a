"""The committed fixture trees are exactly what make_fixtures.py generates."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from helpers.topology import FIXTURES


def snapshot(root: Path) -> dict[str, str]:
    """relative path -> "link:<target>" / "file:<content>" for every entry under root."""
    entries: dict[str, str] = {}
    for directory, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(directory) / name
            relative = str(path.relative_to(root))
            if path.is_symlink():
                entries[relative] = f"link:{os.readlink(path)}"
            elif path.is_file():
                entries[relative] = f"file:{path.read_text()}"
    return entries


def test_committed_trees_match_the_generator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = importlib.util.spec_from_file_location("make_fixtures", FIXTURES / "make_fixtures.py")
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "make_fixtures", generator)  # dataclasses look it up
    spec.loader.exec_module(generator)

    generator.generate(tmp_path)

    for name in generator.FIXTURES:
        committed, fresh = snapshot(FIXTURES / name), snapshot(tmp_path / name)
        assert fresh, f"generator wrote nothing for {name}"
        assert committed == fresh, (
            f"tests/fixtures/topology/{name} drifted from make_fixtures.py: run "
            "`python tests/fixtures/topology/make_fixtures.py` and commit the trees"
        )
