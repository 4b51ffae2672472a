"""One container's process: started through the sandbox (`sandbox.py`) in a session of its
own, its output appended to its log file, stopped with SIGTERM then SIGKILL to its whole
process group."""

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
        self.root_dir = pod_dir / "roots" / name
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def start(self, spec: dict[str, Any]) -> None:
        """Starts a fresh run; `spec` is the sandbox's (argv, env, mounts, ...)."""
        for p in (self.spec_path, self.termination_log):
            p.parent.mkdir(parents=True, exist_ok=True)
        self.termination_log.write_bytes(b"")
        self.root_dir.mkdir(parents=True, exist_ok=True)
        spec = {**spec, "root_dir": str(self.root_dir), "parent_pid": os.getpid()}
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
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, sig)

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
