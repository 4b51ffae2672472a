"""`make generate` owns crds/, the chart's CRDs and child RBAC rules, manifests/ and
docs/api.md: the committed files are what it writes, its output is deterministic, and its
drift check catches a changed, missing or stray file."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pdd_operator.generate import generate_all, render_manifests

from .support import CHART, MANIFESTS, ROOT


def test_committed_files_match_the_generator() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pdd_operator.cli", "generate", "--check", "--root", str(ROOT)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


def test_manifests_are_deterministic() -> None:
    assert render_manifests(CHART) == render_manifests(CHART)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for part in ("crds", "charts", "manifests", "docs"):
        shutil.copytree(ROOT / part, tmp_path / part)
    return tmp_path


def test_check_catches_changed_missing_and_stray_files(tree: Path) -> None:
    assert generate_all(str(tree), check=True) == 0
    (tree / "manifests" / "deployment.yaml").write_text("# edited by hand\n")
    (tree / "manifests" / "service.yaml").unlink()
    (tree / "manifests" / "leftover.yaml").write_text("kind: ConfigMap\n")
    (tree / "charts" / "pdd-operator" / "crds" / "pdd.dev_pddeployments.yaml").write_text("x\n")
    assert generate_all(str(tree), check=True) == 1
    # Writing repairs all four, and removes the stray file.
    assert generate_all(str(tree)) == 0
    assert not (tree / "manifests" / "leftover.yaml").exists()
    assert generate_all(str(tree), check=True) == 0
    for path in MANIFESTS.rglob("*"):
        if path.is_file():
            assert (tree / path.relative_to(ROOT)).read_text() == path.read_text()


def test_manifests_follow_the_chart(tree: Path) -> None:
    values = tree / "charts" / "pdd-operator" / "values.yaml"
    values.write_text(values.read_text().replace("resyncSeconds: 300", "resyncSeconds: 120"))
    assert generate_all(str(tree), check=True) == 1
    assert generate_all(str(tree)) == 0
    assert "--resync-seconds=120" in (tree / "manifests" / "deployment.yaml").read_text()
