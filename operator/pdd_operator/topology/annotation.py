"""The topology as the node agent publishes it on its Node: one versioned JSON annotation and a
few labels that node selectors and `kubectl get nodes -L` can use.

Annotation `pdd.dev/topology` (format v1): the NodeTopology's JSON with None fields left out,
no whitespace, and the GPU-NIC pairs replaced by a distance matrix -- one string per GPU (in
`gpus` order) of space-separated classes (in `nics` order), like `nvidia-smi topo -m`. An
8-GPU, 8-NIC node is about 3 KB, and the operator caches every Node, so compactness counts.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from pdd_operator.topology.model import (
    DISTANCE_CLASSES,
    SCHEMA_VERSION,
    DistanceClass,
    GpuNicPair,
    NodeTopology,
)

TOPOLOGY_ANNOTATION = "pdd.dev/topology"
GPUDIRECT_LABEL = "pdd.dev/gpudirect"
RDMA_NICS_LABEL = "pdd.dev/rdma-nics"
TOPOLOGY_VERSION_LABEL = "pdd.dev/topology-version"

_MATRIX_KEY = "distance_matrix"
_NO_PAIR = "-"
_CLASS_BY_NAME: dict[str, DistanceClass] = {name: name for name in DISTANCE_CLASSES}


class TopologyAnnotationError(ValueError):
    """The annotation is not a topology this operator can read."""


def to_annotation(topology: NodeTopology) -> str:
    """Compact, deterministic JSON: the same topology always gives the same string, so the
    agent can compare strings to skip writes."""
    document: dict[str, Any] = topology.model_dump(mode="json", exclude_none=True)
    del document["pairs"]
    document[_MATRIX_KEY] = _distance_matrix(topology)
    return json.dumps(document, separators=(",", ":"), sort_keys=True)


def from_annotation(value: str) -> NodeTopology:
    """Parse an annotation written by `to_annotation`; raises TopologyAnnotationError."""
    try:
        document = json.loads(value)
    except json.JSONDecodeError as error:
        raise TopologyAnnotationError(f"{TOPOLOGY_ANNOTATION} is not JSON: {error}") from error
    if not isinstance(document, dict):
        raise TopologyAnnotationError(f"{TOPOLOGY_ANNOTATION} is not a JSON object")
    version = document.get("version")
    if version != SCHEMA_VERSION:
        raise TopologyAnnotationError(
            f"{TOPOLOGY_ANNOTATION} has version {version!r}; this operator reads "
            f"{SCHEMA_VERSION!r}: upgrade the operator or the node agent so they match"
        )
    matrix = document.pop(_MATRIX_KEY, [])
    try:
        topology = NodeTopology.model_validate(document)
        pairs = _pairs_from_matrix(topology, matrix)
        return topology.model_copy(update={"pairs": pairs})
    except ValidationError as error:
        raise TopologyAnnotationError(f"{TOPOLOGY_ANNOTATION} is invalid: {error}") from error


def node_labels(topology: NodeTopology) -> dict[str, str]:
    return {
        GPUDIRECT_LABEL: topology.gpudirect,
        RDMA_NICS_LABEL: str(topology.active_nic_count),
        TOPOLOGY_VERSION_LABEL: topology.version,
    }


def node_annotations(topology: NodeTopology) -> dict[str, str]:
    return {TOPOLOGY_ANNOTATION: to_annotation(topology)}


def _distance_matrix(topology: NodeTopology) -> list[str]:
    distances = {(pair.gpu, pair.nic): pair.distance for pair in topology.pairs}
    return [
        " ".join(distances.get((gpu.index, nic.name), _NO_PAIR) for nic in topology.nics)
        for gpu in topology.gpus
    ]


def _pairs_from_matrix(topology: NodeTopology, matrix: object) -> tuple[GpuNicPair, ...]:
    if not isinstance(matrix, list) or len(matrix) != len(topology.gpus):
        raise TopologyAnnotationError(
            f"{_MATRIX_KEY} must be a list with one row per GPU ({len(topology.gpus)})"
        )
    pairs: list[GpuNicPair] = []
    for gpu, row in zip(topology.gpus, matrix, strict=True):
        cells = row.split() if isinstance(row, str) else []
        if len(cells) != len(topology.nics):
            raise TopologyAnnotationError(
                f"{_MATRIX_KEY} row for GPU {gpu.index} must have {len(topology.nics)} classes"
            )
        for nic, cell in zip(topology.nics, cells, strict=True):
            if cell == _NO_PAIR:
                continue
            distance = _CLASS_BY_NAME.get(cell)
            if distance is None:
                raise TopologyAnnotationError(f"unknown distance class {cell!r} in {_MATRIX_KEY}")
            pairs.append(GpuNicPair(gpu=gpu.index, nic=nic.name, distance=distance))
    return tuple(pairs)
