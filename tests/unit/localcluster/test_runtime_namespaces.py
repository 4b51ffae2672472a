"""Which namespaces a pod's containers get (pure): as runc and the kubelet give them."""

from __future__ import annotations

from typing import Any

import pytest

from pdd_localcluster.runtime.namespaces import PodNamespaces, pod_namespaces


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({}, PodNamespaces("container", own_ipc=True, own_uts=True, hostname="p")),
        ({"shareProcessNamespace": True}, PodNamespaces("pod", True, True, "p")),
        ({"hostPID": True}, PodNamespaces("host", True, True, "p")),
        # hostPID wins: the API server refuses both together, the node's namespace is wider.
        ({"hostPID": True, "shareProcessNamespace": True}, PodNamespaces("host", True, True, "p")),
        ({"hostIPC": True}, PodNamespaces("container", False, True, "p")),
        ({"hostNetwork": True}, PodNamespaces("container", True, False, "p")),
        ({"hostname": "h1"}, PodNamespaces("container", True, True, "h1")),
    ],
)
def test_pod_namespaces(spec: dict[str, Any], expected: PodNamespaces) -> None:
    assert pod_namespaces({"metadata": {"name": "p"}, "spec": spec}) == expected


def test_the_host_name_is_cut_to_what_linux_takes() -> None:
    namespaces = pod_namespaces({"metadata": {"name": "x" * 80}, "spec": {}})
    assert namespaces.hostname == "x" * 63
    assert namespaces.pod_pid_namespace is False
