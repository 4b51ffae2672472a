"""`pdd-node`: its `scan` command, and the dispatch to the others."""

from __future__ import annotations

import json

import pytest

from helpers.topology import FIXTURES
from pdd_node.cli import main, scan_main
from pdd_node.topology.model import NodeTopology


def roots(name: str) -> list[str]:
    return [
        "--sysfs-root",
        str(FIXTURES / name / "sys"),
        "--procfs-root",
        str(FIXTURES / name / "proc"),
    ]


def test_prints_the_model_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert scan_main(roots("h100-hgx")) == 0
    topology = NodeTopology.model_validate_json(capsys.readouterr().out)
    assert len(topology.gpus) == 8
    assert topology.gpudirect == "dmabuf"


def test_prints_node_metadata(capsys: pytest.CaptureFixture[str]) -> None:
    assert scan_main([*roots("old-kernel"), "--output", "node-metadata"]) == 0
    metadata = json.loads(capsys.readouterr().out)
    assert metadata == {
        "labels": {
            "pdd.dev/gpudirect": "peermem",
            "pdd.dev/rdma-nics": "8",
            "pdd.dev/topology-version": "v1",
        }
    }


def test_rejects_unknown_options() -> None:
    with pytest.raises(SystemExit):
        scan_main(["--no-such-flag"])


def test_pdd_node_runs_scan(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", *roots("h100-hgx")]) == 0
    assert NodeTopology.model_validate_json(capsys.readouterr().out).gpudirect == "dmabuf"


@pytest.mark.parametrize("command", ["preflight", "agent"])
def test_pdd_node_hands_the_rest_to_the_command(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: pdd-node {command} ")


def test_pdd_node_rejects_unknown_commands() -> None:
    with pytest.raises(SystemExit) as exited:
        main(["topology", "scan"])
    assert exited.value.code == 2
