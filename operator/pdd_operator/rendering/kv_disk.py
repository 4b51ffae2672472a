"""The prefill pods' disk tier of the KV cache (spec.kvCache.offload.disk): its volume, its
mount in the engine container, and the ephemeral storage an emptyDir of it requests (pure).
Rendered only where the engine's adapter renders the tier (planning.kv_offload), so the pod
and the engine's command line cannot disagree."""

from __future__ import annotations

from typing import Any

from pdd_operator.api.v1alpha1 import PDDeploymentSpec
from pdd_operator.engines.base import DISK_TIER_MOUNT, DiskTier, EngineAdapter
from pdd_operator.planning.kv_offload import raised_quantity, rendered_disk_tier

DISK_VOLUME = "kv-offload-disk"
EPHEMERAL = "ephemeral-storage"


def disk_tier(spec: PDDeploymentSpec, adapter: EngineAdapter, role: str) -> DiskTier | None:
    """The role's disk tier where its engine gets one, else None."""
    rendered = rendered_disk_tier(spec, adapter, role)
    return rendered.tier if rendered is not None and rendered.verdict.rendered else None


def disk_volumes(tier: DiskTier | None) -> list[dict[str, Any]]:
    """A generic ephemeral volume of the StorageClass (a claim per pod, made and deleted with
    it), else an emptyDir whose sizeLimit is the tier (the engine's cap keeps it under)."""
    if tier is None:
        return []
    size = raised_quantity(None, tier.pod_bytes)
    if tier.storage_class is None:
        return [{"name": DISK_VOLUME, "emptyDir": {"sizeLimit": size}}]
    claim = {
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": tier.storage_class,
        "resources": {"requests": {"storage": size}},
    }
    return [{"name": DISK_VOLUME, "ephemeral": {"volumeClaimTemplate": {"spec": claim}}}]


def disk_mounts(tier: DiskTier | None) -> list[dict[str, Any]]:
    return [] if tier is None else [{"name": DISK_VOLUME, "mountPath": DISK_TIER_MOUNT}]


def with_ephemeral_storage(resources: dict[str, Any], tier: DiskTier | None) -> dict[str, Any]:
    """An emptyDir tier lives on the node's ephemeral storage: the engine's request (and
    limit, where set) grows by it, so that the scheduler places the pod where it fits and the
    kubelet does not evict it for using what the tier was given."""
    if tier is None or tier.storage_class is not None:
        return resources
    requests, limits = resources["requests"], resources["limits"]
    # A limit without a request is the request too (Kubernetes' defaulting): raise from it.
    request = requests.get(EPHEMERAL, limits.get(EPHEMERAL))
    requests[EPHEMERAL] = raised_quantity(request, tier.pod_bytes)
    if EPHEMERAL in limits:
        limits[EPHEMERAL] = raised_quantity(limits[EPHEMERAL], tier.pod_bytes)
    return resources
