"""The Node labels the agent publishes."""

from __future__ import annotations

import pytest

from helpers.topology import scan_fixture
from pdd_contract.labels import LABEL_GPUDIRECT, LABEL_RDMA_NICS, LABEL_TOPOLOGY_VERSION
from pdd_node.topology.annotation import node_labels


@pytest.mark.parametrize(
    ("fixture", "labels"),
    [
        ("h100-hgx", {"pdd.dev/gpudirect": "dmabuf", "pdd.dev/rdma-nics": "8"}),
        ("port-down", {"pdd.dev/gpudirect": "dmabuf", "pdd.dev/rdma-nics": "7"}),
        ("nics-on-socket0", {"pdd.dev/gpudirect": "dmabuf", "pdd.dev/rdma-nics": "4"}),
        ("no-rdma", {"pdd.dev/gpudirect": "none", "pdd.dev/rdma-nics": "0"}),
        ("old-kernel", {"pdd.dev/gpudirect": "peermem", "pdd.dev/rdma-nics": "8"}),
        ("proprietary-no-peermem", {"pdd.dev/gpudirect": "none", "pdd.dev/rdma-nics": "8"}),
    ],
)
def test_labels(fixture: str, labels: dict[str, str]) -> None:
    assert node_labels(scan_fixture(fixture)) == {**labels, "pdd.dev/topology-version": "v1"}


def test_label_keys() -> None:
    assert (LABEL_GPUDIRECT, LABEL_RDMA_NICS, LABEL_TOPOLOGY_VERSION) == (
        "pdd.dev/gpudirect",
        "pdd.dev/rdma-nics",
        "pdd.dev/topology-version",
    )
