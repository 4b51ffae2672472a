"""From observed StatefulSets and pods to the rollout step (pure glue over the planner)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pdd_operator.api import names
from pdd_operator.planning.rollout import RoleRollout, next_partitions
from pdd_operator.status.observe import ChildKey, ChildSummary, PodSummary


def rollout_partitions(
    revision: str,
    replicas: Mapping[str, int],
    children: Mapping[ChildKey, ChildSummary],
    pods: Sequence[PodSummary],
) -> dict[str, int]:
    """Partitions for this reconcile: a new revision starts with nothing updated in either
    role; a rollout in progress advances one pod at a time (see planning.rollout)."""
    statefulsets = {
        s.role: s for s in children.values() if s.key[1] == "StatefulSet" and s.role in names.ROLES
    }
    existing = {role: s for role, s in statefulsets.items() if role in replicas}
    if any(s.template_revision != revision for s in existing.values()):
        return {role: replicas[role] for role in existing}
    states = {
        role: RoleRollout(
            replicas=replicas[role],
            partition=s.partition,
            updated_ready=sum(
                1 for p in pods if p.role == role and p.revision == revision and p.ready
            ),
            updated=sum(1 for p in pods if p.role == role and p.revision == revision),
        )
        for role, s in existing.items()
    }
    return next_partitions(states) if states else {}
