"""Each role's workload state, read from the children's summaries: what the scale targets'
status and the deployment's status report."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from pdd_operator.api import names
from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.engines.base import role_spec
from pdd_operator.status.compute import WorkloadState, instances_state, slices_state
from pdd_operator.status.observe import ChildKey, ChildSummary


def slice_of(pdd: PDDeployment, child_name: str) -> int:
    """The slice a child belongs to by its name (names.slice_name); 0: the home slice."""
    for role in (*names.ROLES, "router"):
        prefix = names.role_name(pdd.name, role) + "-s"
        if child_name.startswith(prefix) and child_name[len(prefix) :].isdigit():
            return int(child_name[len(prefix) :])
    return 0


def role_workloads(
    pdd: PDDeployment,
    children: Iterable[ChildSummary],
    hashes: Mapping[ChildKey, str] | None = None,
) -> dict[str, WorkloadState]:
    """Each role's workload state: its StatefulSet (or router Deployment); summed over the
    slices where it has one per slice, counted in instances where instances span nodes.
    With the render's `hashes`, a workload not yet at its render counts as unsettled."""
    seen: dict[str, list[tuple[int, WorkloadState]]] = {}
    for summary in children:
        if summary.workload is None or not summary.role:
            continue
        state = summary.workload
        if hashes is not None:
            state = _as_seen(state, summary.applied_hash, hashes.get(summary.key))
        seen.setdefault(summary.role, []).append((slice_of(pdd, summary.key[2]), state))
    workloads = {}
    for role, found in seen.items():
        states = [state for _, state in sorted(found, key=lambda pair: pair[0])]
        if len(states) == 1:
            workloads[role] = states[0]
        elif role in names.ROLES and role_spec(pdd.spec, role).nodesPerInstance > 1:
            workloads[role] = instances_state(states)
        else:
            workloads[role] = slices_state(states)
    return workloads


def _as_seen(workload: WorkloadState, seen_hash: str, wanted_hash: str | None) -> WorkloadState:
    """A workload whose watch copy predates what this pass applied counts as not yet observed
    by its controller: its old copy may be fully ready, and the PDDeployment must not say
    Ready for a generation whose rollout has not started."""
    if wanted_hash is None or seen_hash == wanted_hash:
        return workload
    return replace(workload, generation=workload.observed_generation + 1)
