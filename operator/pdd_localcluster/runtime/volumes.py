"""A pod's volumes on this machine: what each holds (pure: `volume_files`), where it lives
(`VolumeDirs`), and the bind mounts a container gets (`container_mounts`).

emptyDir is a directory per pod shared by its containers; secret, configMap, downwardAPI and
projected volumes are directories of files written from the API objects at pod start, each
file by a rename like the kubelet's atomic writer; Secret and ConfigMap volumes are rewritten
while the pod runs where their object changed (podrunner.py), as the kubelet's sync does;
hostPath is the host path itself. A persistentVolumeClaim is a directory per claim under the
runtime's state dir (`claims/<namespace>/<claim>`), shared by every pod that mounts it, as a
local-path provisioner would give; the claim object itself is not consulted.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdd_localcluster.runtime.podenv import EnvError, field_value

Json = dict[str, Any]

# (kind "secret"|"configmap", name) -> data as bytes per key, None when it does not exist.
BytesLookup = Callable[[str, str], Mapping[str, bytes] | None]
# (audience or "", expirationSeconds) -> a token for the pod's service account, bound to it.
TokenIssuer = Callable[[str, int], str]

DEFAULT_MODE = 0o644


@dataclass(frozen=True)
class VolumeFile:
    path: str  # relative to the volume's directory
    content: bytes
    mode: int


@dataclass(frozen=True)
class Mount:
    source: Path  # on the host
    target: str  # absolute, inside the container
    read_only: bool


class VolumeError(EnvError):
    """A volume cannot be set up (the kubelet reports FailedMount and keeps the pod waiting)."""


def volume_files(
    volume: Json, pod: Json, lookup: BytesLookup, issue_token: TokenIssuer
) -> list[VolumeFile]:
    """The files of a secret/configMap/downwardAPI/projected volume."""
    if "secret" in volume:
        src = volume["secret"]
        return _object_files(
            "secret", src.get("secretName", ""), src, src.get("defaultMode"), lookup
        )
    if "configMap" in volume:
        src = volume["configMap"]
        return _object_files("configmap", src.get("name", ""), src, src.get("defaultMode"), lookup)
    if "downwardAPI" in volume:
        src = volume["downwardAPI"]
        return _downward_files(src.get("items") or [], pod, src.get("defaultMode"))
    if "projected" in volume:
        return _projected_files(volume["projected"], pod, lookup, issue_token)
    return []


def _mode(item_mode: int | None, default_mode: int | None) -> int:
    if item_mode is not None:
        return item_mode
    return default_mode if default_mode is not None else DEFAULT_MODE


def _object_files(
    kind: str, name: str, src: Json, default_mode: int | None, lookup: BytesLookup
) -> list[VolumeFile]:
    data = lookup(kind, name)
    if data is None:
        if src.get("optional"):
            return []
        raise VolumeError(f'{kind} "{name}" not found')
    items = src.get("items")
    if not items:
        return [VolumeFile(k, v, _mode(None, default_mode)) for k, v in sorted(data.items())]
    files = []
    for item in items:
        if item["key"] not in data:
            if src.get("optional"):
                continue
            raise VolumeError(f'{kind} "{name}" has no key "{item["key"]}"')
        files.append(
            VolumeFile(item["path"], data[item["key"]], _mode(item.get("mode"), default_mode))
        )
    return files


def _downward_files(items: Iterable[Json], pod: Json, default_mode: int | None) -> list[VolumeFile]:
    files = []
    for item in items:
        if "fieldRef" not in item:
            raise VolumeError("downwardAPI: only fieldRef items are supported locally")
        value = field_value(pod, item["fieldRef"]["fieldPath"])
        files.append(
            VolumeFile(item["path"], value.encode(), _mode(item.get("mode"), default_mode))
        )
    return files


def _projected_files(
    src: Json, pod: Json, lookup: BytesLookup, issue_token: TokenIssuer
) -> list[VolumeFile]:
    default_mode = src.get("defaultMode")
    files: list[VolumeFile] = []
    for source in src.get("sources") or []:
        if "serviceAccountToken" in source:
            t = source["serviceAccountToken"]
            token = issue_token(t.get("audience", ""), int(t.get("expirationSeconds", 3600)))
            files.append(VolumeFile(t["path"], token.encode(), _mode(None, default_mode)))
        elif "secret" in source:
            s = source["secret"]
            files += _object_files("secret", s.get("name", ""), s, default_mode, lookup)
        elif "configMap" in source:
            c = source["configMap"]
            files += _object_files("configmap", c.get("name", ""), c, default_mode, lookup)
        elif "downwardAPI" in source:
            files += _downward_files(source["downwardAPI"].get("items") or [], pod, default_mode)
        else:
            raise VolumeError(f"projected source {sorted(source)} is not supported locally")
    return files


def write_files(directory: Path, files: Iterable[VolumeFile]) -> None:
    """Each file written whole, by a rename (a reader never sees half of one), and only
    where it changed."""
    directory.mkdir(parents=True, exist_ok=True)
    for f in files:
        path = directory / f.path
        path.parent.mkdir(parents=True, exist_ok=True)
        if _holds(path, f):
            continue
        staged = path.with_name(f".{path.name}.new")
        staged.write_bytes(f.content)
        os.chmod(staged, f.mode)
        os.replace(staged, path)


def _holds(path: Path, f: VolumeFile) -> bool:
    try:
        return path.read_bytes() == f.content and (path.stat().st_mode & 0o7777) == f.mode
    except OSError:
        return False


def decode_object_data(kind: str, obj: Json) -> dict[str, bytes]:
    """A Secret's or ConfigMap's data as bytes per key."""
    if kind == "secret":
        return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
    data = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
    data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    return data


class VolumeDirs:
    """Where each of a pod's volumes lives on the host; `claims` is the namespace's
    directory of persistentVolumeClaims."""

    def __init__(self, pod_dir: Path, volumes: Iterable[Json], claims: Path | None = None) -> None:
        self.root = pod_dir / "volumes"
        self.claims = claims if claims is not None else pod_dir / "claims"
        self._volumes = {v["name"]: v for v in volumes}

    def source(self, name: str) -> Path:
        volume = self._volumes.get(name)
        if volume is None:
            raise VolumeError(f'volume "{name}" is mounted but not defined')
        if "hostPath" in volume:
            return Path(volume["hostPath"]["path"])
        if "persistentVolumeClaim" in volume:
            return self.claims / str(volume["persistentVolumeClaim"]["claimName"])
        return self.root / name

    def read_only(self, name: str) -> bool:
        """Whether the volume itself is read-only (a claim mounted readOnly)."""
        return bool(
            (self._volumes.get(name, {}).get("persistentVolumeClaim") or {}).get("readOnly")
        )

    def needs_files(self) -> list[Json]:
        kinds = ("secret", "configMap", "downwardAPI", "projected")
        return [v for v in self._volumes.values() if any(k in v for k in kinds)]

    def prepare(self) -> None:
        """Creates the emptyDir directories and hostPath ones whose type asks for it."""
        for name, volume in self._volumes.items():
            if "emptyDir" in volume or "persistentVolumeClaim" in volume:
                self.source(name).mkdir(parents=True, exist_ok=True)
                # World-writable, as the kubelet makes an emptyDir: containers of any user
                # share it.
                self.source(name).chmod(0o777)
            elif (volume.get("hostPath") or {}).get("type") == "DirectoryOrCreate":
                Path(volume["hostPath"]["path"]).mkdir(parents=True, exist_ok=True)


def container_mounts(container: Json, dirs: VolumeDirs) -> list[Mount]:
    """The container's volumeMounts as bind mounts, subPath included, shallowest first so a
    mount inside another lands on top of it."""
    mounts = []
    for vm in container.get("volumeMounts") or []:
        source = dirs.source(vm["name"])
        if vm.get("subPath"):
            source = source / vm["subPath"]
        read_only = bool(vm.get("readOnly")) or dirs.read_only(vm["name"])
        mounts.append(Mount(source, vm["mountPath"], read_only))
    return sorted(mounts, key=lambda m: m.target.rstrip("/").count("/"))
