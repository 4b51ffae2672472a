"""One container's process: started through the sandbox (`sandbox.py`) in a session of its
own, its output appended to its log file, stopped as a kubelet stops it: SIGTERM to the
container's main process, then SIGKILL to all of it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SANDBOX = Path(__file__).with_name("sandbox.py")
TERMINATION_LOG = "/dev/termination-log"
TERMINATION_MESSAGE_MAX = 4096


class ContainerProcess:
    def __init__(self, name: str, pod_dir: Path) -> None:
        self.name = name
        self.log_path = pod_dir / f"{name}.log"
        self.termination_log = pod_dir / "termination" / name
        self.spec_path = pod_dir / "specs" / f"{name}.json"
        # Where the sandbox writes the pid of its child in a new PID namespace.
        self.pid_file = pod_dir / "specs" / f"{name}.pid"
        self.root_dir = pod_dir / "roots" / name
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0
        self._forked = False  # a PID namespace other than the host's: the sandbox forks
        self._own_pid_namespace = False

    @property
    def pid(self) -> int | None:
        """The container's main process (as the host numbers it), while it runs."""
        inside = self.namespace_pid
        if inside is None or not self._own_pid_namespace:
            return inside
        # PID 1 of the container's own PID namespace is the sandbox's init; the container's
        # process is its child.
        try:
            children = Path(f"/proc/{inside}/task/{inside}/children").read_text().split()
        except OSError:
            return None
        return int(children[0]) if children else None

    @property
    def namespace_pid(self) -> int | None:
        """A process in the container's namespaces and root (for nsenter), while it runs."""
        if self._proc is None or self._proc.poll() is not None:
            return None
        if not self._forked:
            return self._proc.pid
        try:
            return int(self.pid_file.read_text())
        except (OSError, ValueError):
            return None  # the sandbox has not forked yet

    def forked_pid(self, timeout: float) -> int | None:
        """`namespace_pid`, waiting up to `timeout` seconds for a started sandbox to fork: a
        container already counted as running may not have written its pid file yet."""
        deadline = time.monotonic() + timeout
        while (pid := self.namespace_pid) is None and time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                return None  # not started, or ended
            time.sleep(0.02)
        return pid

    def start(self, spec: dict[str, Any]) -> None:
        """Starts a fresh run; `spec` is the sandbox's (argv, env, mounts, ...)."""
        for p in (self.spec_path, self.termination_log):
            p.parent.mkdir(parents=True, exist_ok=True)
        self.termination_log.write_bytes(b"")
        self.termination_log.chmod(0o666)  # the container may run as any user
        self.root_dir.mkdir(parents=True, exist_ok=True)
        self.pid_file.unlink(missing_ok=True)
        pid_namespace = spec.get("pid_namespace", "host")
        self._forked = pid_namespace != "host"
        self._own_pid_namespace = pid_namespace == "container"
        spec = {
            **spec,
            "root_dir": str(self.root_dir),
            "parent_pid": os.getpid(),
            "pid_file": str(self.pid_file),
        }
        spec["mounts"] = [
            *spec["mounts"],
            {"source": str(self.termination_log), "target": TERMINATION_LOG, "read_only": False},
        ]
        self.spec_path.write_text(json.dumps(spec))
        with self.log_path.open("ab") as log:
            self._log_offset = log.tell()
            self._proc = subprocess.Popen(
                [sys.executable, "-S", str(SANDBOX), str(self.spec_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={},  # the sandbox gets the container's environment from the spec
            )

    def poll(self) -> int | None:
        """The exit code once the process has ended (128+N for signal N, as the kubelet shows)."""
        if self._proc is None:
            return None
        code = self._proc.poll()
        if code is None:
            return None
        return 128 - code if code < 0 else code

    def signal(self, sig: int) -> None:
        """SIGKILL ends every process of the container; any other signal goes to its main
        process only, as the kubelet sends it (the sandbox forwards it there)."""
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if sig == signal.SIGKILL:
                    os.killpg(self._proc.pid, sig)
                else:
                    os.kill(self._proc.pid, sig)

    def stop(self, grace: float) -> None:
        """SIGTERM to the group, SIGKILL after `grace` seconds; returns once it has exited."""
        if self._proc is None:
            return
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self._proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        self.signal(signal.SIGKILL)  # children that outlived the main process go too
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=5)

    def termination_message(self, fallback_to_logs: bool) -> str:
        """/dev/termination-log when the container wrote it; else, with the
        FallbackToLogsOnError policy, the tail of this run's output."""
        with contextlib.suppress(OSError):
            written = self.termination_log.read_bytes()[:TERMINATION_MESSAGE_MAX]
            if written.strip():
                return written.decode(errors="replace")
        if not fallback_to_logs:
            return ""
        try:
            with self.log_path.open("rb") as f:
                f.seek(self._log_offset)
                output = f.read()
        except OSError:
            return ""
        lines = output.decode(errors="replace").splitlines()[-80:]
        return "\n".join(lines)[-TERMINATION_MESSAGE_MAX:]
