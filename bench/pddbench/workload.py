"""The PDDeployments of a run, and the same workloads rendered as plain children (the
"applied by hand" arm: exactly what the operator would apply, without an owner)."""

from __future__ import annotations

import copy
import random
import secrets
from dataclasses import dataclass
from typing import Any

from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.planning.placement import Placement
from pdd_operator.rendering.children import render_children
from pdd_operator.rendering.context import RenderContext
from pdd_operator.rendering.sidecar import render_token_secret, sidecar_enabled

GROUP, VERSION, PLURAL = "pdd.dev", "v1alpha1", "pddeployments"
LEVELS = ["nvidia.com/gpu.clique", "topology.kubernetes.io/rack"]


@dataclass(frozen=True)
class Shape:
    name: str
    prefill: int
    prefill_tp: int
    decode: int
    decode_tp: int
    weight: float

    @property
    def gpus(self) -> int:
        return self.prefill * self.prefill_tp + self.decode * self.decode_tp

    @property
    def pods(self) -> int:
        return self.prefill + self.decode


# 2P/4D at tensor-parallel 1 or 2 is the typical deployment; a few are larger.
SCALE_MIX = (
    Shape("2p4d-tp1", 2, 1, 4, 1, 0.55),
    Shape("2p4d-tp2", 2, 2, 4, 2, 0.30),
    Shape("2p2d-tp4", 2, 4, 2, 4, 0.10),
    Shape("4p8d-tp2", 4, 2, 8, 2, 0.05),
)

PLACEMENT_MIX = (
    Shape("2p4d-tp1", 2, 1, 4, 1, 0.35),
    Shape("2p4d-tp2", 2, 2, 4, 2, 0.35),
    Shape("1p2d-tp4", 1, 4, 2, 4, 0.15),
    Shape("4p4d-tp1", 4, 1, 4, 1, 0.15),
)


def pick_shapes(n: int, mix: tuple[Shape, ...], seed: int) -> list[Shape]:
    rng = random.Random(seed)
    return rng.choices(mix, weights=[s.weight for s in mix], k=n)


def pdd_body(name: str, namespace: str, shape: Shape, placement: str) -> dict[str, Any]:
    """A vLLM PDDeployment like examples/vllm-2p4d.yaml, without the RDMA resource (the
    simulated nodes have none) and without the router (in both arms)."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PDDeployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-70B-Instruct", "servedName": "llama-70b"},
            "engine": {
                "type": "vllm",
                "image": "vllm/vllm-openai:v0.11.0",
                "args": ["--max-model-len", "32768"],
            },
            "prefill": {
                "replicas": shape.prefill,
                "gpusPerInstance": shape.prefill_tp,
                "resources": {"requests": {"cpu": "4", "memory": "32Gi"}},
            },
            "decode": {
                "replicas": shape.decode,
                "gpusPerInstance": shape.decode_tp,
                "resources": {"requests": {"cpu": "4", "memory": "32Gi"}},
            },
            "router": {"enabled": False},
            "topology": {"placement": placement, "levels": list(LEVELS)},
        },
    }


def with_defaults(body: dict[str, Any], server_body: dict[str, Any] | None) -> dict[str, Any]:
    """The body as the operator sees it: the apiserver's copy (schema defaults applied) when
    known, else ours; with a uid so the renderer can name an owner."""
    out = copy.deepcopy(server_body or body)
    out["metadata"].setdefault("uid", "00000000-0000-0000-0000-000000000000")
    return out


def render_plain(body: dict[str, Any], placement: Placement) -> list[dict[str, Any]]:
    """What the operator would apply for `body` with `placement`, without ownerReferences,
    plus the sidecar token Secret it creates; in the operator's apply order."""
    pdd = PDDeployment.from_body(body)
    children = render_children(pdd, RenderContext(placement=placement))
    for obj in children:
        obj["metadata"] = {k: v for k, v in obj["metadata"].items() if k != "ownerReferences"}
    if sidecar_enabled(pdd.spec):
        children.append(render_token_secret(pdd, secrets.token_urlsafe(32)))
    return children
