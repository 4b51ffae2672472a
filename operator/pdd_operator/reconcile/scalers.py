"""The scale targets of a pass: one per autoscaled role, created when missing, deleted when
the role is no longer autoscaled, and told in their status what the role runs. A target's
spec is never written after its creation: it is the HPA's."""

from __future__ import annotations

import asyncio
import logging

from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.kube.resources import ROLE_SCALER
from pdd_operator.planning.autoscaling import ScalingPlan, scale_target_roles
from pdd_operator.reconcile.outcome import Blocked, writes_failed
from pdd_operator.reconcile.ports import Ports, key_of
from pdd_operator.reconcile.workloads import role_workloads
from pdd_operator.rendering.scalers import render_scaler, scaler_status
from pdd_operator.status import ownership
from pdd_operator.status.observe import counted_from_pods

log = logging.getLogger(__name__)


async def sync_scalers(ports: Ports, pdd: PDDeployment, scaling: ScalingPlan) -> Blocked:
    """Create the scale target of each autoscaled role that has none, delete those of
    roles no longer autoscaled, and write what each role runs into its target's status
    (only where it changed)."""
    key = key_of(pdd)
    existing = ports.view.scalers(key)
    wanted = scale_target_roles(pdd.spec)
    children = counted_from_pods(ports.view.children(key).values(), ports.view.pods(key))
    ready = {role: state.ready for role, state in role_workloads(pdd, children).items()}
    try:
        for role in wanted:
            if role not in existing:
                if blocked := await _create_scaler(ports, pdd, role):
                    return blocked
                continue
            status = scaler_status(pdd, role, scaling, ready)
            if dict(existing[role].status) != status:
                name = existing[role].name
                await asyncio.to_thread(ports.kube.patch_scaler_status, pdd.namespace, name, status)
                ports.count_write("status", ROLE_SCALER.kind)
        for role, scaler in existing.items():
            if role not in wanted:
                await asyncio.to_thread(
                    ports.kube.delete, ROLE_SCALER, pdd.namespace, scaler.name, scaler.uid
                )
                ports.count_write("delete", ROLE_SCALER.kind)
    except Exception as err:
        return writes_failed(pdd, "could not write the scale targets", err)
    return Blocked()


async def _create_scaler(ports: Ports, pdd: PDDeployment, role: str) -> Blocked | None:
    """Create the role's scale target; when its name is taken, say by whom unless it is
    this deployment's own (created by an earlier pass, not indexed yet)."""
    scaler = render_scaler(pdd, role)
    created = await asyncio.to_thread(ports.kube.create_if_absent, scaler)
    ports.count_write("create", ROLE_SCALER.kind)
    if created:
        return None
    name = scaler["metadata"]["name"]
    owners = await asyncio.to_thread(ports.kube.owner_references, ROLE_SCALER, pdd.namespace, name)
    conflict = ownership.name_conflict(ROLE_SCALER.kind, name, owners or [], pdd.uid)
    if owners is None or conflict is None:
        return None
    message = ownership.scaler_conflict_message(conflict, role)
    log.warning("%s/%s: %s", pdd.namespace, pdd.name, message)
    return Blocked(ownership.REASON, message)
