"""Volumes of a locally run pod: the files each holds and the bind mounts of a container."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from pdd_localcluster.runtime.volumes import (
    VolumeDirs,
    VolumeError,
    VolumeFile,
    container_mounts,
    decode_object_data,
    volume_files,
)

POD: dict[str, Any] = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": {}}
OBJECTS = {
    ("secret", "tok"): {"token": b"t", "other": b"o"},
    ("configmap", "kube-root-ca.crt"): {"ca.crt": b"CA"},
}


def lookup(kind: str, name: str) -> Mapping[str, bytes] | None:
    return OBJECTS.get((kind, name))


def token(audience: str, seconds: int) -> str:
    return f"jwt:{audience}:{seconds}"


def files(volume: dict[str, Any]) -> list[VolumeFile]:
    return volume_files(volume, POD, lookup, token)


def test_secret_with_default_mode_and_items() -> None:
    assert files({"secret": {"secretName": "tok", "defaultMode": 0o440}}) == [
        VolumeFile("other", b"o", 0o440),
        VolumeFile("token", b"t", 0o440),
    ]
    items = [{"key": "token", "path": "dir/t", "mode": 0o400}]
    assert files({"secret": {"secretName": "tok", "items": items}}) == [
        VolumeFile("dir/t", b"t", 0o400)
    ]


def test_missing_objects_fail_unless_optional() -> None:
    with pytest.raises(VolumeError, match='secret "nope" not found'):
        files({"secret": {"secretName": "nope"}})
    with pytest.raises(VolumeError, match="no key"):
        files({"secret": {"secretName": "tok", "items": [{"key": "x", "path": "x"}]}})
    assert files({"configMap": {"name": "nope", "optional": True}}) == []


def test_the_service_account_volume_the_apiserver_adds() -> None:
    projected = {
        "defaultMode": 420,
        "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {
                "configMap": {
                    "name": "kube-root-ca.crt",
                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                }
            },
            {
                "downwardAPI": {
                    "items": [
                        {"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}
                    ]
                }
            },
        ],
    }
    assert files({"projected": projected}) == [
        VolumeFile("token", b"jwt::3607", 420),
        VolumeFile("ca.crt", b"CA", 420),
        VolumeFile("namespace", b"ns", 420),
    ]


def test_decode_object_data() -> None:
    assert decode_object_data("secret", {"data": {"k": "aGk="}}) == {"k": b"hi"}
    cm = {"data": {"a": "x"}, "binaryData": {"b": "aGk="}}
    assert decode_object_data("configmap", cm) == {"a": b"x", "b": b"hi"}


def test_container_mounts_read_only_sub_path_and_order(tmp_path: Path) -> None:
    volumes = [
        {"name": "env", "emptyDir": {"medium": "Memory"}},
        {"name": "tok", "secret": {"secretName": "tok"}},
        {"name": "host", "hostPath": {"path": "/srv/models"}},
        {"name": "model", "persistentVolumeClaim": {"claimName": "hf", "readOnly": True}},
    ]
    dirs = VolumeDirs(tmp_path, volumes, claims=tmp_path / "claims")
    container = {
        "volumeMounts": [
            {"name": "tok", "mountPath": "/var/run/pdd/token", "readOnly": True},
            {"name": "env", "mountPath": "/pdd/env"},
            {"name": "host", "mountPath": "/models", "subPath": "llama"},
            {"name": "model", "mountPath": "/hf"},
        ]
    }
    mounts = [(str(m.source), m.target, m.read_only) for m in container_mounts(container, dirs)]
    assert mounts == [
        ("/srv/models/llama", "/models", False),
        (str(tmp_path / "claims" / "hf"), "/hf", True),  # the claim's readOnly
        (str(tmp_path / "volumes" / "env"), "/pdd/env", False),
        (str(tmp_path / "volumes" / "tok"), "/var/run/pdd/token", True),
    ]
    with pytest.raises(VolumeError, match="not defined"):
        container_mounts({"volumeMounts": [{"name": "x", "mountPath": "/x"}]}, dirs)
