"""`pdd-operator topology scan`."""

from __future__ import annotations

import json

import pytest

from helpers.topology import FIXTURES
from pdd_operator.topology.cli import scan_main
from pdd_operator.topology.model import NodeTopology


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
