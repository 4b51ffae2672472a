"""Whether the gang scheduler that spec.scheduling.gang names is there (pure).

An instance over several nodes without its gang scheduler would start half-placed: its
ranks bound one by one wherever room is, the engine waiting at the rendezvous for ranks that
never come while they hold GPUs. So while the scheduler's API is not served, the instances
are not created and the condition GangScheduling=False says what to enable or choose.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdd_operator.api import condition_reasons as reasons
from pdd_operator.api import names
from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.engines.base import role_spec

REASON_READY = reasons.GANG_SCHEDULER_AVAILABLE
REASON_MISSING = reasons.GANG_SCHEDULER_UNAVAILABLE

# The API each gang scheduler serves: (group/version, plural), or (group, "") for any version.
GANG_APIS: dict[str, tuple[str, str]] = {
    "native": ("scheduling.k8s.io/v1alpha1", "workloads"),
    "volcano": ("scheduling.volcano.sh/v1beta1", "podgroups"),
    "kueue": ("kueue.x-k8s.io", ""),
}
FIX = {
    "native": "Kubernetes' gang scheduling needs v1.35+ with the feature gates GenericWorkload "
    "and GangScheduling on (kube-apiserver, kube-scheduler) and "
    "--runtime-config=scheduling.k8s.io/v1alpha1=true on the kube-apiserver",
    "volcano": "install Volcano (its PodGroup API scheduling.volcano.sh/v1beta1)",
    "kueue": "install Kueue (v0.17+) with its pod integration",
}


@dataclass(frozen=True)
class GangReadiness:
    ready: bool
    reason: str
    message: str


def gang_api(pdd: PDDeployment) -> tuple[str, str] | None:
    """The API to look for, or None when no instance of the deployment is a gang."""
    gang = pdd.spec.scheduling.gang
    if gang == "none" or not multinode_roles(pdd):
        return None
    return GANG_APIS[gang]


def multinode_roles(pdd: PDDeployment) -> tuple[str, ...]:
    return tuple(
        role
        for role in names.ROLES
        if role_spec(pdd.spec, role).nodesPerInstance > 1 and role_spec(pdd.spec, role).replicas
    )


def gang_readiness(pdd: PDDeployment, served: bool) -> GangReadiness:
    gang = pdd.spec.scheduling.gang
    roles = " and ".join(f"spec.{r}" for r in multinode_roles(pdd))
    if served:
        return GangReadiness(True, REASON_READY, f"{gang} gang scheduling of {roles} instances")
    api, _ = GANG_APIS[gang]
    return GangReadiness(
        False,
        REASON_MISSING,
        f"spec.scheduling.gang is {gang} but the cluster does not serve {api}: the instances "
        f"of {roles} (nodesPerInstance > 1) are not created, so none starts half-placed. "
        f"Fix: {FIX[gang]}; or set spec.scheduling.gang to a gang scheduler the cluster has "
        "(native, kueue, volcano), or to none to start instances without a gang",
    )
