"""The condition types a PDDeployment's status carries: one spelling each, for the status
code, its events, the printer columns and the docs (docs/api.md lists what each means)."""

from __future__ import annotations

READY = "Ready"
PROGRESSING = "Progressing"
RECONCILING = "Reconciling"
DEGRADED = "Degraded"
STALLED = "Stalled"
PLACED = "Placed"
KV_TRANSFER_VERIFIED = "KVTransferVerified"
MODEL_READY = "ModelReady"
PARALLELISM_SUPPORTED = "ParallelismSupported"
ENGINE_VERSION_SUPPORTED = "EngineVersionSupported"
KV_CACHE_OFFLOADED = "KVCacheOffloaded"
KV_AWARE_ROUTING = "KVAwareRouting"
SCALED_TO_ZERO = "ScaledToZero"
SCALING_HELD = "ScalingHeld"

TYPES = (
    READY,
    PROGRESSING,
    RECONCILING,
    DEGRADED,
    STALLED,
    PLACED,
    KV_TRANSFER_VERIFIED,
    MODEL_READY,
    PARALLELISM_SUPPORTED,
    ENGINE_VERSION_SUPPORTED,
    KV_CACHE_OFFLOADED,
    KV_AWARE_ROUTING,
    SCALED_TO_ZERO,
    SCALING_HELD,
)

# Conditions that judge a setting the pods run without (spec-derived: status/spec_conditions,
# and the parallelism check): a Warning event once one turns False; True, or Unknown (not
# judged), says nothing new.
WARN_WHEN_FALSE = (
    ENGINE_VERSION_SUPPORTED,
    KV_CACHE_OFFLOADED,
    KV_AWARE_ROUTING,
    PARALLELISM_SUPPORTED,
)
