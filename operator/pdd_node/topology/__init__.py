"""Node topology: GPUs, RDMA NICs, PCIe distances and GPUDirect RDMA facts (a pure layer: it
reads files given to it and imports no Kubernetes client)."""

from pdd_node.topology.annotation import node_labels
from pdd_node.topology.model import (
    DISTANCE_CLASSES,
    SCHEMA_VERSION,
    DistanceClass,
    Gpu,
    GpuNicPair,
    NodeTopology,
    RdmaNic,
    RdmaPort,
)
from pdd_node.topology.nics import (
    PortChoice,
    choose_ports,
    gpudirect_mode,
    link_limit_gbytes_per_s,
    select_nics,
    ucx_net_devices,
)
from pdd_node.topology.scan import scan

__all__ = [
    "DISTANCE_CLASSES",
    "SCHEMA_VERSION",
    "DistanceClass",
    "Gpu",
    "GpuNicPair",
    "NodeTopology",
    "PortChoice",
    "RdmaNic",
    "RdmaPort",
    "choose_ports",
    "gpudirect_mode",
    "link_limit_gbytes_per_s",
    "node_labels",
    "scan",
    "select_nics",
    "ucx_net_devices",
]
