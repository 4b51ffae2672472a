"""Run a command on the far side of a pod boundary: ``python -m pdd_probe.boundary -- CMD``.

The KV-path check runs both of its processes in the engine's pod, because only that pod's
containers hold the engine's GPUs and NICs before the engine starts. But the KV goes from a
prefill pod to a decode pod, and what separates two pods on one node decides which UCX lanes
work: a PID namespace of their own (UCX's ``cuda_ipc`` memory keys carry the PID namespace and
are refused from another one; ``cma`` needs the peer's PID), an IPC namespace (SysV shared
memory) and a /dev/shm of their own. So the check's peer runs here, in new PID, IPC and mount
namespaces with a private /dev/shm and /proc, exactly as the other pod's process would.

``--keep-pid`` is the boundary between two pods that both run in the host's PID namespace
(``hostPID``): each still has its own IPC and mount namespaces and its own /dev/shm, so the
peer gets new ones of those and stays in this PID namespace. ``--keep-ipc`` as well: both
pods also in the host's IPC namespace (``hostIPC``), only the mount namespace apart. (UCX's
shared-memory transports, cma included, reach a peer only in their own IPC namespace: the
address they exchange carries it.)

With CAP_SYS_ADMIN (the local runtime's pods, a privileged container) the namespaces are
created directly; without it (a pod that drops every capability), inside a new user namespace
that maps this user to itself. Where neither is allowed the command is not run: the exit
status is ``BOUNDARY_REFUSED`` and stderr says why, because measuring without the boundary
would report a lane the KV cannot take.

That is the case in an ordinary pod: the container runtimes' default seccomp profile (the
`RuntimeDefault` the operator renders) allows ``unshare`` only with CAP_SYS_ADMIN, and the
preflight drops every capability. ``refusal`` asks beforehand, and a caller that is refused
emulates the boundary instead: the peer runs here with ``UCX_TLS`` narrowed by
``crossing_tls`` to the transports that reach across that boundary (what the namespaces do
to UCX: a PID namespace stops ``cuda_ipc`` and ``cma``, an IPC namespace every shared-memory
transport), so UCX picks the lane it would pick for the other pod's process.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import sys
from collections.abc import Sequence

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8
MS_REC, MS_PRIVATE = 16384, 1 << 18
BOUNDARY_REFUSED = 97
PR_SET_PDEATHSIG = 1
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

_libc = ctypes.CDLL(None, use_errno=True)


class BoundaryRefused(OSError):
    """The kernel or the pod's security settings refused the namespaces."""


def enter_new_namespaces(keep_pid: bool = False, keep_ipc: bool = False) -> str:
    """unshare() the PID (unless ``keep_pid``), IPC (unless ``keep_ipc``) and mount
    namespaces; returns how ("privileged" or "user-namespace"). A new PID namespace applies to
    this process's children."""
    flags = CLONE_NEWNS | (0 if keep_pid else CLONE_NEWPID) | (0 if keep_ipc else CLONE_NEWIPC)
    what = "/".join(
        name for name, kept in (("PID", keep_pid), ("IPC", keep_ipc), ("mount", False)) if not kept
    )
    if _libc.unshare(flags) == 0:
        return "privileged"
    first = ctypes.get_errno()
    uid, gid = os.geteuid(), os.getegid()
    if _libc.unshare(flags | CLONE_NEWUSER) != 0:
        second = ctypes.get_errno()
        raise BoundaryRefused(
            second,
            f"unshare of {what} namespaces refused ({errno.errorcode.get(first, first)}; "
            f"in a user namespace: {errno.errorcode.get(second, second)})",
        )
    _map_self(uid, gid)
    return "user-namespace"


# What each boundary stops (UCX transport names): see the module's docstring.
SHARED_MEMORY = ("posix", "sysv", "cma", "xpmem", "knem")
STOPPED_BY = {
    "pod": ("cuda_ipc", *SHARED_MEMORY),
    "host-pid": SHARED_MEMORY,
    "host-pid-ipc": (),
}


def crossing_tls(ucx_tls: str, peer_boundary: str) -> str:
    """``UCX_TLS`` without the transports ``peer_boundary`` stops, in UCX's own syntax
    (``^x,y`` excludes x and y; a list keeps only what it names)."""
    return without_transports(ucx_tls, STOPPED_BY.get(peer_boundary, ()))


