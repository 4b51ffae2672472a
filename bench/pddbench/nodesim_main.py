"""The node simulator in a process of its own (so its threads do not share a GIL with the
benchmark's clients and watches). The nodes already exist: the cluster started from a
snapshot taken after they were registered, so only the in-memory state is rebuilt."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import threading
from pathlib import Path

from pdd_localcluster.fleet_activity import FleetActivity
from pdd_localcluster.nodes import SimNode
from pdd_localcluster.nodesim import NodeSimulator


class PreRegisteredSimulator(NodeSimulator):
    """Skips registration: the Nodes (Ready, untainted, with addresses) are in the snapshot.
    Node addresses are handed out in fleet order, the same as when they were registered."""

    def _register_node(self, node: SimNode) -> None:
        return None


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--fleet", required=True)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--ready-file", required=True)
    p.add_argument("--stats-file", required=True)
    p.add_argument("--activity", default="{}", help="FleetActivity fields as JSON")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    nodes = [
        SimNode(n["name"], labels=n["labels"], capacity=n["capacity"])
        for n in json.loads(Path(args.fleet).read_text())
    ]
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    fields = json.loads(args.activity)
    if fields.get("pod_stage_delays_s") is not None:
        fields["pod_stage_delays_s"] = tuple(fields["pod_stage_delays_s"])
    activity = FleetActivity(**fields)
    with PreRegisteredSimulator(
        args.kubeconfig, nodes, workers=args.workers, activity=activity
    ) as sim:
        Path(args.ready_file).write_text("ready\n")
        while not stop.wait(2):
            Path(args.stats_file).write_text(json.dumps(sim.stats.as_dict()))
        Path(args.stats_file).write_text(json.dumps(sim.stats.as_dict()))


if __name__ == "__main__":
    main()
