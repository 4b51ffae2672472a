"""The CI and release workflows (.github/workflows), which cannot run here: actionlint (built
from the Go module proxy, hack/fetch-actionlint.sh) with shellcheck over their scripts, and
what they build and sign read against the Dockerfile, the chart and the release check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdd_operator.api.v1alpha1 import DEFAULT_ROUTER_IMAGE

from .support import ROOT
from .test_dockerfile import stages

WORKFLOWS = ROOT / ".github" / "workflows"
SHELLCHECK = Path(sys.executable).parent / "shellcheck"
RELEASE_CHECK = ROOT / "hack" / "release_check.py"
# The Dockerfile targets a release publishes (the others are build stages).
RELEASED_TARGETS = ["operator", "sidecar", "router"]


@pytest.fixture(scope="module")
def actionlint() -> Path:
    built = subprocess.run(
        ["bash", str(ROOT / "hack" / "fetch-actionlint.sh")],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(built.stdout.strip())


def lint(actionlint: Path, *files: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(actionlint),
            "-no-color",
            "-oneline",
            "-shellcheck",
            str(SHELLCHECK),
            *map(str, files),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )


def workflow(name: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((WORKFLOWS / name).read_text())
    return document


def test_the_workflows_pass_actionlint_and_shellcheck(actionlint: Path) -> None:
    files = sorted(WORKFLOWS.glob("*.yml"))
    assert [f.name for f in files] == ["ci.yml", "release.yml"]
    result = lint(actionlint, *files)
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_here_does_find_a_broken_workflow(actionlint: Path, tmp_path: Path) -> None:
    """The check above can fail: an unknown expression and an unquoted variable are found."""
    broken = tmp_path / "broken.yml"
    broken.write_text(
        "on: push\njobs:\n  a:\n    runs-on: ubuntu-24.04\n    steps:\n"
        "      - run: echo ${{ github.nope }} $HOME/$1\n"
    )
    result = lint(actionlint, broken)
    assert result.returncode == 1
    assert "nope" in result.stdout and "SC2086" in result.stdout


def test_ci_runs_what_ci_here_runs() -> None:
    steps = workflow("ci.yml")["jobs"]["test"]["steps"]
    assert any("bash .ci/run" in step.get("run", "") for step in steps)
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_nothing_is_built_before_the_versions_are_checked() -> None:
    jobs = workflow("release.yml")["jobs"]
    check = " ".join(step.get("run", "") for step in jobs["check"]["steps"])
    assert 'release_check.py --tag "$GITHUB_REF_NAME"' in check
    assert jobs["images"]["needs"] == "check"
    assert set(jobs["chart"]["needs"]) == {"check", "images"}


def test_every_released_target_is_built_multi_arch_with_sbom_provenance_and_a_signature() -> None:
    images = workflow("release.yml")["jobs"]["images"]
    assert images["strategy"]["matrix"]["target"] == RELEASED_TARGETS
    assert set(RELEASED_TARGETS) <= set(stages((ROOT / "Dockerfile").read_text()))
    build = next(s for s in images["steps"] if s.get("id") == "build")["with"]
    assert set(build["platforms"].split(",")) == {"linux/amd64", "linux/arm64"}
    assert build["sbom"] is True and build["provenance"] == "mode=max"
    assert build["target"] == "${{ matrix.target }}"
    signing = " ".join(step.get("run", "") for step in images["steps"])
    assert 'cosign sign --yes "$IMAGE@$DIGEST"' in signing  # by digest, never by tag
    assert images["permissions"]["id-token"] == "write"  # keyless: the OIDC identity signs


def test_images_and_chart_go_where_the_chart_and_the_operator_pull_from() -> None:
    release = workflow("release.yml")
    registry = release["env"]["REGISTRY"]
    values = yaml.safe_load((ROOT / "charts" / "pdd-operator" / "values.yaml").read_text())
    assert values["image"]["repository"] == f"{registry}/pdd-operator"
    assert values["sidecarImage"]["repository"] == f"{registry}/pdd-sidecar"
    assert DEFAULT_ROUTER_IMAGE.startswith(f"{registry}/pdd-router:")  # spec.router.image
    chart = " ".join(step.get("run", "") for step in release["jobs"]["chart"]["steps"])
    assert "oci://$REGISTRY/charts" in chart and "cosign sign --yes" in chart


def test_the_tree_agrees_on_its_version_and_a_wrong_tag_is_refused() -> None:
    version = yaml.safe_load((ROOT / "charts" / "pdd-operator" / "Chart.yaml").read_text())[
        "version"
    ]

    def check(tag: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, str(RELEASE_CHECK), "--tag", tag]
        return subprocess.run(argv, capture_output=True, text=True)

    agreed = check(f"v{version}")
    assert agreed.returncode == 0, agreed.stdout
    refused = check("v99.0.0")
    assert refused.returncode == 1
    assert f"the tag v99.0.0 is not v{version}" in refused.stdout
