"""What a step of the pass tells the pass: what blocks the deployment (a condition reason
and the user's message), and whether time may cure it."""

from __future__ import annotations

from dataclasses import dataclass

from pdd_operator.kube.client import api_error_message, transient
from pdd_operator.status.compute import APPLY_FAILED, APPLY_RETRYING


@dataclass(frozen=True)
class Blocked:
    """Why a pass could not write its children: a condition reason and the user's message;
    `transient` where time may cure it (the pass is retried with backoff)."""

    reason: str = ""
    message: str = ""
    transient: bool = False


def write_failed(what: str, err: Exception) -> Blocked:
    """A write the API server refused or could not answer. A refusal stays until someone
    acts (ApplyFailed: Stalled); a failure time may cure (a 429, a 5xx, a webhook that timed
    out or could not be reached, no answer at all) is retried (ApplyRetrying: Reconciling)."""
    message = f"{what}: {api_error_message(err)}"
    if transient(err):
        return Blocked(APPLY_RETRYING, f"{message} (retrying)", transient=True)
    return Blocked(APPLY_FAILED, message)


class NamespaceGoingAway(Exception):
    """A child could not be created because its namespace is being deleted or is gone."""
