"""Instances over several nodes start again whole: every rank pod of one whose rank failed
or restarted is deleted (planning.instance_restart); with none broken, the next instance
of an older revision is replaced whole, one at a time (planning.instance_rollout)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.engines.base import role_spec
from pdd_operator.kube.resources import POD
from pdd_operator.planning.instance_restart import instances_to_restart
from pdd_operator.planning.instance_rollout import RoleShape, next_instance_to_replace
from pdd_operator.reconcile.ports import Ports, key_of
from pdd_operator.rendering.roles import engine_revision
from pdd_operator.status.gang import multinode_roles

log = logging.getLogger(__name__)


async def restart_broken_instances(
    ports: Ports, pdd: PDDeployment, body: Mapping[str, Any]
) -> None:
    pods = ports.view.pods(key_of(pdd))
    restarts = instances_to_restart(pods)
    if not restarts:
        shapes = {
            role: RoleShape(
                role_spec(pdd.spec, role).replicas, role_spec(pdd.spec, role).nodesPerInstance
            )
            for role in multinode_roles(pdd)
        }
        stale = next_instance_to_replace(engine_revision(pdd.spec), pods, shapes)
        restarts = [stale] if stale is not None else []
    for restart in restarts:
        try:
            await asyncio.gather(
                *(
                    asyncio.to_thread(ports.kube.delete, POD, pdd.namespace, name, uid)
                    for name, uid in restart.pods
                )
            )
        except Exception as err:  # the next pass sees the same rank and tries again
            log.warning("restarting instance %s failed: %s", restart.instance, err)
            continue
        for _ in restart.pods:
            ports.count_write("delete", "Pod")
        message = (
            f"{restart.cause}: {restart.role} instance {restart.instance} starts again "
            f"whole ({len(restart.pods)} rank pods deleted; its ranks start together)"
        )
        ports.emit_event(body, "Normal", restart.event, message)
