"""The Dockerfile: hadolint-clean, and its targets run the commands the chart and tests use.

No Docker engine is needed (none on the CI machine): hadolint parses the file, and the
assertions below read it against pyproject.toml and the chart.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from pdd_localcluster.runtime.images import KNOWN_IMAGES

from .support import ROOT

HADOLINT = Path(sys.executable).parent / "hadolint"
DOCKERFILES = [ROOT / "Dockerfile", ROOT / "tests" / "e2e" / "engine" / "Dockerfile"]


def stages(text: str) -> dict[str, str]:
    """Stage name -> its instructions."""
    parts = re.split(r"^FROM .* AS (\S+)\s*$", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_hadolint_clean(dockerfile: Path) -> None:
    config = ROOT / ".hadolint.yaml"
    result = subprocess.run(
        [str(HADOLINT), "--config", str(config), str(dockerfile)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_targets_run_the_console_scripts_as_non_root() -> None:
    text = (ROOT / "Dockerfile").read_text()
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    by_stage = stages(text)
    expected = {"operator": ("pdd-operator", '["run"]'), "sidecar": ("pdd-sidecar", '["serve"]')}
    for stage, (script, cmd) in expected.items():
        body = by_stage[stage]
        assert script in scripts
        assert f'ENTRYPOINT ["{script}"]' in body
        assert f"CMD {cmd}" in body
        assert "USER 65532:65532" in body  # the chart's runAsUser
    # The preflight init container and the node agent run the sidecar image as `pdd-node`.
    assert "pdd-node" in scripts


def test_the_local_runtime_runs_each_image_as_its_dockerfile_target_does() -> None:
    """The local runtime plays these images (a pod that sets only `args` relies on the
    image's ENTRYPOINT): its table must say what the Dockerfile says."""
    by_stage = stages((ROOT / "Dockerfile").read_text())
    for stage, repository in (
        ("operator", "ghcr.io/pdd-dev/pdd-operator"),
        ("sidecar", "ghcr.io/pdd-dev/pdd-sidecar"),
        ("router", "ghcr.io/pdd-dev/pdd-router"),
    ):
        fs = KNOWN_IMAGES[repository]
        body = by_stage[stage]
        entrypoint = re.search(r"^ENTRYPOINT (.+)$", body, flags=re.MULTILINE)
        cmd = re.search(r"^CMD (.+)$", body, flags=re.MULTILINE)
        assert list(fs.entrypoint) == (json.loads(entrypoint[1]) if entrypoint else [])
        assert list(fs.cmd) == (json.loads(cmd[1]) if cmd else [])


def test_base_image_is_pinned_by_digest() -> None:
    text = (ROOT / "Dockerfile").read_text()
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, flags=re.MULTILINE)
    assert base and re.fullmatch(r"python:3\.11-slim-bookworm@sha256:[0-9a-f]{64}", base[1])
    assert all(
        line.startswith("FROM ${PYTHON_IMAGE}") or " AS " in line
        for line in text.splitlines()
        if line.startswith("FROM ")
    )


def test_sidecar_gets_the_nixl_wheel_without_torch() -> None:
    body = stages((ROOT / "Dockerfile").read_text())["build-sidecar"]
    assert "--no-deps" in body and "nixl-cu12==1.5.1" in body and "numpy" in body
    assert "torch" not in body


def test_dockerignore_keeps_what_the_build_copies() -> None:
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert ignore[ignore.index("*") :].count("*") == 1  # everything else is excluded
    text = (ROOT / "Dockerfile").read_text()
    for sources in re.findall(r"^COPY (?!--from)(.+) \S+$", text, flags=re.MULTILINE):
        for source in sources.split():
            assert f"!{source}" in ignore, f"{source} is COPYed but excluded by .dockerignore"
