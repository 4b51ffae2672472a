"""What the node agent publishes on its Node: a few labels that node selectors, `kubectl get
nodes -L` and the operator's placement (`pdd.dev/gpudirect`) read.

Earlier agents also wrote the whole scan as the `pdd.dev/topology` annotation (~3 KB of JSON
per Node, sent to every Node watcher). Nothing read it: placement needs only the labels, the
preflight scans inside the pod, and `pdd-node scan` prints a node's scan on demand. The agent
now removes it where an earlier version left it.
"""

from __future__ import annotations

from pdd_node.topology.model import NodeTopology

GPUDIRECT_LABEL = "pdd.dev/gpudirect"
RDMA_NICS_LABEL = "pdd.dev/rdma-nics"
TOPOLOGY_VERSION_LABEL = "pdd.dev/topology-version"
RETIRED_TOPOLOGY_ANNOTATION = "pdd.dev/topology"


def node_labels(topology: NodeTopology) -> dict[str, str]:
    return {
        GPUDIRECT_LABEL: topology.gpudirect,
        RDMA_NICS_LABEL: str(topology.active_nic_count),
        TOPOLOGY_VERSION_LABEL: topology.version,
    }
