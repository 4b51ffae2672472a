"""Failure of one rank restarts its whole instance (pure).

The ranks of an instance over several nodes are one engine: their collectives (NCCL, the
torch.distributed store at the leader) do not take a rank back that restarted alone, so an
instance whose rank's engine container restarted, or whose rank pod failed, serves nothing
until every rank starts again together. The operator then deletes all of the instance's pods;
its StatefulSet makes them anew and the gang scheduler places them together.

A rank that disappears (its node lost, its pod deleted) is replaced by the StatefulSet; the
ranks left behind lose their collective and their engines exit, which this rule then sees.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from pdd_operator.api import condition_reasons as reasons


class RankPod(Protocol):
    """What the rule reads of a pod (status.observe.PodSummary)."""

    @property
    def name(self) -> str: ...
    @property
    def uid(self) -> str: ...
    @property
    def role(self) -> str: ...
    @property
    def instance(self) -> str: ...  # the pdd.dev/instance label; "" for single-node roles
    @property
    def engine_restarts(self) -> int: ...
    @property
    def failed(self) -> bool: ...
    @property
    def terminating(self) -> bool: ...
    @property
    def revision(self) -> str: ...  # read by instance_rollout
    @property
    def ready(self) -> bool: ...


@dataclass(frozen=True)
class InstanceRestart:
    role: str
    instance: str
    cause: str  # the rank pod that broke it, for the event
    pods: tuple[tuple[str, str], ...]  # (name, uid) of every rank pod to delete
    event: str = reasons.INSTANCE_RESTARTED  # the event's reason


def instances_to_restart(pods: Iterable[RankPod]) -> list[InstanceRestart]:
    groups: dict[tuple[str, str], list[RankPod]] = {}
    for pod in pods:
        if pod.instance:
            groups.setdefault((pod.role, pod.instance), []).append(pod)
    restarts = []
    for (role, instance), ranks in sorted(groups.items()):
        broken = _broken_rank(ranks)
        if broken is not None:
            pods_of = tuple(sorted((p.name, p.uid) for p in ranks))
            restarts.append(InstanceRestart(role, instance, broken, pods_of))
    return restarts


def _broken_rank(ranks: Sequence[RankPod]) -> str | None:
    if any(p.terminating for p in ranks):
        return None  # a restart (or a rollout) is already under way
    for pod in sorted(ranks, key=lambda p: p.name):
        if pod.failed:
            return f"{pod.name} failed"
        if pod.engine_restarts:
            return f"the engine of {pod.name} restarted"
    return None
