"""The sidecar token Secret of a pass: created on the deployment's first pass here, and
again whenever a pod reports it cannot mount it; never read (the operator may create
Secrets but not read them)."""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import dataclass, field, replace

from pdd_operator.api import names
from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.kube.client import namespace_unavailable
from pdd_operator.reconcile.memory import DeploymentRecord
from pdd_operator.reconcile.outcome import Blocked, NamespaceGoingAway, write_failed
from pdd_operator.reconcile.ports import Ports, key_of
from pdd_operator.rendering.children import owner_reference
from pdd_operator.rendering.sidecar import render_token_secret, sidecar_enabled
from pdd_operator.status import ownership
from pdd_operator.status.token import (
    TOKEN_RECREATED,
    MountFailure,
    token_conflict_message,
    token_create_failed,
    token_recreated_message,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TokenCheck:
    """What the operator knows of a deployment's sidecar token Secret, which it may create
    but never read: that it exists and is this PDDeployment's (uid), or why not (`found`, a
    Blocked), and which FailedMount report of it the operator answered last (`answered`)."""

    uid: str = ""
    missing: bool = False
    found: Blocked = field(default_factory=Blocked)
    answered: str = ""

    @property
    def ours(self) -> bool:
        """Whether engines may mount it: there (or not needed) and not someone else's."""
        return not self.missing and self.found.reason != ownership.TOKEN_REASON

    @property
    def conflicting(self) -> bool:
        """Someone else's Secret holds the name: looked at again after a while."""
        return self.found.reason == ownership.TOKEN_REASON


async def check_token(
    ports: Ports,
    pdd: PDDeployment,
    record: DeploymentRecord,
    had_children: bool,
    may_create: bool = True,
) -> TokenCheck:
    """Whether the sidecar token Secret is there and this PDDeployment's. The operator
    creates it on the deployment's first pass here, and again whenever a pod reports it
    cannot mount it (its kubelet's FailedMount Event, informers/mount_events.py).

    An existing Secret (the create answers 409) is this deployment's when the deployment
    had children at the start of the pass (`had_children`) and its status does not report
    the name taken: a first pass applies the children its pods run against before it
    creates the Secret (reconciler.py), so an operator killed between the two leaves its
    successor children beside the Secret. Without children, someone else made it, and may
    know its token."""
    if not sidecar_enabled(pdd.spec):
        return TokenCheck()
    name = names.token_secret_name(pdd.name, pdd.uid)
    last = record.token
    first_look = last is None or last.uid != pdd.uid
    if first_look and had_children and not _conflict_reported(pdd):
        # Made after the children its pods run against, by this process or its
        # predecessor: no request, and a pod's report says if it has gone since.
        last = record.token = TokenCheck(pdd.uid)
    reports = ports.view.mount_failures(pdd.namespace, name)
    newest = reports[0].seen if reports else ""
    if last is not None and last.uid == pdd.uid and last.ours and last.answered == newest:
        return last
    if not may_create:
        return TokenCheck(pdd.uid, missing=True)  # created on a later pass
    try:
        created = await _created_token(ports, pdd)
    except Exception as err:
        if namespace_unavailable(err):
            raise NamespaceGoingAway from err
        found = write_failed(token_create_failed(name, reports), err)
        return TokenCheck(pdd.uid, missing=True, found=found)  # tried again next pass
    if created and reports:
        _say_token_recreated(ports, pdd, name, reports[0])
    check = TokenCheck(pdd.uid, answered=newest)
    if not created and not _existing_token_is_ours(last, pdd, had_children):
        found = Blocked(ownership.TOKEN_REASON, token_conflict_message(name))
        if not (last is not None and last.uid == pdd.uid and last.conflicting):
            # Told once; each later pass finds the same Secret, and the status still says so.
            log.warning("%s/%s: %s", pdd.namespace, pdd.name, found.message)
        check = replace(check, found=found)
    record.token = check
    return check


def _existing_token_is_ours(last: TokenCheck | None, pdd: PDDeployment, had_children: bool) -> bool:
    """Whether a token Secret whose create answered "exists" is this deployment's. First seen
    by this process: when the deployment had children and its status does not report the
    name taken (made after them, by this operator or its predecessor). Seen before: ours
    while it was, someone else's until it is gone."""
    if last is None or last.uid != pdd.uid:
        return had_children and not _conflict_reported(pdd)
    if last.conflicting:
        return False
    return last.ours or had_children


def _conflict_reported(pdd: PDDeployment) -> bool:
    """Whether the deployment's status says a predecessor found the name taken: that stands
    until the create succeeds (the Secret someone else made is gone)."""
    return any(c.reason == ownership.TOKEN_REASON for c in pdd.status.conditions)


def _say_token_recreated(ports: Ports, pdd: PDDeployment, name: str, report: MountFailure) -> None:
    message = token_recreated_message(name, report)
    log.info("%s/%s: %s", pdd.namespace, pdd.name, message)
    body = ports.view.pdd_body(key_of(pdd))
    if body is not None:
        ports.emit_event(body, "Warning", TOKEN_RECREATED, message)


async def _created_token(ports: Ports, pdd: PDDeployment) -> bool:
    """Create the sidecar token Secret with a new random token: False when one of its
    name exists (the API server's 409; nothing of it is read)."""
    secret = render_token_secret(pdd, secrets.token_urlsafe(32))
    secret["metadata"]["ownerReferences"] = [owner_reference(pdd)]
    created = await asyncio.to_thread(ports.kube.create_if_absent, secret)
    if created:
        ports.count_write("create", "Secret")
    return created
