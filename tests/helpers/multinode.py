"""Multi-node deployments for unit tests: a spec, its rendered children, and a rank's
command line as the container's real start shell launches it."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path
from typing import Any

from helpers.factories import make_pdd
from pdd_contract.env import PDD_NODE_RANK
from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.rendering.children import render_children
from pdd_operator.rendering.context import RenderContext

TWO_NODES = {"replicas": 2, "gpusPerInstance": 8, "nodesPerInstance": 2}


def multinode(engine_type: str = "vllm", **patch: Any) -> PDDeployment:
    spec: dict[str, Any] = {
        "engine": {"type": engine_type, "image": "vllm/vllm-openai:v0.11.0"},
        "prefill": dict(TWO_NODES),
        "decode": {"replicas": 1, "gpusPerInstance": 8, "nodesPerInstance": 2},
    }
    spec.update(patch)
    return make_pdd(spec)


def children(pdd: PDDeployment) -> dict[tuple[str, str], dict[str, Any]]:
    return {(c["kind"], c["metadata"]["name"]): c for c in render_children(pdd, RenderContext())}


def engine_container(statefulset: dict[str, Any]) -> dict[str, Any]:
    containers = statefulset["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "engine")


def launched_argv(container: dict[str, Any], rank: int, tmp_path: Path) -> list[str]:
    """Run the container's real start shell with a stand-in engine that prints its argv."""
    printer = tmp_path / "engine"
    printer.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    printer.chmod(printer.stat().st_mode | stat.S_IEXEC)
    command, args = container["command"], container["args"]
    env = {"PATH": os.environ["PATH"], PDD_NODE_RANK: str(rank)}
    out = subprocess.run(
        [*command, str(printer), *args[1:]], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.splitlines()


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None
