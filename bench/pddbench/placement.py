"""Placement quality on a fleet with fragmented free capacity: the operator's planner
(`plan_placement`, then the real kube-scheduler inside the chosen domain) against the
default scheduler alone (`topology.placement: none`), on the same fillers and the same
sequence of deployments."""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import config as kconfig

from pdd_contract.labels import LABEL_DEPLOYMENT
from pdd_contract.resources import GPU_RESOURCE
from pdd_operator.kube.client import KubeApi
from pdd_operator.planning.node_facts import pod_gpu_request
from pddbench import analysis
from pddbench.cluster import (
    APPLY_USER,
    CLIQUE_LABEL,
    OPERATOR_USER,
    RACK_LABEL,
    BenchCluster,
    FleetSpec,
    node_domains,
)
from pddbench.scale import OPERATOR_ENV, OperatorProcess, install_operator
from pddbench.workload import PLACEMENT_MIX, pdd_body, pick_shapes

NS = "place"
FILLER_NS = "filler"
GPUS_PER_NODE = 8
# GPUs already taken on a node by other work: weights for 0..8 used GPUs.
USED_WEIGHTS = (2, 1, 1, 2, 2, 2, 2, 1, 1)


@dataclass(frozen=True)
class PlacementConfig:
    fleet: FleetSpec
    deployments: int
    seed: int = 11
    arms: tuple[str, ...] = ("required", "preferred", "none")
    controller_qps: int = 400
    bind_timeout: float = 45.0
    extra: dict[str, Any] = field(default_factory=dict)


def run_placement(cfg: PlacementConfig, work_dir: Path, raw_dir: Path, log: Any) -> dict[str, Any]:
    rng = random.Random(cfg.seed)
    shapes = pick_shapes(cfg.deployments, PLACEMENT_MIX, cfg.seed)
    out: dict[str, Any] = {
        "config": {**asdict(cfg), "nodes": cfg.fleet.nodes},
        "link_gbps": analysis.LINK_GBPS,
        "kv_bytes": analysis.KV_BYTES,
        "shapes": [s.name for s in shapes],
        "arms": {},
    }
    raw_dir.mkdir(parents=True, exist_ok=True)
    with BenchCluster(work_dir, cfg.fleet, controller_qps=cfg.controller_qps, log=log) as cl:
        assert cl.cp is not None and cl.kube is not None
        domains = node_domains(cl.nodes)
        cl.create_namespace(FILLER_NS)
        cl.create_namespace(NS)
        used = _fill(cl, rng)
        out["fillers"] = {
            "gpus_total": GPUS_PER_NODE * len(cl.nodes),
            "gpus_used": sum(used.values()),
            "free_per_node_histogram": _hist([GPUS_PER_NODE - used[n.name] for n in cl.nodes]),
            "demand_gpus": sum(s.gpus for s in shapes),
        }
        install_operator(cl)
        op = OperatorProcess(
            cl.kubeconfig_for(OPERATOR_USER),
            raw_dir / "placement-operator.log",
            30.0,
            extra_env=OPERATOR_ENV,
        ).start()
        kube = KubeApi(
            kconfig.new_client_from_config(config_file=str(cl.kubeconfig_for(APPLY_USER))),
            "bench-user",
        )
        try:
            time.sleep(2)
            for arm in cfg.arms:
                log(f"  placement arm {arm}: {len(shapes)} deployments, one after the other")
                out["arms"][arm] = _run_arm(cl, kube, arm, shapes, domains, cfg)
                s = out["arms"][arm]
                log(
                    f"    within clique {s['share_within_clique']:.0%}, within rack "
                    f"{s['share_within_rack']:.0%}, in best domain with room "
                    f"{s['share_in_best_domain']:.0%}, KV mean "
                    f"{s['kv_transfer_ms'].get('mean')} ms p99 {s['kv_transfer_ms'].get('p99')} ms"
                )
                _delete_all(cl, kube)
        finally:
            op.kill()
    return out


def _fill(cl: BenchCluster, rng: random.Random) -> dict[str, int]:
    """Filler pods of random GPU counts bound straight to nodes (bypassing the scheduler)."""
    assert cl.kube is not None
    used: dict[str, int] = {}
    for node in cl.nodes:
        target = rng.choices(range(GPUS_PER_NODE + 1), weights=USED_WEIGHTS)[0]
        used[node.name] = target
        i = 0
        while target > 0:
            size = min(target, rng.randint(1, 4))
            target -= size
            cl.kube.request(
                "POST",
                f"/api/v1/namespaces/{FILLER_NS}/pods",
                body={
                    "metadata": {"name": f"fill-{node.name}-{i}"},
                    "spec": {
                        "nodeName": node.name,
                        "containers": [
                            {
                                "name": "work",
                                "image": "registry.k8s.io/pause:3.10",
                                "resources": {
                                    "requests": {GPU_RESOURCE: str(size)},
                                    "limits": {GPU_RESOURCE: str(size)},
                                },
                            }
                        ],
                    },
                },
            )
            i += 1
    return used


