"""The preflight's KV-path check with the peer's pod boundary made (namespaces, as root) and
emulated (unshare refused, as in the operator's unprivileged pods: the peer kept to the UCX
transports that cross the boundary), side by side on this machine's GPU.

    # on a GPU machine, NIXL importable (PYTHONPATH=/tmp/site:operator), as root
    UCX_NET_DEVICES=lo python3 bench/boundary_emulation.py run --out OUT/boundary-emulation.json
    # anywhere
    python3 bench/boundary_emulation.py summary --results OUT/boundary-emulation.json

Each case is `python -m pdd_probe.device_check --gpus 1` (the check the preflight runs for a
one-GPU engine), once as it is and once under `tests/helpers/no_unshare.py` (a seccomp filter
that refuses unshare, as RuntimeDefault does without CAP_SYS_ADMIN).
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
NO_UNSHARE = REPO / "tests" / "helpers" / "no_unshare.py"
BOUNDARIES = ("pod", "host-pid", "host-pid-ipc")
OPERATIONS = ("READ", "WRITE")


def check(boundary: str, operation: str, emulated: bool, gpus: int, nics: str) -> dict[str, Any]:
    argv = [
        sys.executable, "-m", "pdd_probe.device_check", "--gpus", str(gpus),
        "--operation", operation, "--peer-boundary", boundary, "--net-devices", nics,
    ]  # fmt: skip
    if emulated:
        argv = [sys.executable, str(NO_UNSHARE), "--", *argv]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=500)
    try:
        result: dict[str, Any] = json.loads(done.stdout)
    except json.JSONDecodeError:
        result = {"error": f"no result (rc={done.returncode}): {done.stderr[-2000:]}"}
    return {**result, "boundary": boundary, "operation": operation, "unshare_refused": emulated}


def run(out: Path, gpus: int, nics: str) -> None:
    rows = [
        check(boundary, operation, emulated, gpus, nics)
        for boundary in BOUNDARIES
        for operation in OPERATIONS
        for emulated in (False, True)
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))
    summary(rows)


def summary(rows: list[dict[str, Any]]) -> None:
    print("| boundary | op | boundary made | transport | lanes | GB/s | verified | peer UCX_TLS |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        how = "emulated" if r["unshare_refused"] else "namespaces"
        if r.get("error"):
            print(f"| {r['boundary']} | {r['operation']} | {how} | error: {r['error'][:120]} |")
            continue
        tls = str(r.get("boundary_emulation") or "").split(" (", 1)[0] or "(as the engine's)"
        print(
            f"| {r['boundary']} | {r['operation']} | {how} | {r.get('transport')} | "
            f"{', '.join(r.get('lanes') or [])} | {float(r.get('gbps') or 0):.2f} | "
            f"{r.get('verified')} | {tls} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--gpus", type=int, default=1)
    # The engine's NICs; "none": a pod without RDMA, whose KV stays on the GPU lanes (UCX's
    # TCP lanes still follow UCX_NET_DEVICES, lo here).
    r.add_argument("--net-devices", default="none")
    s = sub.add_parser("summary")
    s.add_argument("--results", type=Path, required=True)
    args = parser.parse_args()
    if args.cmd == "run":
        run(args.out, args.gpus, args.net_devices)
    else:
        raw = args.results.read_bytes()
        summary(json.loads(gzip.decompress(raw) if args.results.suffix == ".gz" else raw))


if __name__ == "__main__":
    main()
