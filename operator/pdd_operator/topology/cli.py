"""`pdd-operator topology scan`: print a node's scan, or the labels the node agent would publish,
for debugging a node (run it in a pod with the host's /sys and /proc mounted, or on the node)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pdd_operator.topology.annotation import node_labels
from pdd_operator.topology.scan import scan


def scan_main(argv: list[str]) -> int:
    """Entry point for `topology scan`; `argv` is what follows `scan` on the command line."""
    parser = argparse.ArgumentParser(
        prog="pdd-operator topology scan",
        description="Scan GPUs, RDMA NICs and their PCIe distances from sysfs/procfs.",
    )
    parser.add_argument("--sysfs-root", type=Path, default=Path("/sys"), help="default: /sys")
    parser.add_argument("--procfs-root", type=Path, default=Path("/proc"), help="default: /proc")
    parser.add_argument(
        "--output",
        choices=("model", "node-metadata"),
        default="model",
        help="model: the topology as indented JSON (default); node-metadata: the labels the "
        "node agent writes",
    )
    args = parser.parse_args(argv)
    topology = scan(args.sysfs_root, args.procfs_root)
    if args.output == "model":
        print(topology.model_dump_json(indent=2))
    else:
        print(json.dumps({"labels": node_labels(topology)}, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(scan_main(sys.argv[1:]))
