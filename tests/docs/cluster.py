"""A cluster as a user meets it, for the documented commands: the local control plane (API
server, controllers, scheduler), two simulated 8-GPU nodes whose kubelets run the pods of the
project's own images as local processes (the operator the chart installs really runs), and a
shell with the pinned kubectl and helm on PATH and KUBECONFIG set."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from pdd_localcluster import LocalControlPlane
from pdd_localcluster.__main__ import loopback_pod_ips
from pdd_localcluster.controlplane import DEFAULT_CONTROLLERS, resolve_bin_dir
from pdd_localcluster.nodes import gpu_fleet
from pdd_localcluster.nodesim import NodeSimulator
from pdd_localcluster.runtime import PodRuntime
from pdd_localcluster.runtime.images import VENV_BIN

# Apart from the integration tier's pods (127.90.0.0/16), in case both ever run at once.
POD_NETWORK = ipaddress.IPv4Network("127.91.0.0/16")
# The controllers a cluster runs that the chart's objects need: the DaemonSet of the topology
# agent (`helm install --wait` waits for it) and ClusterRole aggregation (the user roles).
CONTROLLERS = (
    *DEFAULT_CONTROLLERS,
    "daemonset-controller",
    "clusterrole-aggregation-controller",
)
# What a user stops with Ctrl-C (`kubectl get -w`) runs this long here.
WATCH_SECONDS = 15
COMMAND_TIMEOUT = 300


@dataclass(frozen=True)
class Shell:
    """Runs a documented command as the user's shell would."""

    env: Mapping[str, str]

    def run(
        self, command: str, cwd: Path, *, watch: bool = False
    ) -> subprocess.CompletedProcess[str]:
        script = f"set -o pipefail\n{command}\n"
        argv = ["bash", "-c", script]
        if watch:
            argv = ["timeout", "--signal=INT", str(WATCH_SECONDS), *argv]
        return subprocess.run(
            argv,
            cwd=cwd,
            env=dict(self.env),
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )


@contextlib.contextmanager
def user_cluster(state: Path) -> Iterator[Shell]:
    with LocalControlPlane(state / "plane", controllers=CONTROLLERS) as cp:
        runtime = PodRuntime(cp.kubeconfig, state / "runtime")
        nodes = gpu_fleet(1, 2, gpus=8)
        with NodeSimulator(
            cp.kubeconfig, nodes, pod_ips=loopback_pod_ips(POD_NETWORK), runtime=runtime
        ):
            yield Shell(_user_env(cp.kubeconfig))


def _user_env(kubeconfig: Path) -> dict[str, str]:
    """The user's own environment (HOME, with the caches `make` filled), pointed at this
    cluster, with the pinned kubectl and helm first on PATH, then the venv (`pdd-operator`)."""
    path = [str(resolve_bin_dir()), str(VENV_BIN), os.environ.get("PATH", "/usr/bin:/bin")]
    return {**os.environ, "PATH": ":".join(path), "KUBECONFIG": str(kubeconfig)}
