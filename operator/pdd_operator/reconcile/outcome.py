"""What a step of the pass tells the pass: what blocks the deployment (a condition reason
and the user's message), and whether time may cure it."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.kube.client import api_error_message, namespace_unavailable, transient
from pdd_operator.status.compute import APPLY_FAILED, APPLY_RETRYING

log = logging.getLogger(__name__)


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


def writes_failed(pdd: PDDeployment, what: str, err: Exception) -> Blocked:
    """A part's writes failed: surfaced as a condition and an event, not a trace. Raises
    NamespaceGoingAway where the namespace is being deleted (nothing to create, nobody to
    tell)."""
    if namespace_unavailable(err):
        raise NamespaceGoingAway from err
    blocked = write_failed(what, err)
    log.warning("%s/%s: %s", pdd.namespace, pdd.name, blocked.message)
    return blocked


class NamespaceGoingAway(Exception):
    """A child could not be created because its namespace is being deleted or is gone."""
