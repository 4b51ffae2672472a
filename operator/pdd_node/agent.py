"""The node topology agent (one pod per GPU node, a DaemonSet): scans the host's sysfs/procfs
and publishes the result on its own Node as the `pdd.dev/*` labels, which the operator's
planner, node selectors and `kubectl get nodes -L` read.

It reads the Node first and writes only the keys whose value changed, so a steady node costs
one GET per interval and no write (thousands of agents must not churn the API server or wake
every Node watcher). The patch body is built by pure functions; the loop around them is thin.

Needs: env NODE_NAME (downward API spec.nodeName), the host's /sys and /proc mounted read-only
(default /host/sys, /host/proc), and RBAC get + patch on nodes.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

from pdd_node.topology.annotation import RETIRED_TOPOLOGY_ANNOTATION, node_labels
from pdd_node.topology.model import NodeTopology
from pdd_node.topology.scan import scan

log = logging.getLogger("pdd_node.agent")

DEFAULT_INTERVAL_S = 60.0
# After a failed API call retry sooner than a full interval, but back off: 5 s, 10 s, 20 s...
FIRST_RETRY_S = 5.0

NodeMetadata = tuple[Mapping[str, str], Mapping[str, str]]  # (annotations, labels)


class NodeMetadataClient(Protocol):
    """The two calls the agent makes against its Node."""

    def read_node_metadata(self, name: str) -> NodeMetadata: ...

    def patch_node_metadata(self, name: str, patch: Mapping[str, Any]) -> None: ...


def metadata_patch(
    current_annotations: Mapping[str, str],
    current_labels: Mapping[str, str],
    topology: NodeTopology,
) -> dict[str, Any] | None:
    """A merge patch with the labels that differ from the Node's (and the removal of the
    annotation earlier agents wrote), or None when the Node already says what the scan found.
    Keys not ours are never touched."""
    metadata: dict[str, Any] = {}
    if RETIRED_TOPOLOGY_ANNOTATION in current_annotations:
        metadata["annotations"] = {RETIRED_TOPOLOGY_ANNOTATION: None}  # null: merge-patch delete
    if labels := _changed(current_labels, node_labels(topology)):
        metadata["labels"] = labels
    return {"metadata": metadata} if metadata else None


def _changed(current: Mapping[str, str], desired: Mapping[str, str]) -> dict[str, str]:
    return {key: value for key, value in desired.items() if current.get(key) != value}


def sync_once(client: NodeMetadataClient, node_name: str, topology: NodeTopology) -> bool:
    """Bring the Node's topology metadata up to date; True when it wrote."""
    annotations, labels = client.read_node_metadata(node_name)
    patch = metadata_patch(annotations, labels, topology)
    if patch is None:
        return False
    client.patch_node_metadata(node_name, patch)
    return True


def run_loop(
    client: NodeMetadataClient,
    node_name: str,
    scan_node: Callable[[], NodeTopology],
    interval_s: float,
    stop: threading.Event,
) -> None:
    """Scan and sync every interval until `stop` is set; API errors are logged and retried
    with backoff (the agent must outlive an API server restart)."""
    failures = 0
    while not stop.is_set():
        try:
            topology = scan_node()
            if sync_once(client, node_name, topology):
                log.info(
                    "node %s: published topology (%d GPUs, %d active RDMA NICs, gpudirect %s)",
                    node_name,
                    len(topology.gpus),
                    topology.active_nic_count,
                    topology.gpudirect,
                )
            failures = 0
            wait_s = interval_s
        except Exception as error:  # any API/transport error: keep the DaemonSet pod alive
            failures += 1
            wait_s = min(interval_s, FIRST_RETRY_S * 2 ** (failures - 1))
            log.warning("node %s: sync failed (%s); retrying in %.0f s", node_name, error, wait_s)
        stop.wait(wait_s)


def main(argv: list[str] | None = None) -> int:
    """`pdd-node agent [...]`; `argv` is what follows the subcommand."""
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    node_name = os.environ.get("NODE_NAME", "")
    if not node_name:
        log.error("NODE_NAME is not set: give the container env NODE_NAME from spec.nodeName")
        return 2
    # Imported only now, so the pure functions above load without the Kubernetes client.
    from pdd_kubeconfig import core_v1_api
    from pdd_node.kube import KubernetesNodeClient

    client = KubernetesNodeClient(core_v1_api(args.kubeconfig))
    stop = threading.Event()
    _stop_on_signals(stop)

    def scan_node() -> NodeTopology:
        return scan(args.sysfs_root, args.procfs_root)

    if args.once:
        sync_once(client, node_name, scan_node())
        return 0
    run_loop(client, node_name, scan_node, args.interval, stop)
    return 0


def _stop_on_signals(stop: threading.Event) -> None:
    def handle(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)


def _parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="pdd-node agent",
        description="Publish this node's GPU/NIC topology on its Node object.",
    )
    parser.add_argument("--sysfs-root", type=Path, default=Path("/host/sys"))
    parser.add_argument("--procfs-root", type=Path, default=Path("/host/proc"))
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S, help="seconds")
    parser.add_argument("--once", action="store_true", help="sync once and exit")
    parser.add_argument("--kubeconfig", default=None, help="default: in-cluster, then KUBECONFIG")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
