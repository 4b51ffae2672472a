"""The pod's sandbox process (what the `pause` container is to a kubelet): run as
`python -S pause.py SPEC.json` (a script, so it imports nothing of the project), it creates
the namespaces the pod's containers share and holds them until the pod stops.

- IPC and UTS: new ones unless the pod uses the host's (`hostIPC`, `hostNetwork`); the UTS
  namespace gets the pod's host name.
- PID: with `shareProcessNamespace` a new PID namespace whose init is this process's child,
  which reaps the orphans of every container, as the pause process does there.

It prints `ready` on stdout once the namespaces exist (the runner waits for that before it
starts a container that joins them) and then waits: for SIGTERM or SIGKILL from the runner,
or for the runner's process to end, so a killed test run leaves no sandbox behind.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import sys
from pathlib import Path

CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
PR_SET_PDEATHSIG = 1

_libc = ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _create_namespaces(spec: dict[str, object]) -> None:
    flags = (CLONE_NEWIPC if spec["own_ipc"] else 0) | (CLONE_NEWUTS if spec["own_uts"] else 0)
    if spec["pod_pid_namespace"]:
        flags |= CLONE_NEWPID  # for the children: the next fork() is its init
    if flags:
        _check(_libc.unshare(flags), "unshare")
    if spec["own_uts"]:
        name = str(spec["hostname"]).encode()
        _check(_libc.sethostname(name, len(name)), "sethostname")


def _pid_namespace_init() -> None:
    """PID 1 of the pod's PID namespace: reaps whatever the containers leave behind until
    the sandbox ends it (a SIGKILL from outside the namespace always reaches an init)."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: os._exit(0))
    while True:
        try:
            os.wait()
        except ChildProcessError:
            signal.pause()


def _wait_for_runner_or_signal(runner_pid: int, init: int | None) -> None:
    def end(*_: object) -> None:
        if init is not None:
            os.kill(init, signal.SIGKILL)
        os._exit(0)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, end)
    try:
        runner = os.pidfd_open(runner_pid)
    except ProcessLookupError:
        end()
    while True:
        readable, _, _ = select.select([runner], [], [])
        if readable:  # the runner's process has exited
            end()


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    runner_pid = int(spec["parent_pid"])
    try:
        _create_namespaces(spec)
    except OSError as e:
        print(f"error {e}", flush=True)
        os._exit(1)
    init = None
    if spec["pod_pid_namespace"]:
        init = os.fork()
        if init == 0:
            _pid_namespace_init()
    print("ready", flush=True)
    sys.stdout.close()
    _wait_for_runner_or_signal(runner_pid, init)


if __name__ == "__main__":
    main(sys.argv[1])
