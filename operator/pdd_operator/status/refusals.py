"""Why a workload's pods are not even created (pure): the controller's own words.

A pod refused at admission (a ResourceQuota, Pod Security admission, a webhook) never exists,
so nothing about it reaches the pod index: the StatefulSet only stays short of pods
(`status.replicas` < `spec.replicas`) and its controller records each refusal as a
`FailedCreate` Event on it (checked on kube-apiserver v1.35: a StatefulSet has no condition
for it; a ReplicaSet's ReplicaFailure condition has no StatefulSet counterpart). The operator
watches StatefulSets' Events (informers/creation_events.py) and keeps the newest creation Event
of each; a workload that is short of pods is refused when that one is a FailedCreate.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pdd_operator.api import condition_reasons as reasons

REASON = reasons.PODS_REFUSED
FAILED_CREATE = "FailedCreate"
SUCCESSFUL_CREATE = "SuccessfulCreate"
# The StatefulSet controller's message: "create Pod x-0 in StatefulSet x failed error: <why>".
_CONTROLLER_PREFIX = "failed error: "


@dataclass(frozen=True)
class Refusal:
    """Pods of one workload that the API server refuses to create, and why."""

    role: str
    workload: str
    message: str  # the API server's answer (quota, Pod Security, webhook)

    def describe(self) -> str:
        return f"pods of {self.workload} cannot be created: {self.message}"


def creation_refusal(events: Iterable[Mapping[str, Any]]) -> str:
    """The answer of the workload's newest pod creation when it was refused, else "": a
    refusal followed by a successful create (the quota was raised) is over."""
    return refusal_message(newest_creation(events))


def newest_creation(events: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The newest of the controller's FailedCreate and SuccessfulCreate Events."""
    newest: Mapping[str, Any] | None = None
    for event in events:
        if event.get("reason") not in (FAILED_CREATE, SUCCESSFUL_CREATE):
            continue
        if newest is None or event_time(event) >= event_time(newest):
            newest = event
    return newest


def refusal_message(newest: Mapping[str, Any] | None) -> str:
    """Why the newest creation was refused, "" when it was not (or there is none)."""
    if newest is None or newest.get("reason") != FAILED_CREATE:
        return ""
    message = str(newest.get("message") or "pod creation failed").strip()
    _, found, why = message.partition(_CONTROLLER_PREFIX)
    return why.strip() if found else message


def event_time(event: Mapping[str, Any]) -> str:
    """RFC 3339 times compare as strings; events.k8s.io writers set eventTime, core ones
    lastTimestamp (series: the latest occurrence)."""
    series = event.get("series") or {}
    return str(
        series.get("lastObservedTime")
        or event.get("lastTimestamp")
        or event.get("eventTime")
        or event.get("firstTimestamp")
        or ""
    )
