"""Every container the operator renders is unprivileged: the runtime's default seccomp profile,
no privilege escalation, all capabilities dropped except IPC_LOCK where RDMA pins memory, and
the operator's own containers (preflight, sidecar) and the router run as non-root. What Pod
Security admission makes of that, per deployment shape, is tests/integration/test_pod_security.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings

from helpers.specs import names, valid_specs
from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.offline import render_documents
from pdd_operator.rendering.children import render_children
from pdd_operator.rendering.context import RenderContext

EXAMPLES = sorted(
    p
    for p in (Path(__file__).resolve().parents[2] / "examples").rglob("*.yaml")
    if "kind: PDDeployment" in p.read_text()
)
NON_ROOT = ("preflight", "nixl-sidecar", "router")
RUNTIME_DEFAULT = {"type": "RuntimeDefault"}


def pod_specs(children: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        child["spec"]["template"]["spec"]
        for child in children
        if child["kind"] in ("StatefulSet", "Deployment")
    ]


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def check_pod(pod: dict[str, Any], rdma: bool) -> None:
    pod_seccomp = (pod.get("securityContext") or {}).get("seccompProfile")
    for c in containers(pod):
        security = c["securityContext"]
        assert security.get("seccompProfile", pod_seccomp) == RUNTIME_DEFAULT, c["name"]
        assert security.get("privileged", False) is False, c["name"]
        assert security["allowPrivilegeEscalation"] is False, c["name"]
        assert security["capabilities"]["drop"] == ["ALL"], c["name"]
        added = security["capabilities"].get("add", [])
        assert added == (["IPC_LOCK"] if rdma and c["name"] == "engine" else []), c["name"]
        if c["name"] in NON_ROOT:
            assert security["runAsNonRoot"] is True, c["name"]
            assert security["runAsUser"] != 0, c["name"]
        if c["name"] in ("preflight", "nixl-sidecar"):
            assert security["readOnlyRootFilesystem"] is True, c["name"]
            # Theirs even where a podTemplate changes the pod's profile.
            assert security["seccompProfile"] == RUNTIME_DEFAULT, c["name"]
    check_file_volumes_readable(pod)


def check_file_volumes_readable(pod: dict[str, Any]) -> None:
    """The kubelet writes Secret and projected files as root (group root, or the pod's fsGroup
    where one is set) with the volume's mode: a container that runs as another user and has
    no fsGroup to read by reads them only where the mode lets others read."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    fs_group = (pod.get("securityContext") or {}).get("fsGroup")
    for c in containers(pod):
        uid = c["securityContext"].get("runAsUser", 0)
        if uid == 0 or fs_group is not None:
            continue
        for mount in c.get("volumeMounts", []):
            source = volumes[mount["name"]]
            kind = next((k for k in ("secret", "projected") if k in source), None)
            if kind is None:
                continue
            mode = source[kind].get("defaultMode", 0o644)
            assert mode & 0o004, f"{c['name']} (uid {uid}) cannot read {mount['name']}"


@settings(max_examples=150, deadline=None)
@given(name=names, spec=valid_specs())
def test_no_container_is_privileged_or_keeps_capabilities(name: str, spec: dict[str, Any]) -> None:
    body = {
        "metadata": {"name": name, "namespace": "ns", "uid": "u", "generation": 1},
        "spec": spec,
    }
    pdd = PDDeployment.from_body(body)
    rdma = bool(pdd.spec.kvTransfer.rdma.resourceName) or pdd.spec.topology.dra.enabled
    for pod in pod_specs(render_children(pdd, RenderContext())):
        check_pod(pod, rdma)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_container_of_every_example_is_confined(example: Path) -> None:
    (rendered,) = render_documents(yaml.safe_load_all(example.read_text()))
    documents = list(yaml.safe_load_all(example.read_text()))
    rdma = any(bool(d["spec"].get("kvTransfer", {}).get("rdma")) for d in documents if d)
    pods = pod_specs(rendered.children)
    assert {c["name"] for pod in pods for c in containers(pod)} >= {"engine", *NON_ROOT}
    for pod in pods:
        check_pod(pod, rdma)
