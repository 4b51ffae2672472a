"""The container sandbox: run as `python sandbox.py SPEC.json` (a script, so it imports
nothing of the project), it sets up the container's filesystem in a mount namespace of its
own and then becomes the container's process with exec.

The root is an overlay whose lower layer is the host's `/` and whose upper layer is a tmpfs
of this container, so the container sees the host's programs (the venv, the repository) but
its writes stay its own. /proc, /sys and /dev come from the host (bound recursively: the
overlay shows no submounts), the pod's volumes are bound at their mountPaths, and
/etc/ld.so.preload in the upper layer loads the pod-network shim (`netshim.c`) into every
dynamically linked program of the container without adding a variable to its environment.

There is no network, PID or user namespace: pods share the host's loopback, where the
apiserver listens, and the shim gives each pod its own address on it.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import sys
from pathlib import Path

CLONE_NEWNS = 0x00020000
MS_RDONLY = 1
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
PR_SET_PDEATHSIG = 1

_libc = ctypes.CDLL(None, use_errno=True)
HOST_MOUNTS = ("/proc", "/sys", "/dev")
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
    options = f"lowerdir=/,upperdir={base / 'upper'},workdir={base / 'work'}"
    mount("overlay", str(root), "overlay", 0, options)
    for host in HOST_MOUNTS:
        _bind(host, _inside(root, host), read_only=False)
    for m in spec["mounts"]:  # type: ignore[attr-defined]
        _bind(m["source"], _inside(root, m["target"]), bool(m["read_only"]))
    targets = [str(m["target"]) for m in spec["mounts"]]  # type: ignore[attr-defined]
    for path in spec.get("keep_visible", []):  # type: ignore[attr-defined]
        if any(_is_under(str(path), target) for target in targets):
            _bind(str(path), _inside(root, str(path)), read_only=True)
    if not any(m["target"] == "/sys" for m in spec["mounts"]):  # type: ignore[attr-defined]
        _show_only_loopback(root)
    _install_netshim(root, spec)
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


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    # SIGTERM when the runner thread that started us goes away: that is the pod being
    # stopped (the runner then waits the grace period and SIGKILLs), or the simulator's
    # process being killed, which must not leave pods running. Kept across exec.
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != spec.get("parent_pid", os.getppid()):
        os._exit(143)  # the parent was gone before the line above
    try:
        root = build_root(spec)
        os.chroot(root)
        os.chdir(spec.get("working_dir") or "/")
    except OSError as e:
        print(f"pdd-localcluster sandbox: {e}", file=sys.stderr, flush=True)
        os._exit(128)
    argv = [str(a) for a in spec["argv"]]
    try:
        os.execvpe(argv[0], argv, spec["env"])
    except OSError as e:
        # What runc says, roughly; the kubelet then reports StartError.
        print(f'exec: "{argv[0]}": {e.strerror}', file=sys.stderr, flush=True)
        os._exit(127 if isinstance(e, FileNotFoundError) else 126)


if __name__ == "__main__":
    main(sys.argv[1])
