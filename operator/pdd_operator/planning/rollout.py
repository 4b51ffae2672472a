"""Coordinated rollout of prefill and decode (pure): StatefulSet partitions, step by step.

A new engine revision must not leave a new prefill pod without a decode pod it can hand KV
blocks to (pods pair only within one `pdd.dev/revision`). So the two roles move in lockstep:
decode first, then whichever role has updated the smaller share of its pods, one pod at a time,
and only once every pod updated so far is Ready. With the PodDisruptionBudgets this keeps at
most one instance per role out of service, and the roles never drift a revision apart.

A router pairs the pods of one revision (rendering.router.router_discovery). It keeps pairing
the old revision until the new one has a Ready pod in every role (serving_revision): a router
of the new revision would have nothing to send to before, and one that is Ready without
workers (an autoscaled deployment's) would take the traffic from the old. Then the routers
roll, and the last old pod of a role waits until no router of the old revision is left.
A role of one replica cannot keep an old pod while its new one starts: its rollout has a gap.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from pdd_operator.api import names

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


class ObservedChild(Protocol):
    """What the rollout reads of a child (status.observe.ChildSummary)."""

    @property
    def key(self) -> tuple[str, str, str]: ...  # (apiVersion, kind, name)
    @property
    def role(self) -> str: ...
    @property
    def template_revision(self) -> str: ...  # the revision label of its pod template
    @property
    def partition(self) -> int: ...


class ObservedPod(Protocol):
    """What the rollout reads of a pod (status.observe.PodSummary)."""

    @property
    def role(self) -> str: ...
    @property
    def revision(self) -> str: ...
    @property
    def ready(self) -> bool: ...
    @property
    def terminating(self) -> bool: ...


def rollout_partitions(
    revision: str,
    replicas: Mapping[str, int],
    children: Iterable[ObservedChild],
    pods: Iterable[ObservedPod],
) -> dict[str, int]:
    """Partitions for this reconcile, from the observed StatefulSets and pods (routers' too): a
    new revision starts with nothing updated in either role; a rollout in progress advances
    one pod at a time (next_partitions)."""
    existing = {
        child.role: child
        for child in children
        if child.key[1] == "StatefulSet" and child.role in names.ROLES and child.role in replicas
    }
    if any(s.template_revision != revision for s in existing.values()):
        return {role: replicas[role] for role in existing}
    pods = list(pods)
    updated = [p for p in pods if p.revision == revision]
    # A terminating router still answers the requests it has taken: it counts until gone.
    old_routers = any(p.role == "router" and p.revision != revision for p in pods)
    states = {
        role: RoleRollout(
            replicas=replicas[role],
            partition=s.partition,
            updated_ready=sum(1 for p in updated if p.role == role and p.ready),
            updated=sum(1 for p in updated if p.role == role),
        )
        for role, s in existing.items()
    }
    return next_partitions(states, old_routers) if states else {}


def serving_revision(
    revision: str, children: Iterable[ObservedChild], pods: Iterable[ObservedPod]
) -> str:
    """The revision the router pairs: the spec's `revision`, unless the router still pairs
    another one that has a Ready pod in every role while `revision` has not yet. Once the
    router pairs `revision` it stays there."""
    current = next(
        (c.template_revision for c in children if c.key[1] == "Deployment" and c.role == "router"),
        "",
    )
    if not current or current == revision:
        return revision
    serving = [p for p in pods if p.role in names.ROLES and not p.terminating]
    roles = {p.role for p in serving}

    def ready_in_every_role(rev: str) -> bool:
        ready = {p.role for p in serving if p.revision == rev and p.ready}
        return bool(roles) and ready == roles

    if ready_in_every_role(current) and not ready_in_every_role(revision):
        return current
    return revision


def next_partitions(roles: dict[str, RoleRollout], old_routers: bool = False) -> dict[str, int]:
    """Partitions for this step: at most one role advances by one pod, and only when both
    roles are settled (nothing updating is still unready); a role's last old pod waits for
    the old routers to go (`old_routers`: a router pod of an older revision still exists)."""
    partitions = {role: state.pending for role, state in roles.items()}
    if not all(state.settled for state in roles.values()):
        return partitions
    handing_over = old_routers and all(state.updated_ready > 0 for state in roles.values())
    movable = [
        role
        for role in ROLE_ORDER
        if role in roles and partitions[role] > (1 if handing_over else 0)
    ]
    if not movable:
        return partitions
    # The role that is furthest behind moves; ties go to decode (ROLE_ORDER).
    role = min(movable, key=lambda r: (roles[r].share, ROLE_ORDER.index(r)))
    partitions[role] -= 1
    return partitions


def starting_partitions(replicas: dict[str, int]) -> dict[str, int]:
    """A new revision starts with nothing updated."""
    return dict(replicas)
