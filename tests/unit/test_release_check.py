"""hack/release_check.py: a release whose versions disagree is refused, each place named."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("release_check", ROOT / "hack/release_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass resolves annotations through it
    spec.loader.exec_module(module)
    return module


check = load_check()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of what the check reads: the version files and the shipped folders."""
    for name in ("pyproject.toml", "Dockerfile", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    for folder in ("operator", "crds", "charts", "manifests", "examples", "docs"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("*.pyc"))
    return tmp_path


def replace_in(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_the_tree_agrees_with_itself_and_its_tag(tree: Path) -> None:
    version = check.project_version(tree)
    assert check.disagreements(tree) == []
    assert check.disagreements(tree, f"v{version}") == []
    assert len(check.image_references(tree)) >= 10  # the CRDs, chart, manifests, docs, code


@pytest.mark.parametrize(
    ("path", "old", "new", "named"),
    [
        ("charts/pdd-operator/Chart.yaml", 'appVersion: "0.1.0"', 'appVersion: "0.1.1"',
         "Chart.yaml: appVersion 0.1.1"),
        ("charts/pdd-operator/Chart.yaml", "version: 0.1.0", "version: 0.2.0",
         "Chart.yaml: version 0.2.0"),
        ("Dockerfile", 'image.version="0.1.0"', 'image.version="0.0.9"',
         "Dockerfile: org.opencontainers.image.version 0.0.9"),
        ("operator/pdd_operator/rendering/context.py", "pdd-sidecar:0.1.0", "pdd-sidecar:latest",
         "operator/pdd_operator/rendering/context.py:"),
        ("examples/vllm-2p4d.yaml", "pdd-router:0.1.0", "pdd-router:0.0.1",
         "pdd-router:0.0.1, not :0.1.0"),
    ],
)  # fmt: skip
def test_each_place_that_disagrees_is_named(
    tree: Path, path: str, old: str, new: str, named: str
) -> None:
    replace_in(tree / path, old, new)
    problems = check.disagreements(tree)
    assert len(problems) == 1 and named in problems[0], problems


def test_a_tag_of_another_version_is_refused(tree: Path) -> None:
    assert check.disagreements(tree, "v0.1.0-rc1") == [
        "the tag v0.1.0-rc1 is not v0.1.0 (pyproject.toml's version)"
    ]


def test_the_command_says_what_to_bump(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    replace_in(tree / "pyproject.toml", 'version = "0.1.0"', 'version = "0.2.0"')
    assert check.main(["--root", str(tree)]) == 1
    out = capsys.readouterr().out
    assert "disagree with 0.2.0" in out and "make generate" in out
