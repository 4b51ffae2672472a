"""The Node annotation and labels the agent publishes."""

from __future__ import annotations

import json

import pytest

from helpers.topology import scan_fixture
from pdd_operator.topology.annotation import (
    GPUDIRECT_LABEL,
    RDMA_NICS_LABEL,
    TOPOLOGY_ANNOTATION,
    TOPOLOGY_VERSION_LABEL,
    TopologyAnnotationError,
    from_annotation,
    node_annotations,
    node_labels,
    to_annotation,
)

FIXTURE_NAMES = [
    "h100-hgx",
    "nics-on-socket0",
    "port-down",
    "no-rdma",
    "old-kernel",
    "proprietary-no-peermem",
    "single-gpu-vm",
]


@pytest.mark.parametrize("fixture", FIXTURE_NAMES)
def test_round_trip(fixture: str) -> None:
    topology = scan_fixture(fixture)
    assert from_annotation(to_annotation(topology)) == topology


def test_annotation_is_compact_and_versioned() -> None:
    value = to_annotation(scan_fixture("h100-hgx"))
    document = json.loads(value)
    assert document["version"] == "v1"
    assert "pairs" not in document
    assert document["distance_matrix"][0] == "PIX NODE NODE NODE SYS SYS SYS SYS"
    assert '": ' not in value and '", "' not in value  # no whitespace between JSON tokens
    assert len(value) < 3500  # 8 GPUs + 8 NICs; pairs as objects alone would be ~3 KB more


def test_annotation_is_deterministic() -> None:
    first = to_annotation(scan_fixture("h100-hgx"))
    reparsed = to_annotation(from_annotation(first))
    assert first == reparsed


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


def test_label_and_annotation_keys() -> None:
    assert (GPUDIRECT_LABEL, RDMA_NICS_LABEL, TOPOLOGY_VERSION_LABEL) == (
        "pdd.dev/gpudirect",
        "pdd.dev/rdma-nics",
        "pdd.dev/topology-version",
    )
    assert list(node_annotations(scan_fixture("no-rdma"))) == [TOPOLOGY_ANNOTATION]
    assert TOPOLOGY_ANNOTATION == "pdd.dev/topology"


def _h100_document() -> dict[str, object]:
    document: dict[str, object] = json.loads(to_annotation(scan_fixture("h100-hgx")))
    return document


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(version="v2"), "version 'v2'"),
        (lambda d: d.pop("version"), "version None"),
        (lambda d: d.update(distance_matrix=["PIX"]), "one row per GPU"),
        (lambda d: d.update(distance_matrix=["PIX NODE"] * 8), "must have 8 classes"),
        (lambda d: d.update(distance_matrix=["FAR " * 8] * 8), "unknown distance class"),
        (lambda d: d.update(gpus="many"), "is invalid"),
        (lambda d: d.update(surprise=1), "is invalid"),
    ],
)
def test_bad_annotations_are_rejected_with_a_reason(mutate: object, message: str) -> None:
    document = _h100_document()
    mutate(document)  # type: ignore[operator]
    with pytest.raises(TopologyAnnotationError, match=message):
        from_annotation(json.dumps(document))


@pytest.mark.parametrize(("value", "message"), [("{", "not JSON"), ("[]", "not a JSON object")])
def test_non_objects_are_rejected(value: str, message: str) -> None:
    with pytest.raises(TopologyAnnotationError, match=message):
        from_annotation(value)


def test_missing_pairs_survive_the_round_trip() -> None:
    topology = scan_fixture("h100-hgx")
    partial = topology.model_copy(update={"pairs": topology.pairs[:3]})
    document = json.loads(to_annotation(partial))
    assert document["distance_matrix"][0] == "PIX NODE NODE - - - - -"
    assert from_annotation(to_annotation(partial)) == partial
