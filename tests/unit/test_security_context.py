"""Every container the operator renders is unprivileged: no privilege escalation, all
capabilities dropped except IPC_LOCK where RDMA pins memory, and the operator's own
containers (preflight, sidecar) run as non-root with a read-only root filesystem."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings

from helpers.specs import names, valid_specs
from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.rendering.children import render_children
from pdd_operator.rendering.context import RenderContext


def containers(children: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for child in children:
        if child["kind"] in ("StatefulSet", "Deployment"):
            pod = child["spec"]["template"]["spec"]
            out += pod.get("initContainers", []) + pod["containers"]
    return out


@settings(max_examples=150, deadline=None)
@given(name=names, spec=valid_specs())
def test_no_container_is_privileged_or_keeps_capabilities(name: str, spec: dict[str, Any]) -> None:
    body = {
        "metadata": {"name": name, "namespace": "ns", "uid": "u", "generation": 1},
        "spec": spec,
    }
    pdd = PDDeployment.from_body(body)
    rdma = bool(pdd.spec.kvTransfer.rdma.resourceName) or pdd.spec.topology.dra.enabled
    for c in containers(render_children(pdd, RenderContext())):
        security = c["securityContext"]
        assert security.get("privileged", False) is False, c["name"]
        assert security["allowPrivilegeEscalation"] is False, c["name"]
        assert security["capabilities"]["drop"] == ["ALL"], c["name"]
        added = security["capabilities"].get("add", [])
        assert added == (["IPC_LOCK"] if rdma and c["name"] == "engine" else []), c["name"]
        if c["name"] in ("preflight", "nixl-sidecar"):
            assert security["runAsNonRoot"] is True and security["readOnlyRootFilesystem"] is True
