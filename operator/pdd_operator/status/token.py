"""What status and Events say of the sidecar token Secret (pure).

The operator creates that Secret and never reads it (docs/security.md): it learns that the
Secret is gone from the pods that cannot mount it (informers/mount_events.py), and that a
Secret of its name exists only from a create that answers 409.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pdd_operator.api import condition_reasons as reasons
from pdd_operator.status.compute import PodProblem
from pdd_operator.status.observe import PodSummary
from pdd_operator.status.refusals import event_time

TOKEN_RECREATED = reasons.TOKEN_SECRET_RECREATED
TOKEN_MISSING = reasons.TOKEN_SECRET_MISSING
# A kubelet reports a mount that still fails again within about two minutes (its retry
# backoff's ceiling): an older report is of a mount that has worked since, or of a pod gone.
MOUNT_REPORT_FRESH_S = 150.0
_SECRET_NOT_FOUND = re.compile(r'secret "([^"]+)" not found')


@dataclass(frozen=True)
class MountFailure:
    """A pod's newest report that a Secret it mounts does not exist."""

    pod: str
    when: str  # RFC 3339, as the Event says
    message: str
    # Changes with every new report (the event's uid, count and time): what a pass answered.
    seen: str


def missing_secret(body: Mapping[str, Any]) -> tuple[tuple[str, str], MountFailure] | None:
    """((namespace, Secret), the report) for a FailedMount Event about a missing Secret."""
    match = _SECRET_NOT_FOUND.search(str(body.get("message") or ""))
    involved = body.get("involvedObject") or {}
    if body.get("reason") != "FailedMount" or match is None or involved.get("kind") != "Pod":
        return None
    namespace = str(involved.get("namespace") or (body.get("metadata") or {}).get("namespace"))
    uid = str((body.get("metadata") or {}).get("uid") or "")
    when = event_time(body)
    seen = f"{uid}/{body.get('count') or 1}/{when}"
    failure = MountFailure(str(involved.get("name") or ""), when, str(body["message"]), seen)
    return (namespace, match.group(1)), failure


def token_conflict_message(secret: str) -> str:
    """The condition's message for a sidecar token Secret that existed before the operator
    created one: its value may be known to whoever made it, so no engine pod mounts it."""
    return (
        f"the sidecar token Secret {secret} existed before this PDDeployment's first engine "
        "pod, and the operator did not create it: its token may be known to whoever did, so "
        "the operator does not use it, change it or delete it and starts no engine pods "
        "against it: delete that Secret and the operator creates its own"
    )


def token_create_failed(secret: str, reports: Sequence[MountFailure]) -> str:
    """What a failed create of the token Secret is about: a new deployment's, or one deleted
    that a pod cannot mount."""
    if not reports:
        return "could not create the sidecar token Secret"
    return (
        f"could not create the sidecar token Secret {secret} again (deleted: pod "
        f"{reports[0].pod} cannot mount it)"
    )


def token_recreated_message(secret: str, report: MountFailure) -> str:
    """The Event's message when a deleted token Secret was created again."""
    return (
        f"the sidecar token Secret {secret} was deleted: pod {report.pod} could not mount it "
        f"(FailedMount at {report.when}). Created it again with a new token; running pods "
        "take it when their kubelet next refreshes the volume, new pods when they mount it"
    )


def token_mount_problems(
    pods: Sequence[PodSummary], reports: Sequence[MountFailure], secret: str, now: str
) -> list[PodProblem]:
    """The deployment's pods that reported the token Secret missing lately (a kubelet says
    so again while it lasts) and have not started since: what Degraded says while the
    kubelet has yet to mount the Secret created again. `now`: RFC 3339, as `when`."""
    waiting = {pod.name: pod for pod in pods if not pod.ready and not pod.terminating}
    return [
        PodProblem(
            report.pod,
            waiting[report.pod].role,
            TOKEN_MISSING,
            f"cannot mount the sidecar token Secret {secret} (FailedMount at {report.when}): "
            "it was deleted; the operator creates it again with a new token, and the kubelet "
            "mounts it at its next try",
        )
        for report in reports
        if report.pod in waiting
        and waiting[report.pod].problem is None
        and _seconds_between(report.when, now) <= MOUNT_REPORT_FRESH_S
    ]


def _seconds_between(earlier: str, later: str) -> float:
    try:
        start, end = datetime.fromisoformat(earlier), datetime.fromisoformat(later)
    except ValueError:
        return float("inf")
    return (end - start).total_seconds()
