"""Supervision of the control-plane processes: start in their own process group, log to a
file, stop the whole group, and find leftovers of an earlier run by a pid file."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

_SETPRIV = shutil.which("setpriv")


class Component:
    """One control-plane binary run as a child process with its own log file."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, cwd: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = self.argv
        # PDEATHSIG kills the child when the thread that forked it dies, so a crashed test run
        # leaves nothing behind. It is tied to the *thread*, so it is only safe from the main
        # thread (a pool thread that exits would take the apiserver with it).
        if _SETPRIV and threading.current_thread() is threading.main_thread():
            argv = [_SETPRIV, "--pdeathsig", "KILL", "--", *argv]
        with self.log_path.open("ab") as log:
            log.write(f"\n=== {time.strftime('%H:%M:%S')} start {self.name}\n".encode())
            log.flush()
            # A session of its own, so stop() can signal the whole group.
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.cwd,
                start_new_session=True,
            )

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def exit_code(self) -> int | None:
        return self.proc.poll() if self.proc else None

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def wait(self, timeout: float) -> bool:
        """Waits for the process to exit; True when it did."""
        if self.proc is None:
            return True
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, and SIGKILL when it has not exited after `timeout` seconds."""
        self.signal(signal.SIGTERM)
        if not self.wait(timeout):
            self.kill()
        self._kill_group()

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.wait(10.0)
        self._kill_group()

    def _kill_group(self) -> None:
        # The group may hold children that outlived the leader; make sure they go too.
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    def log_tail(self, lines: int = 40) -> str:
        return tail(self.log_path, lines)


def stop_all(components: Sequence[Component], timeout: float = 5.0) -> None:
    """Stops components in parallel: signal all first, then wait, so shutdown is one timeout."""
    for c in components:
        c.signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for c in components:
        c.wait(max(0.0, deadline - time.monotonic()))
    for c in components:
        c.stop(timeout=2.0)


def tail(path: Path, lines: int = 40) -> str:
    try:
        data = path.read_bytes()[-64 * 1024 :]
    except OSError:
        return f"(no log at {path})"
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


def write_pid_file(path: Path, components: Sequence[Component]) -> None:
    pids = {c.name: c.pid for c in components if c.pid is not None}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(pids))
    tmp.replace(path)


def kill_recorded(path: Path, marker: str) -> list[str]:
    """Kills the process groups recorded in a pid file whose command line still contains
    `marker` (the state dir), so a recycled pid of an unrelated process is never touched.
    Returns the names of the components that were still running."""
    try:
        pids: dict[str, int] = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    killed = []
    for name, pid in pids.items():
        if _cmdline_contains(pid, marker):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
                killed.append(name)
    path.unlink(missing_ok=True)
    return killed


def _cmdline_contains(pid: int, marker: str) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    return marker.encode() in cmdline
