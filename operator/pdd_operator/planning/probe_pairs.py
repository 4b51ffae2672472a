"""Which pods measure the KV path, and against which peer (pure).

A deployment of single-node roles in one domain has one prober pod
(`names.prober_pod_name`) that probes any decode pod. Two shapes need more, each prober
with a named peer:

- Where a role's instances span nodes, each rank has its own GPUs and NICs, so one
  measurement says nothing about the others: every prefill rank probes its pair, so that
  every rank of both roles is on a measured path as far as the shapes allow. Prefill
  instance i pairs with decode instance i mod D (D decode instances), and its rank r with
  rank r mod M of that instance (M ranks per decode instance).
- Where the deployment may grow by slices (planning.slices), each slice is a domain of its
  own whose pairs never cross to another: the first prefill pod of every slice probes the
  first decode pod of the same slice (an unnamed peer could be another slice's decode, a
  path no request takes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from pdd_operator.api import names
from pdd_operator.api.v1alpha1 import MAX_TRANSFER_RANKS, PDDeployment
from pdd_operator.planning.slices import slices_possible

# At most this many prefill ranks are asked (each listed in status.transfer.ranks): two
# 16-node instances. The ranks past it are not measured; docs/multinode.md says so.
MAX_RANK_PROBES = MAX_TRANSFER_RANKS


@dataclass(frozen=True)
class ProbePair:
    pod: str  # the prefill rank that runs the probe
    instance: int
    rank: int
    peer: str  # the decode pod it measures against
    slice: int | None = None  # the slice it measures, where probers are per slice


class SliceCounts(Protocol):
    """What the pairing reads of a slice (planning.slices.Slice, or status.slices' entry)."""

    @property
    def index(self) -> int: ...
    @property
    def prefill(self) -> int: ...
    @property
    def decode(self) -> int: ...


def per_rank_probes(pdd: PDDeployment) -> bool:
    """Probers with a named peer each: where either role's instances span nodes, or where
    the deployment may grow by slices (decided by the spec alone, so the pod template that
    says which pod answers does not change when a slice opens)."""
    return _spans_nodes(pdd) or slices_possible(pdd.spec)


def _spans_nodes(pdd: PDDeployment) -> bool:
    return pdd.spec.prefill.nodesPerInstance > 1 or pdd.spec.decode.nodesPerInstance > 1


def probe_pairs(
    pdd: PDDeployment, beyond_home: Sequence[SliceCounts] | None = None
) -> list[ProbePair]:
    """The prefill pods that probe, each with its decode pair: every rank in instance then
    rank order, or every slice's first pods in slice order; none while either role has no
    instance (nothing to measure between). `beyond_home`: the slices past the home domain
    this pass runs (the render context's); None: those status.slices shows."""
    prefill, decode = pdd.spec.prefill, pdd.spec.decode
    if not per_rank_probes(pdd) or prefill.replicas < 1 or decode.replicas < 1:
        return []
    if not _spans_nodes(pdd):
        if beyond_home is None:
            beyond_home = [s for s in pdd.status.slices if s.index > 0]
        return _slice_pairs(pdd, beyond_home)
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


def _slice_pairs(pdd: PDDeployment, beyond_home: Sequence[SliceCounts]) -> list[ProbePair]:
    """The home slice's first prefill and decode pods, then each further slice's that runs
    both roles."""
    runs_both = [s.index for s in beyond_home if s.prefill > 0 and s.decode > 0]
    return [
        ProbePair(
            pod=f"{_slice_workload(pdd.name, 'prefill', index)}-0",
            instance=0,
            rank=0,
            peer=f"{_slice_workload(pdd.name, 'decode', index)}-0",
            slice=index,
        )
        for index in [0, *runs_both]
    ][:MAX_RANK_PROBES]


def _slice_workload(name: str, role: str, index: int) -> str:
    return names.role_name(name, role) if index == 0 else names.slice_name(name, role, index)
