"""Settings the user chose that make the KV transfer cost more than twice what the
operator's default would (pure): one plain-words hint each, for KVTransferVerified.

Each factor is the measured one (one H200, each engine's own NIXL pattern, docs/benchmarks.md
"Each engine's own pattern"): below a few MiB an engine's transfer is bound by a fixed cost
per descriptor, so its rate grows about in step with the descriptor size; vLLM's pulling
connector moved 0.4x the bytes of its pushing one where both are cuda_ipc; NIXL's
scatter-gather offload doubled a WRITE at 512 KiB descriptors.
"""

from __future__ import annotations

from pdd_operator.api.pod_namespaces import shares_pid_namespace
from pdd_operator.api.v1alpha1 import PDDeploymentSpec
from pdd_operator.engines.base import EngineAdapter
from pdd_operator.planning.kv_layout import chosen_block_tokens, engine_descriptor_bytes

COST_FACTOR = 2.0
PULL_TO_PUSH = 2.5  # 87-135 GB/s pushing vs 26-54 pulling at 512 KiB; 195-271 vs 94-110 at 1 MiB
SCATTER_GATHER = 2.0  # 85-125 GB/s with the offload vs 45-55 without, WRITE at 512 KiB


def costly_settings(spec: PDDeploymentSpec, adapter: EngineAdapter) -> list[str]:
    """What to change, where a setting costs the transfer more than ``COST_FACTOR``."""
    return [hint for hint in (_block_size(spec, adapter), _connector(spec, adapter),
                              _scatter_gather(spec, adapter)) if hint]  # fmt: skip


def _block_size(spec: PDDeploymentSpec, adapter: EngineAdapter) -> str:
    if not spec.engine.kvBlockSize:
        return ""
    default = spec.model_copy(
        update={"engine": spec.engine.model_copy(update={"kvBlockSize": None})}
    )
    tokens = chosen_block_tokens(default, adapter)
    ours, theirs = engine_descriptor_bytes(default, adapter), engine_descriptor_bytes(spec, adapter)
    if not tokens or not ours or not theirs or ours <= COST_FACTOR * theirs:
        return ""
    return (
        f"spec.engine.kvBlockSize {spec.engine.kvBlockSize} makes {_size(theirs)} KV "
        f"descriptors; the operator's default ({tokens} tokens, {_size(ours)}) moves each "
        f"prompt's KV about {ours / theirs:.0f}x faster: remove it unless the block size is "
        "needed for another reason"
    )


def _connector(spec: PDDeploymentSpec, adapter: EngineAdapter) -> str:
    chosen = spec.kvTransfer.connector
    if spec.engine.type != "vllm" or chosen != "NixlConnector" or not shares_pid_namespace(spec):
        return ""
    auto = spec.model_copy(
        update={"kvTransfer": spec.kvTransfer.model_copy(update={"connector": "auto"})}
    )
    if adapter.kv_pattern(auto).operation != "WRITE" or PULL_TO_PUSH < COST_FACTOR:
        return ""
    return (
        "spec.kvTransfer.connector NixlConnector pulls the KV; between pods that share a PID "
        f"namespace the push connector (`auto`) moved about {PULL_TO_PUSH:g}x the bytes: set "
        "it to auto"
    )


def _scatter_gather(spec: PDDeploymentSpec, adapter: EngineAdapter) -> str:
    if spec.kvTransfer.ucx.scatterGather or adapter.kv_pattern(spec).operation != "WRITE":
        return ""
    if not shares_pid_namespace(spec) and not spec.kvTransfer.rdma.resourceName:
        return ""  # over TCP emulation the offload is off anyway (it would fail there)
    return (
        "spec.kvTransfer.ucx.scatterGather false: NIXL's offload doubled a WRITE at 512 KiB "
        f"descriptors (about {SCATTER_GATHER:g}x): remove it"
    )


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"
