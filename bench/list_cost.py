"""What listing costs the operator at start: every collection it lists, on a live cluster.

    .venv/bin/python bench/list_cost.py --kubeconfig PATH [--gc-threshold 700,10,10] [--page N]

Starts the operator's informers (informers/listwatch.py: the fleet, its own objects, the
StatefulSets' Events) against the cluster, waits until each was listed once, and prints the
seconds that took, the process's CPU (user and system), its peak RSS, its RSS once every
list was read, and the cycle collector's runs per generation. Read-only: nothing is written.
`--gc-threshold` sets the collector's thresholds first (the operator sets its own in
`cli._run`; Python's default is 700,10,10), `--page` the items per list page. Used on the
cluster of a `bench/run.py` arm at 1,000 deployments, in its idle window, to compare both
(docs/benchmarks-operator.md).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import resource
import time

from pdd_operator.informers.creation_events import CreationEvents, creation_event_collections
from pdd_operator.informers.fleet import FleetState, fleet_collections
from pdd_operator.informers.listwatch import Watches
from pdd_operator.informers.owned import OwnedObjects, owned_collections
from pdd_operator.kube.client import KubeApi, load_api_client
from pdd_operator.rendering.context import OperatorSettings


async def list_everything(kubeconfig: str, page: int) -> dict[str, object]:
    settings = OperatorSettings()
    kube = KubeApi(load_api_client(kubeconfig), settings.field_manager)
    state, owned = FleetState(), OwnedObjects()
    watches = Watches(kube)
    watches.PAGE = page
    watches.add(fleet_collections(state))
    watches.add(owned_collections(owned, (), settings.field_manager, None, state.own_pod))
    watches.add(creation_event_collections(CreationEvents(lambda _: None), ()))
    started = time.monotonic()
    watches.start()
    await watches.synced()
    seconds = time.monotonic() - started
    watches.stop()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "gc_threshold": gc.get_threshold(),
        "page": page,
        "listed_s": round(seconds, 2),
        "user_cpu_s": round(usage.ru_utime, 2),
        "system_cpu_s": round(usage.ru_stime, 2),
        "rss_mib_peak": round(usage.ru_maxrss / 1024),
        "rss_mib_listed": _rss_mib(),
        "gc_collections": [generation["collections"] for generation in gc.get_stats()],
    }


def _rss_mib() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024)
    return -1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--gc-threshold", help="gen0,gen1,gen2 (default: Python's)")
    parser.add_argument("--page", type=int, default=Watches.PAGE, help="items per list page")
    args = parser.parse_args()
    if args.gc_threshold:
        gc.set_threshold(*(int(x) for x in args.gc_threshold.split(",")))
    print(json.dumps(asyncio.run(list_everything(args.kubeconfig, args.page))))


if __name__ == "__main__":
    main()