def _free_by_node(cl: BenchCluster) -> dict[str, int]:
    assert cl.kube is not None
    pods, _ = cl.kube.list_all("/api/v1/pods", {"fieldSelector": "spec.nodeName!="})
    used: dict[str, int] = {}
    for pod in pods:
        if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        node = pod["spec"]["nodeName"]
        used[node] = used.get(node, 0) + pod_gpu_request(pod["spec"])
    return {n.name: GPUS_PER_NODE - used.get(n.name, 0) for n in cl.nodes}


def best_level(
    groups: list[tuple[int, int]], free: dict[str, int], nodes: list[Any]
) -> tuple[str, int, int]:
    """The best topology level with a domain that has room: (level, cliques with room,
    racks with room); level is "clique", "rack" or "cluster"."""
    by: dict[str, dict[str, list[int]]] = {"clique": {}, "rack": {}}
    for n in nodes:
        by["clique"].setdefault(n.labels[CLIQUE_LABEL], []).append(free[n.name])
        by["rack"].setdefault(n.labels[RACK_LABEL], []).append(free[n.name])
    cliques = sum(1 for f in by["clique"].values() if analysis.fits(groups, f))
    racks = sum(1 for f in by["rack"].values() if analysis.fits(groups, f))
    level = "clique" if cliques else "rack" if racks else "cluster"
    return level, cliques, racks


def _run_arm(
    cl: BenchCluster,
    kube: KubeApi,
    arm: str,
    shapes: list[Any],
    domains: dict[str, tuple[str, str]],
    cfg: PlacementConfig,
) -> dict[str, Any]:
    assert cl.kube is not None
    per_dep: list[dict[str, Any]] = []
    all_pairs: dict[str, list[str]] = {}
    in_best = counted = 0
    for i, shape in enumerate(shapes):
        name = f"{arm[:4]}-{i:02d}"
        groups: dict[int, int] = {}
        for tp, count in ((shape.prefill_tp, shape.prefill), (shape.decode_tp, shape.decode)):
            groups[tp] = groups.get(tp, 0) + count
        level, cliques, racks = best_level(sorted(groups.items()), _free_by_node(cl), cl.nodes)
        kube.apply(pdd_body(name, NS, shape, arm))
        pods = _wait_bound(cl, name, shape.pods, cfg.bind_timeout)
        pairs = analysis.deployment_pairs(pods, domains).get(name, [])
        all_pairs[name] = pairs
        if level in ("clique", "rack"):
            ok = {"clique": ("node", "clique"), "rack": ("node", "clique", "rack")}[level]
            in_best += sum(1 for p in pairs if p in ok)
            counted += len(pairs)
        body = cl.kube.request(
            "GET", f"/apis/pdd.dev/v1alpha1/namespaces/{NS}/pddeployments/{name}"
        )
        placed = next(
            (
                c
                for c in (body.get("status") or {}).get("conditions") or []
                if c["type"] == "Placed"
            ),
            {},
        )
        per_dep.append(
            {
                "name": name,
                "shape": shape.name,
                "gpus": shape.gpus,
                "best_level_with_room": level,
                "cliques_with_room": cliques,
                "racks_with_room": racks,
                "bound_pods": sum(1 for p in pods if p["spec"].get("nodeName")),
                "pods": shape.pods,
                "planner": {
                    "level": (body.get("status") or {}).get("placement", {}).get("level", ""),
                    "domain": (body.get("status") or {}).get("placement", {}).get("domain", ""),
                    "reason": placed.get("reason", ""),
                },
                "pairs": analysis.pair_summary({name: pairs})["share"],
            }
        )
    summary = analysis.pair_summary(all_pairs)
    summary["share_in_best_domain"] = round(in_best / counted, 4) if counted else 1.0
    summary["pairs_with_a_domain_with_room"] = counted
    summary["deployments_fully_bound"] = sum(1 for d in per_dep if d["bound_pods"] == d["pods"])
    summary["per_deployment"] = per_dep
    return summary


def _wait_bound(cl: BenchCluster, name: str, want: int, timeout: float) -> list[dict[str, Any]]:
    assert cl.kube is not None
    deadline = time.monotonic() + timeout
    selector = {"labelSelector": f"{LABEL_DEPLOYMENT}={name}"}
    while True:
        pods, _ = cl.kube.list_all(f"/api/v1/namespaces/{NS}/pods", selector)
        bound = [
            p
            for p in pods
            if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
        ]
        if len(bound) >= want or time.monotonic() > deadline:
            return pods
        time.sleep(0.3)


def _delete_all(cl: BenchCluster, kube: KubeApi) -> None:
    assert cl.kube is not None
    path = f"/apis/pdd.dev/v1alpha1/namespaces/{NS}/pddeployments"
    items, _ = cl.kube.list_all(path, {})
    for item in items:
        cl.kube.request(
            "DELETE",
            f"{path}/{item['metadata']['name']}",
            body={"propagationPolicy": "Background"},
        )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pods, _ = cl.kube.list_all(f"/api/v1/namespaces/{NS}/pods", {})
        if not pods:
            return
        time.sleep(0.5)
    raise TimeoutError("pods of the previous placement arm are still there")


def _hist(values: list[int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in sorted(values):
        out[str(v)] = out.get(str(v), 0) + 1
    return out
