"""`python -m pdd_localcluster up|down --state-dir DIR`: a local cluster for demos and manual work.

`up` runs the control plane and the node simulator in the foreground until SIGINT/SIGTERM;
with `--background` it detaches, and returns once the cluster is ready. `down` stops what
`up` started in that state dir, leftovers of a killed `up` included.

With `--run-pods`, pods whose images the local runtime knows (`pdd_localcluster.runtime`)
really run as local processes at addresses in 127.90.0.0/16; their logs are in
STATE_DIR/runtime/pods/<namespace>_<pod>_<uid>/<container>.log.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from pdd_localcluster import procs
from pdd_localcluster.controlplane import ControlPlaneStartError, LocalControlPlane
from pdd_localcluster.nodes import SimNode, gpu_fleet
from pdd_localcluster.nodesim import NodeSimulator
from pdd_localcluster.runtime import PodRuntime

SOURCE_ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    state_dir = Path(args.state_dir).resolve()
    if args.command == "down":
        return down(state_dir)
    # The pid file may already name this very process: `--background` writes it for its child.
    if _running_pid(state_dir) not in (None, os.getpid()):
        print(f"a cluster is already running in {state_dir}; run `down` first", file=sys.stderr)
        return 1
    if args.background:
        return up_background(state_dir, args)
    return up_foreground(state_dir, args.nodes, args.cliques, args.gpus, run_pods=args.run_pods)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pdd_localcluster", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the control plane and simulated GPU nodes")
    down = sub.add_parser("down", help="stop everything `up` started")
    for sp in (up, down):
        sp.add_argument("--state-dir", required=True, help="data, logs, kubeconfig")
    up.add_argument("--nodes", type=int, default=8, help="simulated GPU nodes (default 8)")
    up.add_argument("--cliques", type=int, default=2, help="NVLink cliques they form (2)")
    up.add_argument("--gpus", type=int, default=8, help="GPUs per node (8)")
    up.add_argument("--background", action="store_true", help="detach once ready")
    up.add_argument(
        "--run-pods",
        action="store_true",
        help="run the containers of known images as local processes (pod IPs from 127.90.0.0/16)",
    )
    return p


# Pods that really run get loopback addresses (all of 127.0.0.0/8 reaches this machine); the
# default simulated ones nobody can reach.
RUN_PODS_NETWORK = ipaddress.IPv4Network("127.90.0.0/16")


def loopback_pod_ips(network: ipaddress.IPv4Network = RUN_PODS_NETWORK) -> Iterator[str]:
    """The network's addresses in order, without the .0 and .255 ones."""
    for addr in network.hosts():
        if int(addr) & 0xFF not in (0, 255):
            yield str(addr)


def up_foreground(
    state_dir: Path, nodes: int, cliques: int, gpus: int, *, run_pods: bool = False
) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    fleet = gpu_fleet(cliques, math.ceil(nodes / cliques), gpus=gpus)[:nodes]
    t0 = time.monotonic()
    state_dir.mkdir(parents=True, exist_ok=True)
    _pid_file(state_dir).write_text(str(os.getpid()))
    try:
        with (
            LocalControlPlane(state_dir) as cp,
            _node_simulator(cp.kubeconfig, fleet, state_dir, run_pods) as sim,
        ):
            info = {
                "kubeconfig": str(cp.kubeconfig),
                "server": cp.server,
                "version": cp.version,
                "nodes": sim.node_names,
                "seconds": round(time.monotonic() - t0, 1),
            }
            _ready_file(state_dir).write_text(json.dumps(info, indent=2))
            print(
                f"cluster {cp.version} at {cp.server} with {len(fleet)} simulated GPU nodes "
                f"ready in {info['seconds']}s\nexport KUBECONFIG={cp.kubeconfig}",
                flush=True,
            )
            stop.wait()
            print("stopping", flush=True)
    except ControlPlaneStartError as e:
        print(f"control plane failed to start: {e}", file=sys.stderr)
        return 1
    finally:
        _ready_file(state_dir).unlink(missing_ok=True)
        _pid_file(state_dir).unlink(missing_ok=True)
    return 0


def _node_simulator(
    kubeconfig: Path, fleet: list[SimNode], state_dir: Path, run_pods: bool
) -> NodeSimulator:
    if not run_pods:
        return NodeSimulator(kubeconfig, fleet)
    runtime = PodRuntime(kubeconfig, state_dir / "runtime")
    return NodeSimulator(kubeconfig, fleet, pod_ips=loopback_pod_ips(), runtime=runtime)


def up_background(state_dir: Path, args: argparse.Namespace) -> int:
    state_dir.mkdir(parents=True, exist_ok=True)
    _ready_file(state_dir).unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pdd_localcluster", "up", "--state-dir", str(state_dir)]
    cmd += ["--nodes", str(args.nodes), "--cliques", str(args.cliques), "--gpus", str(args.gpus)]
    if args.run_pods:
        cmd.append("--run-pods")
    python_path = [str(SOURCE_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(python_path)}
    log_path = state_dir / "up.log"
    with log_path.open("ab") as log:
        # A session of its own: the cluster outlives this shell and `down` signals the group.
        child = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    _pid_file(state_dir).write_text(str(child.pid))
    delay = 0.05
    # The first `up` on a machine may build the binaries first, so there is no fixed timeout;
    # the wait ends when the child is ready or gone.
    while not _ready_file(state_dir).exists():
        if child.poll() is not None:
            _pid_file(state_dir).unlink(missing_ok=True)
            print(
                f"`up` exited with {child.returncode}:\n{procs.tail(log_path, 30)}", file=sys.stderr
            )
            return 1
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)
    kubeconfig = state_dir / "kubeconfig"
    print(kubeconfig)
    print(f"export KUBECONFIG={kubeconfig}")
    return 0


def down(state_dir: Path) -> int:
    pid = _running_pid(state_dir)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    # Components whose supervisor died without stopping them.
    leftovers = procs.kill_recorded(state_dir / "pids.json", str(state_dir))
    _pid_file(state_dir).unlink(missing_ok=True)
    _ready_file(state_dir).unlink(missing_ok=True)
    extra = f" (killed leftovers: {', '.join(leftovers)})" if leftovers else ""
    print(f"stopped the cluster in {state_dir}{extra}" if pid or leftovers else "nothing running")
    return 0


def _pid_file(state_dir: Path) -> Path:
    return state_dir / "up.pid"


def _ready_file(state_dir: Path) -> Path:
    return state_dir / "ready.json"


def _running_pid(state_dir: Path) -> int | None:
    """The pid of a live `up` for this state dir, checked against its command line so a
    recycled pid is never mistaken for it."""
    try:
        pid = int(_pid_file(state_dir).read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if b"pdd_localcluster" in cmdline and str(state_dir).encode() in cmdline else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) counts as gone.
    with contextlib.suppress(OSError):
        return " Z " not in Path(f"/proc/{pid}/stat").read_text().split(")", 1)[1][:3]
    return False


if __name__ == "__main__":
    sys.exit(main())
