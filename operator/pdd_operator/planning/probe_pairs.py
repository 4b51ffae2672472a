"""Which pods measure the KV path, and against which peer (pure).

A deployment of single-node roles has one prober pod (`names.prober_pod_name`) that probes
any decode pod. Where a role's instances span nodes, each rank has its own GPUs and NICs,
so one measurement says nothing about the others: every prefill rank probes, each against
its pair, so that every rank of both roles is on a measured path as far as the shapes allow.
Prefill instance i pairs with decode instance i mod D (D decode instances), and its rank r
with rank r mod M of that instance (M ranks per decode instance). All of them sit in the one
slice domain the planner chose, so the pairs stay inside it.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdd_operator.api import names
from pdd_operator.api.v1alpha1 import MAX_TRANSFER_RANKS, PDDeployment

# At most this many prefill ranks are asked (each listed in status.transfer.ranks): two
# 16-node instances. The ranks past it are not measured; docs/multinode.md says so.
MAX_RANK_PROBES = MAX_TRANSFER_RANKS


@dataclass(frozen=True)
class ProbePair:
    pod: str  # the prefill rank that runs the probe
    instance: int
    rank: int
    peer: str  # the decode pod it measures against


def per_rank_probes(pdd: PDDeployment) -> bool:
    """Every prefill rank probes when either role's instances span nodes."""
    return pdd.spec.prefill.nodesPerInstance > 1 or pdd.spec.decode.nodesPerInstance > 1


def probe_pairs(pdd: PDDeployment) -> list[ProbePair]:
    """The prefill ranks that probe, in instance then rank order, each with its decode pair;
    none while either role has no instance (nothing to measure between)."""
    prefill, decode = pdd.spec.prefill, pdd.spec.decode
    if not per_rank_probes(pdd) or prefill.replicas < 1 or decode.replicas < 1:
        return []
    pairs = [
        ProbePair(
            pod=names.rank_pod_name(pdd.name, "prefill", prefill.nodesPerInstance, i, r),
            instance=i,
            rank=r,
            peer=names.rank_pod_name(
                pdd.name,
                "decode",
                decode.nodesPerInstance,
                i % decode.replicas,
                r % decode.nodesPerInstance,
            ),
        )
        for i in range(prefill.replicas)
        for r in range(prefill.nodesPerInstance)
    ]
    return pairs[:MAX_RANK_PROBES]
