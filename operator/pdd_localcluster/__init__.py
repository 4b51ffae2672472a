"""A local Kubernetes control plane with simulated GPU nodes, for tests, demos and benchmarks.

`LocalControlPlane` runs the real etcd, kube-apiserver, kube-controller-manager and
kube-scheduler binaries on loopback; `NodeSimulator` stands in for the kubelets: it registers
Nodes with GPU capacity and labels and moves the pods bound to them to Running.
"""

from pdd_localcluster.controlplane import ControlPlaneStartError, LocalControlPlane
from pdd_localcluster.fleet_activity import FleetActivity
from pdd_localcluster.nodes import SimNode, gpu_fleet, gpu_node_labels
from pdd_localcluster.nodesim import InitOutcome, NodeSimulator

__all__ = [
    "ControlPlaneStartError",
    "FleetActivity",
    "InitOutcome",
    "LocalControlPlane",
    "NodeSimulator",
    "SimNode",
    "gpu_fleet",
    "gpu_node_labels",
]
