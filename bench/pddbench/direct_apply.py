"""The direct arm's client in a process of its own: it applies the rendered children of every
deployment, as the operator would, with no operator.

A process of its own so the direct arm is measured the way the operator is: its CPU seconds
from /proc of the process doing the work, and py-spy on that process. Talks over stdin and
stdout: prints `ready` once the plans are loaded and the client built, applies on `go`
(every deployment submitted at that instant, its clock starting there), writes the result
file, prints `done`, and exits on the next line (so its CPU can be read after convergence).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import config as kconfig

from pdd_operator.kube.client import KubeApi


def apply_all(
    kube: KubeApi, plans: dict[str, list[dict[str, Any]]], workers: int
) -> dict[str, Any]:
    t_apply: dict[str, float] = {}
    t_applied: dict[str, float] = {}
    errors: list[str] = []

    def one(name: str) -> None:
        t_apply[name] = time.monotonic()
        try:
            for obj in plans[name]:
                if obj["kind"] == "Secret":
                    kube.create_if_absent(obj)
                else:
                    kube.apply(obj)
        except Exception as err:
            errors.append(f"{name}: {err}")
        t_applied[name] = time.monotonic()

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, plans))
    return {"t_apply": t_apply, "t_applied": t_applied, "errors": errors}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--plans", required=True, help="JSON: deployment -> objects, in apply order")
    p.add_argument("--workers", type=int, default=32)
    p.add_argument("--result", required=True)
    args = p.parse_args()
    plans = json.loads(Path(args.plans).read_text())
    kube = KubeApi(kconfig.new_client_from_config(config_file=args.kubeconfig), "bench-user")
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    result = apply_all(kube, plans, args.workers)
    Path(args.result).write_text(json.dumps(result))
    print("done", flush=True)
    sys.stdin.readline()


if __name__ == "__main__":
    main()
