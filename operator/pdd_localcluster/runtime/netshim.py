"""Builds `netshim.c` into a shared object with gcc, once per source version: the object is
cached under the state dir by the hash of the source, so an edited shim is rebuilt."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("netshim.c")


class NetshimBuildError(RuntimeError):
    pass


def build(cache_dir: Path) -> Path:
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:16]
    target = cache_dir / f"netshim-{digest}.so"
    if target.exists():
        return target
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise NetshimBuildError("running pods locally needs gcc (or cc) to build the network shim")
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".{os.getpid()}.tmp")
    cmd = [gcc, "-O2", "-shared", "-fPIC", "-Wall", "-o", str(tmp), str(SOURCE), "-ldl"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise NetshimBuildError(f"building {SOURCE.name} failed:\n{res.stderr}")
    tmp.replace(target)
    return target
