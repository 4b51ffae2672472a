"""What the node agent publishes on its Node: a few labels that node selectors, `kubectl get
nodes -L` and the operator's placement (`pdd.dev/gpudirect`) read.

Earlier agents also wrote the whole scan as the `pdd.dev/topology` annotation (~3 KB of JSON
per Node, sent to every Node watcher). Nothing read it: placement needs only the labels, the
preflight scans inside the pod, and `pdd-node scan` prints a node's scan on demand. The agent
now removes it where an earlier version left it.
"""

from __future__ import annotations

from pdd_contract.labels import LABEL_GPUDIRECT, LABEL_RDMA_NICS, LABEL_TOPOLOGY_VERSION
from pdd_node.topology.model import NodeTopology

# Only the agent still knows this key, to delete it: nothing else reads or writes it.
RETIRED_TOPOLOGY_ANNOTATION = "pdd.dev/topology"


def node_labels(topology: NodeTopology) -> dict[str, str]:
    return {
        LABEL_GPUDIRECT: topology.gpudirect,
        LABEL_RDMA_NICS: str(topology.active_nic_count),
        LABEL_TOPOLOGY_VERSION: topology.version,
    }
