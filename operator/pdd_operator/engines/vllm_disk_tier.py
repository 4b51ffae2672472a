"""vLLM's disk tier of the KV cache on the prefill pods (spec.kvCache.offload.disk; pure).

vLLM 0.33.0's ``SimpleCPUOffloadConnector`` with ``kv_offload_backend: disk`` keeps offloaded
KV blocks in one file per GPU worker, ``<disk_path>.rank_<GPU index>``. The worker deletes any
old file, makes a new one of ``disk_capacity_bytes`` (per worker, not divided by the world
size) and deletes it on exit; the scheduler evicts its least recently used blocks inside it.
So its files cannot outgrow the volume (read in the 0.33.0 wheel:
distributed/kv_transfer/kv_connector/v1/simple_cpu_offload_connector.py,
v1/simple_kv_offload/worker.py and disk_backend.py). It is one more child of the
MultiConnector that carries the NIXL connector, as the CPU tier is, with ``kv_role`` kv_both
(it saves and loads the prefix cache, which must stay on: without it the connector turns itself
off).

Not rendered: the OffloadingConnector's file-system tier (TieringOffloadingSpec's ``fs``),
which bounds nothing, and LMCache, which the vLLM wheel does not require (so an image may
lack it).
"""

from __future__ import annotations

from typing import Any

from pdd_operator.engines.base import DISK_CAP_SHARE, DISK_TIER_MOUNT, DiskTier, TierVerdict
from pdd_operator.engines.version import Version

CONNECTOR = "SimpleCPUOffloadConnector"
# The release read with the disk backend; 0.11.0 has no such connector (its fixture's
# connectors). Not bisected: the releases between are taken to have none.
DISK_BACKEND_SINCE = Version(0, 33, 0)
# Each GPU worker's file is this path with `.rank_<GPU index>` appended.
DISK_FILE = f"{DISK_TIER_MOUNT}/kv"
NO_PREFIX_CACHING = "--no-enable-prefix-caching"


def verdict(tier: DiskTier, release: Version, engines_per_pod: int) -> TierVerdict:
    """Rendered for a release with the disk backend and one engine per pod."""
    if release < DISK_BACKEND_SINCE:
        return TierVerdict(
            False,
            f"vLLM {release} has no disk tier that bounds its files (the OffloadingConnector's "
            f"file-system tier does not; {DISK_BACKEND_SINCE}'s {CONNECTOR} does): the prefill "
            f"pods run without the disk tier; run vLLM {DISK_BACKEND_SINCE} or later",
        )
    if engines_per_pod > 1:
        # The files are named by GPU index only, and each engine may count its GPUs from 0.
        return TierVerdict(
            False,
            f"each prefill pod runs {engines_per_pod} data-parallel engines, and vLLM names "
            f"each worker's file by its GPU index alone ({DISK_FILE}.rank_<index>), which the "
            "operator has not shown to differ between engines: the prefill pods run without "
            "the disk tier; run one engine per pod (spec.prefill.parallelism.data equal to "
            "spec.prefill.nodesPerInstance)",
        )
    io = "O_DIRECT" if tier.page_aligned else "through the page cache"
    return TierVerdict(
        True,
        f"each prefill GPU worker keeps up to {worker_cap(tier)} bytes of KV blocks in one "
        f"file under {DISK_TIER_MOUNT}, written {io} ({CONNECTOR}, disk backend: "
        f"{DISK_CAP_SHARE:.0%} of the volume's share)",
    )


def worker_cap(tier: DiskTier) -> int:
    """Each GPU worker's file: its share of the pod's disk, less the room the caps leave. A
    latent (MLA) model's KV is the same on every rank, but each worker keeps its own file."""
    return int(tier.rank_bytes * DISK_CAP_SHARE)


def connector_child(tier: DiskTier) -> dict[str, Any]:
    """The MultiConnector child. O_DIRECT (vLLM's default) needs every block region to be whole
    4 KiB pages, which vLLM asserts at start; where the operator cannot tell, the page cache."""
    return {
        "kv_connector": CONNECTOR,
        "kv_role": "kv_both",  # a cache for both saving and loading, whatever the pod's role
        "kv_connector_extra_config": {
            "kv_offload_backend": "disk",
            "disk_path": DISK_FILE,
            "disk_capacity_bytes": worker_cap(tier),
            "use_page_cache": not tier.page_aligned,
        },
    }
