"""Rollouts replace instances over several nodes whole, one at a time (pure).

A StatefulSet's rolling update replaces one pod at a time, so an instance's ranks would run
two revisions side by side, and each replaced rank would break the instance's collective
again. Instance StatefulSets therefore use the OnDelete strategy, and the operator replaces an
instance by deleting all its rank pods together once every instance is whole and Ready:
decode first (a new prefill needs a new decode peer), then whichever role has updated the
smaller share of its instances, as the single-node rollout does (planning.rollout).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pdd_operator.api import condition_reasons as reasons
from pdd_operator.planning.instance_restart import InstanceRestart, RankPod
from pdd_operator.planning.rollout import ROLE_ORDER


@dataclass(frozen=True)
class RoleShape:
    instances: int  # how many instances the role runs
    nodes: int  # rank pods per instance


def next_instance_to_replace(
    revision: str, pods: Iterable[RankPod], shapes: Mapping[str, RoleShape]
) -> InstanceRestart | None:
    """The instance to replace now, or None: while any instance is missing, short of ranks,
    not Ready or terminating, nothing (one instance out of service at a time). An instance
    with no pod in view is out of service too: its pods were deleted and the StatefulSet has
    not made them anew yet."""
    groups: dict[tuple[str, str], list[RankPod]] = {}
    for pod in pods:
        if pod.instance and pod.role in shapes:
            groups.setdefault((pod.role, pod.instance), []).append(pod)
    wanted = {(role, str(i)) for role, shape in shapes.items() for i in range(shape.instances)}
    if not wanted <= groups.keys():
        return None
    if any(not _whole_and_ready(ranks, shapes[role].nodes) for (role, _), ranks in groups.items()):
        return None
    stale = [key for key, ranks in groups.items() if any(p.revision != revision for p in ranks)]
    if not stale:
        return None

    def order(key: tuple[str, str]) -> tuple[float, int, int]:
        role, instance = key
        mine = [k for k in groups if k[0] == role]
        updated = sum(1 for k in mine if k not in stale)
        return (updated / len(mine), ROLE_ORDER.index(role), int(instance))

    role, instance = min(stale, key=order)
    ranks = groups[(role, instance)]
    return InstanceRestart(
        role,
        instance,
        f"rolling out revision {revision}",
        tuple(sorted((p.name, p.uid) for p in ranks)),
        event=reasons.INSTANCE_REPLACED,
    )


def _whole_and_ready(ranks: list[RankPod], nodes: int) -> bool:
    return len(ranks) == nodes and all(p.ready and not p.terminating for p in ranks)
