"""The KV-transfer environment of a prefill/decode pod: UCX, GPUDirect, RDMA devices.

Only what is known when rendering goes here; what depends on the GPUs a pod actually gets
(UCX_NET_DEVICES in `auto` NIC mode) is computed by the preflight init container on the node.
"""

from __future__ import annotations

from typing import Any

from pdd_contract.env import (
    NIXL_UCX_SGL_ENABLE,
    PDD_GPUDIRECT,
    PDD_KV_DESCRIPTOR_BYTES,
    PDD_KV_NIXL_SPLIT_BATCH,
    PDD_KV_NIXL_THREADS,
    PDD_KV_OPERATION,
    PDD_KV_PEER_BOUNDARY,
    PDD_NIC_MAP,
    PDD_NIC_SELECTION,
    PDD_REQUIRE_RDMA,
    PDD_VERIFY_TRANSFER,
    UCX_CUDA_IPC_ENABLE_GET_ZCOPY,
    UCX_IB_GPU_DIRECT_RDMA,
    UCX_TLS,
)
from pdd_operator.api.pod_namespaces import peer_boundary
from pdd_operator.api.v1alpha1 import KVTransferSpec, PDDeploymentSpec
from pdd_operator.engines.base import EngineAdapter
from pdd_operator.planning.kv_layout import engine_descriptor_bytes

# RC for the bulk data, UD for RC's connection wire-up, shared memory and self for the local
# lanes, and the CUDA transports so GPU memory is a valid source and target.
AUTO_TLS_RDMA = "rc_x,ud_x,sm,self,cuda_copy,cuda_ipc"
AUTO_TLS_NO_RDMA = "tcp,sm,self,cuda_copy,cuda_ipc"
MULTUS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"


def uses_rdma(spec: PDDeploymentSpec) -> bool:
    return bool(spec.kvTransfer.rdma.resourceName) or spec.topology.dra.enabled


def ucx_tls(spec: PDDeploymentSpec) -> str:
    transports = spec.kvTransfer.ucx.transports
    if transports == ["auto"]:
        return AUTO_TLS_RDMA if uses_rdma(spec) else AUTO_TLS_NO_RDMA
    return ",".join(transports)


def nic_map_value(kv: KVTransferSpec) -> str:
    """`0=mlx5_0:1;1=mlx5_1:1`: the explicit GPU->NIC map for the preflight container."""
    if kv.nicSelection.mode != "explicit":
        return ""
    entries = sorted(kv.nicSelection.map, key=lambda m: m.gpu)
    return ";".join(f"{m.gpu}={m.devices}" for m in entries)


def transfer_env(spec: PDDeploymentSpec) -> list[dict[str, Any]]:
    kv = spec.kvTransfer
    env: list[dict[str, Any]] = [
        {"name": UCX_TLS, "value": ucx_tls(spec)},
        {"name": PDD_GPUDIRECT, "value": kv.gpuDirect},
        {"name": PDD_REQUIRE_RDMA, "value": "true" if kv.rdma.required else "false"},
        {"name": PDD_NIC_SELECTION, "value": kv.nicSelection.mode},
    ]
    if kv.nicSelection.mode == "explicit":
        env.append({"name": PDD_NIC_MAP, "value": nic_map_value(kv)})
    if kv.gpuDirect == "off":
        env.append({"name": UCX_IB_GPU_DIRECT_RDMA, "value": "no"})
    env.append({"name": NIXL_UCX_SGL_ENABLE, "value": "y" if scatter_gather(spec) else "n"})
    if cuda_ipc_get_forced(spec):
        env.append({"name": UCX_CUDA_IPC_ENABLE_GET_ZCOPY, "value": "y"})
    env += [{"name": var.name, "value": var.value} for var in kv.ucx.extraEnv]
    return env


def cuda_ipc_get_forced(spec: PDDeploymentSpec) -> bool:
    """UCX's zero-copy get over cuda_ipc, forced on where the two roles share a PID
    namespace (the only place cuda_ipc reaches between pods). UCX's default ("auto") turns it
    off on a GPU without active NVLinks (uct/cuda/cuda_ipc/cuda_ipc_iface.c), so a pulling
    connector (vLLM's NixlConnector READs) falls back to software emulation over TCP even
    where cuda_ipc is reachable: measured on one H200 between hostPID pods, READ at 0.58 GB/s
    by default and 149 GB/s forced on, 512 KiB descriptors (docs/benchmarks.md). A value the
    user sets in kvTransfer.ucx.extraEnv wins."""
    own = {var.name for var in spec.kvTransfer.ucx.extraEnv}
    return peer_boundary(spec) != "pod" and UCX_CUDA_IPC_ENABLE_GET_ZCOPY not in own


def scatter_gather(spec: PDDeploymentSpec) -> bool:
    """NIXL's scatter-gather offload, where a lane can carry it. Between two pods on one node
    without RDMA the KV can only go by UCX's software emulation over TCP, and UCX has no
    protocol for an offloaded WRITE there: every transfer fails (measured on one H200,
    docs/benchmarks.md, "Between pods on one node"). Without it the same WRITE is slow but
    arrives."""
    lane = uses_rdma(spec) or peer_boundary(spec) != "pod"
    return spec.kvTransfer.ucx.scatterGather and lane


def kv_path_check_env(spec: PDDeploymentSpec, adapter: EngineAdapter) -> list[dict[str, Any]]:
    """Whether the preflight measures the KV path with the pod's devices, at which engine
    descriptor size besides the link's (pdd_node.kv_path), in the engine's own pattern
    (direction and NIXL threads) and across the boundary between the prefill and decode pods."""
    if not spec.kvTransfer.verification.enabled:
        return [{"name": PDD_VERIFY_TRANSFER, "value": "false"}]
    pattern = adapter.kv_pattern(spec)
    env = [
        {"name": PDD_VERIFY_TRANSFER, "value": "true"},
        {"name": PDD_KV_OPERATION, "value": pattern.operation},
        {"name": PDD_KV_NIXL_THREADS, "value": str(pattern.nixl_threads)},
        {"name": PDD_KV_NIXL_SPLIT_BATCH, "value": str(pattern.split_batch)},
        {"name": PDD_KV_PEER_BOUNDARY, "value": peer_boundary(spec)},
    ]
    descriptor = engine_descriptor_bytes(spec, adapter)
    if descriptor:
        env.append({"name": PDD_KV_DESCRIPTOR_BYTES, "value": str(descriptor)})
    return env


def rdma_resources(spec: PDDeploymentSpec) -> dict[str, str]:
    name = spec.kvTransfer.rdma.resourceName
    if not name or spec.topology.dra.enabled:
        return {}
    return {name: str(spec.kvTransfer.rdma.count)}


def network_annotations(spec: PDDeploymentSpec) -> dict[str, str]:
    networks = spec.kvTransfer.rdma.networks
    return {MULTUS_ANNOTATION: ",".join(networks)} if networks else {}


def engine_capabilities(spec: PDDeploymentSpec) -> list[str]:
    """RDMA registers (pins) memory: the engine needs IPC_LOCK and nothing more."""
    return ["IPC_LOCK"] if uses_rdma(spec) else []
