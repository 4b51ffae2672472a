"""The container sandbox: run as `python sandbox.py SPEC.json` (a script, so it imports
nothing of the project), it joins the pod's namespaces, sets up the container's filesystem in
a mount namespace of its own and then becomes the container's process with exec.

Namespaces, as runc gives them (`namespaces.py` decides which): the pod's IPC and UTS
namespaces, held by the pod's sandbox process (`pause.py`); a PID namespace of the
container's own, the pod's (`shareProcessNamespace`) or the host's (`hostPID`). A new PID
namespace needs a fork: this process stays outside as the runner's handle on the container
(it forwards signals and exits with the container's status), and inside, a container of its
own PID namespace gets a small init as PID 1 (what `docker run --init` adds) that forwards
signals to the container's process and reaps orphans; when the container's process ends,
the init ends and the kernel kills whatever is left in the namespace, so nothing escapes
the pod's deletion by leaving its process group.

The root is an overlay whose lower layer is the host's `/` (or a built image's own root
filesystem, `lower_dir`) and whose upper layer is a tmpfs of this container, so the container
sees the host's programs (the venv, the repository) or the image's, but its writes stay its
own; `read_only_root` then makes it read-only, as readOnlyRootFilesystem does, and `user`
is the uid and gid the container's process runs as. /proc, /sys and /dev come from the host
(bound recursively: the overlay shows no submounts), the pod's volumes are bound at their
mountPaths, and /etc/ld.so.preload in the upper layer loads the pod-network shim (`netshim.c`)
into every dynamically linked program of the container without adding a variable to its
environment.

There is no network or user namespace: pods share the host's loopback, where the apiserver
listens, and the shim gives each pod its own address on it. The pod's /dev/shm is a directory
of the pod bound over the host's (unless the pod uses the host's IPC namespace).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import sys
from pathlib import Path

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
MS_RDONLY = 1
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
PR_SET_PDEATHSIG = 1

_libc = ctypes.CDLL(None, use_errno=True)
HOST_MOUNTS = ("/proc", "/sys", "/dev")
FORWARDED_SIGNALS = (
    signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
)  # fmt: skip
RUNTIME_DIR = ".pdd-runtime"  # in the container's root: the shim and the pod's address


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(
    source: str, target: str, fstype: str | None, flags: int, data: str | None = None
) -> None:
    rc = _libc.mount(
        source.encode(),
        target.encode(),
        fstype.encode() if fstype else None,
        ctypes.c_ulong(flags),
        data.encode() if data else None,
    )
    _check(rc, f"mount {source} on {target}")


def _inside(root: Path, target: str) -> Path:
    """`target` as the container will see it, inside `root`: symlinks on the way are
    followed within the root (the host's /var/run -> /run must become root/run, never
    the host's /run), as runc does for mount targets."""
    parts = [p for p in target.split("/") if p]
    resolved = root
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            resolved = resolved.parent if resolved != root else root
            continue
        candidate = resolved / part
        if candidate.is_symlink():
            hops += 1
            if hops > 40:
                raise OSError(f"too many symlinks in {target}")
            link = os.readlink(candidate)
            parts = [p for p in link.split("/") if p] + parts
            if link.startswith("/"):
                resolved = root
            continue
        resolved = candidate
    return resolved


def _bind(source: str, target: Path, read_only: bool) -> None:
    if Path(source).is_dir():
        target.mkdir(parents=True, exist_ok=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            target.touch()
    mount(source, str(target), None, MS_BIND | MS_REC)
    if read_only:
        mount(source, str(target), None, MS_BIND | MS_REMOUNT | MS_RDONLY)


def build_root(spec: dict[str, object]) -> Path:
    """Mounts the container's root under spec["root_dir"] and returns it."""
    base = Path(str(spec["root_dir"]))
    base.mkdir(parents=True, exist_ok=True)
    _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    # Nothing mounted from here on may propagate back to the host.
    mount("none", "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", str(base), "tmpfs", 0, "mode=0755")
    for d in ("upper", "work", "root"):
        (base / d).mkdir()
    root = base / "root"
    lower = spec.get("lower_dir") or "/"
    options = f"lowerdir={lower},upperdir={base / 'upper'},workdir={base / 'work'}"
    mount("overlay", str(root), "overlay", 0, options)
    for host in HOST_MOUNTS:
        if host == "/proc" and spec.get("pid_namespace", "host") != "host":
            # A procfs of the container's own PID namespace: /proc shows its processes only.
            proc = _inside(root, host)
            mount("proc", str(proc), "proc", 0)
            continue
        _bind(host, _inside(root, host), read_only=False)
    if spec.get("shm_dir"):
        _bind(str(spec["shm_dir"]), _inside(root, "/dev/shm"), read_only=False)
    for m in spec["mounts"]:  # type: ignore[attr-defined]
        _bind(m["source"], _inside(root, m["target"]), bool(m["read_only"]))
    targets = [str(m["target"]) for m in spec["mounts"]]  # type: ignore[attr-defined]
    for path in spec.get("keep_visible", []):  # type: ignore[attr-defined]
        if any(_is_under(str(path), target) for target in targets):
            _bind(str(path), _inside(root, str(path)), read_only=True)
    if not any(m["target"] == "/sys" for m in spec["mounts"]):  # type: ignore[attr-defined]
        _show_only_loopback(root)
    _install_netshim(root, spec)
    if spec.get("read_only_root"):
        # Only the root itself: the volumes bound on top keep their own modes.
        mount("none", str(root), None, MS_BIND | MS_REMOUNT | MS_RDONLY)
    return root


def _is_under(path: str, directory: str) -> bool:
    directory = directory.rstrip("/") or "/"
    return path == directory or path.startswith(directory + "/") or directory == "/"


def _show_only_loopback(root: Path) -> None:
    """A pod's network here is its address on the loopback, so /sys/class/net lists only
    `lo`: programs that pick interfaces from it (UCX's TCP transport does) then send only to
    127.0.0.0/8, never out through the host's other interfaces. A node given a hardware
    fixture keeps the fixture's /sys."""
    net = root / "sys" / "class" / "net"
    if not (net / "lo").exists():
        return
    mount("tmpfs", str(net), "tmpfs", 0, "mode=0755")
    (net / "lo").symlink_to("../../devices/virtual/net/lo")


def _install_netshim(root: Path, spec: dict[str, object]) -> None:
    shim = spec.get("netshim")
    if not shim:
        return
    rt = root / RUNTIME_DIR
    rt.mkdir(exist_ok=True)
    shutil.copy(str(shim), rt / "netshim.so")
    (rt / "pod-ip").write_text(str(spec["pod_ip"]))
    preload = root / "etc" / "ld.so.preload"
    previous = preload.read_text() if preload.exists() else ""
    preload.write_text(f"/{RUNTIME_DIR}/netshim.so\n{previous}")


def join_pod_namespaces(spec: dict[str, object]) -> None:
    """setns() into the pod sandbox's IPC and UTS namespaces, and into the PID namespace the
    container's processes will be born in (its own, the pod's, or this one: the host's)."""
    for key, flag in (("ipc_ns", CLONE_NEWIPC), ("uts_ns", CLONE_NEWUTS), ("pid_ns", CLONE_NEWPID)):
        path = spec.get(key)
        if path:
            fd = os.open(str(path), os.O_RDONLY)
            try:
                _check(_libc.setns(fd, flag), f"setns({path})")
            finally:
                os.close(fd)
    if spec.get("pid_namespace") == "container":
        _check(_libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")


def become_container(spec: dict[str, object]) -> None:
    """Builds the root and execs the container's command; never returns."""
    try:
        root = build_root(spec)
        os.chroot(root)
        os.chdir(str(spec.get("working_dir") or "/"))
    except OSError as e:
        print(f"pdd-localcluster sandbox: {e}", file=sys.stderr, flush=True)
        os._exit(128)
    if spec.get("pid_namespace") == "container":
        _run_as_init(spec)
    _exec(spec)


def _exec(spec: dict[str, object]) -> None:
    argv = [str(a) for a in spec["argv"]]  # type: ignore[attr-defined]
    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    user = spec.get("user")
    if isinstance(user, list):
        os.setgroups([])
        os.setgid(int(user[1]))
        os.setuid(int(user[0]))
    try:
        os.execvpe(argv[0], argv, spec["env"])  # type: ignore[arg-type]
    except OSError as e:
        # What runc says, roughly; the kubelet then reports StartError.
        print(f'exec: "{argv[0]}": {e.strerror}', file=sys.stderr, flush=True)
        os._exit(127 if isinstance(e, FileNotFoundError) else 126)


def _run_as_init(spec: dict[str, object]) -> None:
    """PID 1 of the container's PID namespace: the container's process is its child."""
    app = os.fork()
    if app == 0:
        _exec(spec)
    _forward_signals_to(app)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(0)
        if pid == app:
            os._exit(_exit_code(status))


def _forward_signals_to(pid: int) -> None:
    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, forward)


def _exit_code(status: int) -> int:
    """128+N for a process killed by signal N, as a shell and the kubelet show it."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.waitstatus_to_exitcode(status)


def _supervise(child: int, pid_file: str | None) -> None:
    """Outside the new PID namespace: the runner's handle on the container."""
    _forward_signals_to(child)
    if pid_file:
        tmp = f"{pid_file}.tmp"
        Path(tmp).write_text(str(child))
        os.replace(tmp, pid_file)
    _, status = os.waitpid(child, 0)
    os._exit(_exit_code(status))


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    # SIGTERM when the runner thread that started us goes away: that is the pod being
    # stopped (the runner then waits the grace period and SIGKILLs), or the simulator's
    # process being killed, which must not leave pods running. Kept across exec.
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != spec.get("parent_pid", os.getppid()):
        os._exit(143)  # the parent was gone before the line above
    try:
        join_pod_namespaces(spec)
    except OSError as e:
        print(f"pdd-localcluster sandbox: {e}", file=sys.stderr, flush=True)
        os._exit(128)
    if spec.get("pid_namespace", "host") == "host":
        become_container(spec)
    # Joining or creating a PID namespace takes effect for children only.
    child = os.fork()
    if child == 0:
        # This process only ever dies of SIGKILL before its child (it forwards the rest);
        # the container's processes go with it then.
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        become_container(spec)
    _supervise(child, spec.get("pid_file"))


if __name__ == "__main__":
    main(sys.argv[1])