def without_transports(ucx_tls: str, transports: Sequence[str]) -> str:
    value = ucx_tls.strip()
    if not transports:
        return value
    if value in ("", "all"):
        return "^" + ",".join(transports)
    if value.startswith("^"):
        excluded = [t for t in value[1:].split(",") if t.strip()]
        return "^" + ",".join([*excluded, *(t for t in transports if t not in excluded)])
    return ",".join(t for t in value.split(",") if t.strip() not in transports)


def refusal(keep_pid: bool = False, keep_ipc: bool = False) -> str:
    """Why this process may not make the boundary's namespaces ("": it may), asked of a
    child that tries and exits."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read)
        try:
            enter_new_namespaces(keep_pid, keep_ipc)
            os._exit(0)
        except OSError as exc:
            os.write(write, str(exc.strerror or exc).encode())
            os._exit(1)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read().decode(errors="replace")
    _, status = os.waitpid(child, 0)
    return "" if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 else said or "refused"


def _map_self(uid: int, gid: int) -> None:
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with contextlib.suppress(OSError), open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")


def private_mounts(own_proc: bool = True) -> None:
    """A /dev/shm of its own, and (in a new PID namespace's init) a /proc of its own. A /proc
    that cannot be mounted (masked paths in an unprivileged container) stays the parent's:
    /proc/self still names this process and its namespaces there."""
    _mount("none", "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    if own_proc:
        with contextlib.suppress(OSError):
            _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    rc = _libc.mount(
        source.encode(),
        target.encode(),
        fstype.encode() if fstype else None,
        ctypes.c_ulong(flags),
        data.encode() if data else None,
    )
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {fstype or source} on {target}: {os.strerror(err)}")


def run_across(argv: Sequence[str], keep_pid: bool = False, keep_ipc: bool = False) -> int:
    """Runs ``argv`` beyond the boundary with this process's stdin/stdout/stderr; returns its
    exit status."""
    try:
        enter_new_namespaces(keep_pid, keep_ipc)
        if keep_pid:  # the namespaces are this process's own already
            private_mounts(own_proc=False)
    except (BoundaryRefused, OSError) as exc:
        print(f"pdd-probe boundary: {exc.strerror or exc}", file=sys.stderr, flush=True)
        return BOUNDARY_REFUSED
    if keep_pid:
        return _run_child(argv)
    child = os.fork()
    if child == 0:
        # PID 1 of the new namespace, as a pod's init is: it mounts, then runs the command
        # as its child, so the command is an ordinary process there (PID 2), as an engine
        # behind a container's init is.
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # gone with whoever started us
        try:
            private_mounts()
        except OSError as exc:
            print(f"pdd-probe boundary: {exc}", file=sys.stderr, flush=True)
            os._exit(BOUNDARY_REFUSED)
        os._exit(_run_child(argv))
    return _run_child_of(child)


def _run_child(argv: Sequence[str]) -> int:
    """Fork and exec ``argv``; forward signals to it and return its exit status."""
    child = os.fork()
    if child == 0:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        try:
            os.execvp(argv[0], list(argv))
        except OSError as exc:
            print(f"pdd-probe boundary: {exc}", file=sys.stderr, flush=True)
            os._exit(BOUNDARY_REFUSED)
    return _run_child_of(child)


def _run_child_of(child: int) -> int:
    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    _, status = os.waitpid(child, 0)
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def command(argv: Sequence[str], keep_pid: bool = False, keep_ipc: bool = False) -> list[str]:
    """``argv`` wrapped so that it runs beyond the boundary."""
    flags = [f for f, on in (("--keep-pid", keep_pid), ("--keep-ipc", keep_ipc)) if on]
    return [sys.executable, "-m", "pdd_probe.boundary", *flags, "--", *argv]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    flags = set()
    while args and args[0] in ("--keep-pid", "--keep-ipc"):
        flags.add(args.pop(0))
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print(
            "usage: python -m pdd_probe.boundary [--keep-pid] [--keep-ipc] -- COMMAND [ARG...]",
            file=sys.stderr,
        )
        return 2
    return run_across(args, "--keep-pid" in flags, "--keep-ipc" in flags)


if __name__ == "__main__":
    raise SystemExit(main())
