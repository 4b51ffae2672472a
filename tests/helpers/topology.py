from __future__ import annotations

from functools import cache
from pathlib import Path

from pdd_node.topology.model import NodeTopology
from pdd_node.topology.scan import scan

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "topology"


@cache
def scan_fixture(name: str) -> NodeTopology:
    """The scanned topology of tests/fixtures/topology/<name> (cached: topologies are frozen)."""
    root = FIXTURES / name
    assert root.is_dir(), f"no fixture tree {root}; run tests/fixtures/topology/make_fixtures.py"
    return scan(root / "sys", root / "proc")
