"""Coordinated rollout of prefill and decode (pure): StatefulSet partitions, step by step.

A new engine revision must not leave a new prefill pod without a decode pod it can hand KV
blocks to (pods pair only within one `pdd.dev/revision`). So the two roles move in lockstep:
decode first, then whichever role has updated the smaller share of its pods, one pod at a time,
and only once every pod updated so far is Ready. With the PodDisruptionBudgets this keeps at
most one instance per role out of service, and the roles never drift a revision apart.
"""

from __future__ import annotations

from dataclasses import dataclass

ROLE_ORDER = ("decode", "prefill")  # decode first: a new prefill pod needs a new decode peer


@dataclass(frozen=True)
class RoleRollout:
    """One role's rollout state, from its StatefulSet and its pods."""

    replicas: int
    partition: int  # pods with ordinal >= partition run the new revision
    updated_ready: int  # pods of the new revision that are Ready
    updated: int  # pods of the new revision, ready or not

    @property
    def pending(self) -> int:
        """Pods still to update: the partition, clamped to the role's size."""
        return max(min(self.partition, self.replicas), 0)

    @property
    def done(self) -> bool:
        return self.partition <= 0 and self.updated_ready >= self.replicas

    @property
    def share(self) -> float:
        return 1.0 if self.replicas == 0 else (self.replicas - self.pending) / self.replicas

    @property
    def settled(self) -> bool:
        """Every pod asked to update so far runs the new revision and is Ready."""
        return self.updated_ready >= self.replicas - self.pending


def next_partitions(roles: dict[str, RoleRollout]) -> dict[str, int]:
    """Partitions for this step: at most one role advances by one pod, and only when both
    roles are settled (nothing updating is still unready)."""
    partitions = {role: state.pending for role, state in roles.items()}
    if not all(state.settled for state in roles.values()):
        return partitions
    movable = [role for role in ROLE_ORDER if role in roles and partitions[role] > 0]
    if not movable:
        return partitions
    # The role that is furthest behind moves; ties go to decode (ROLE_ORDER).
    role = min(movable, key=lambda r: (roles[r].share, ROLE_ORDER.index(r)))
    partitions[role] -= 1
    return partitions


def starting_partitions(replicas: dict[str, int]) -> dict[str, int]:
    """A new revision starts with nothing updated."""
    return dict(replicas)
