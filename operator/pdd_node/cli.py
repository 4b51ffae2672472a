"""`pdd-node`: scan | preflight | agent -- what runs on a GPU node.

`scan` prints a node's scan, or the labels the node agent would publish, for debugging a node
(run it in a pod with the host's /sys and /proc mounted, or on the node itself); `preflight` is
the engine pod's init container; `agent` is the topology DaemonSet. Each takes its own flags
(`pdd-node CMD --help`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from pdd_node.topology.annotation import node_labels
from pdd_node.topology.scan import scan

COMMANDS = ("scan", "preflight", "agent")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="pdd-node", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("command", choices=COMMANDS)
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the command's own flags")
    parsed = parser.parse_args(sys.argv[1:] if argv is None else argv)
    rest: list[str] = parsed.args
    if parsed.command == "scan":
        return scan_main(rest)
    if parsed.command == "preflight":
        from pdd_node.preflight import main as preflight_main

        return preflight_main(rest)
    # Imported only here: the agent pulls in the Kubernetes client, the others need none.
    from pdd_node.agent import main as agent_main

    return agent_main(rest)


def scan_main(argv: list[str]) -> int:
    """`pdd-node scan`; `argv` is what follows `scan` on the command line."""
    parser = argparse.ArgumentParser(
        prog="pdd-node scan",
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
    sys.exit(main())
