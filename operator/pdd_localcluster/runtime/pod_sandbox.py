"""The pod's sandbox, runner side: starts `pause.py`, which holds the namespaces the pod's
containers share, and tells each container's sandbox (`sandbox.py`) what to join."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from pdd_localcluster.runtime.namespaces import PodNamespaces

PAUSE = Path(__file__).with_name("pause.py")
READY_TIMEOUT_S = 10.0


class SandboxError(RuntimeError):
    """The pod's namespaces could not be created; the message says why."""


class PodSandbox:
    def __init__(self, namespaces: PodNamespaces, pod_dir: Path) -> None:
        self.namespaces = namespaces
        self._spec_path = pod_dir / "specs" / "sandbox.json"
        # The pod's /dev/shm, shared by its containers (a kubelet's is a tmpfs of the pod).
        self.shm_dir = pod_dir / "shm"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Creates the namespaces; returns once they exist."""
        if os.geteuid() != 0:
            # Mount and PID namespaces need root here; sharing the host's instead would let
            # pods reach each other where real pods cannot.
            raise SandboxError("the local runtime needs root to give pods their own namespaces")
        self._spec_path.parent.mkdir(parents=True, exist_ok=True)
        self.shm_dir.mkdir(parents=True, exist_ok=True)
        self.shm_dir.chmod(0o1777)  # as /dev/shm is: any user's, sticky
        ns = self.namespaces
        spec = {
            "own_ipc": ns.own_ipc,
            "own_uts": ns.own_uts,
            "pod_pid_namespace": ns.pod_pid_namespace,
            "hostname": ns.hostname,
            "parent_pid": os.getpid(),
        }
        self._spec_path.write_text(json.dumps(spec))
        self._proc = subprocess.Popen(
            [sys.executable, "-S", str(PAUSE), str(self._spec_path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            start_new_session=True,
            env={},
        )
        assert self._proc.stdout is not None
        ready, _, _ = select.select([self._proc.stdout], [], [], READY_TIMEOUT_S)
        answer = self._proc.stdout.readline().decode(errors="replace").strip() if ready else ""
        if answer != "ready":
            self.stop()
            raise SandboxError(f"the pod sandbox did not start: {answer or 'no answer'}")

    def container_spec(self) -> dict[str, Any]:
        """What a container's sandbox joins: the keys of `sandbox.py`'s spec."""
        assert self._proc is not None, "start() first"
        ns, proc = self.namespaces, f"/proc/{self._proc.pid}/ns"
        return {
            "pid_namespace": ns.pid,
            "ipc_ns": f"{proc}/ipc" if ns.own_ipc else None,
            "uts_ns": f"{proc}/uts" if ns.own_uts else None,
            "pid_ns": f"{proc}/pid_for_children" if ns.pod_pid_namespace else None,
            "shm_dir": str(self.shm_dir) if ns.own_ipc else None,
        }

    def stop(self) -> None:
        """Ends the sandbox and, with a pod PID namespace, whatever is left in it."""
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait(timeout=10)
        if self._proc.stdout is not None:
            self._proc.stdout.close()
