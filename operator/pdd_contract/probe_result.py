"""The transfer probe's result and the verdict the operator derives from it.

The sidecar measures and writes a ``ProbeResult`` (as JSON in the prober pod's
``labels.ANNOTATION_PROBE_RESULT``); the operator's status layer turns it into the
``KVTransferVerified`` condition with ``classify_probe``.

Bandwidth is in GB/s (10^9 bytes per second) everywhere, the unit of the link budgets in
DESIGN.md ("400 GB/s NVLink", "50 GB/s per 400 Gb/s NIC").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

# Condition reasons (CamelCase, Kubernetes API conventions).
REASON_VERIFIED = "TransferVerified"
REASON_FAILED = "ProbeFailed"
REASON_CORRUPT = "DataMismatch"
REASON_TCP = "TCPFallback"
REASON_SLOW = "BelowExpectedBandwidth"

_TCP_HINT = "check the RDMA resource, memlock, UCX_NET_DEVICES"
# Links the check measures without a NIC: the peer pod is on the same node.
_SAME_NODE_LINKS = frozenset({"nvlink", "gpu", "host"})
_POD_BOUNDARY_CAUSE = (
    "prefill and decode are separate pods without a shared PID namespace: UCX's cuda_ipc "
    "(and cma for host memory) cannot cross it, so the KV goes through the CPU over TCP; "
    "give the pods an RDMA NIC (spec.kvTransfer.rdma) or run both roles in the host's PID "
    "namespace (hostPID in both podTemplates, an admin opt-in; docs/topology.md)"
)
_IPC_BOUNDARY_CAUSE = (
    "prefill and decode share the host's PID namespace but each pod keeps its own IPC "
    "namespace: UCX's shared-memory lanes carry the IPC namespace in their address and reach "
    "no peer outside it, so the KV goes over TCP; set hostIPC in both podTemplates as well, or "
    "give the pods an RDMA NIC (spec.kvTransfer.rdma)"
)
_READ_EMULATED_CAUSE = (
    "UCX emulates a READ of this memory in software (no zero-copy get between these GPUs): "
    "an engine that WRITEs (SGLang, vLLM's push connector) avoids it"
)
_SLOW_HINTS = {
    "rdma": "check the NIC is the one nearest the GPU (UCX_NET_DEVICES), GPUDirect RDMA "
    "(open kernel module / nvidia-peermem) and the link speed",
    "shm": "host shared memory is bounded by CPU memory bandwidth; for GPU memory check that "
    "UCX_TLS lists cuda_ipc or an RDMA transport",
    "cuda_copy": "the data was staged through host memory: check UCX_TLS lists cuda_ipc/rc and "
    "that GPUDirect RDMA is available",
    "nvlink": "check the NVLink topology (nvidia-smi topo -m) and that both GPUs are in one "
    "NVLink domain",
}


@dataclass
class BlockResult:
    """Timing of the transfers of one block size (all blocks of that size in one request)."""

    block_size: int
    blocks: int
    bytes: int
    seconds: float
    gbps: float


@dataclass
class ProbeResult:
    """What one probe run measured. ``to_dict`` gives the documented JSON document."""

    path: str = ""
    transport: str = "unknown"
    gbps: float = 0.0
    bytes: int = 0
    blocks: int = 0
    block_sizes: list[int] = field(default_factory=list)
    verified: bool = False
    ucx_tls: str = ""
    ucx_net_devices: str = ""
    started_at: str = ""
    duration_s: float = 0.0
    error: str | None = None
    # Beyond the contract: what a human debugging a slow path wants next.
    transports: list[str] = field(default_factory=list)
    lanes: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    per_block_size: list[BlockResult] = field(default_factory=list)
    iterations: int = 0
    src_role: str = ""
    dst_role: str = ""
    peer: str = ""
    # Who measured: "preflight" (with the engine's GPUs and NICs) or "sidecar" (between the
    # sidecars, without them), which link ("nvlink", "rdma", "gpu", "host"), and the engine's
    # KV descriptor size the per-size figures include (0: unknown).
    measured_by: str = ""
    link: str = ""
    engine_descriptor_bytes: int = 0
    concurrency: int = 1
    # The engine descriptor's figure is measured in the engine's own pattern: one request in
    # flight with the engine's NIXL threads (0: none) and NIXL's split of it (0: its default).
    engine_nixl_threads: int = 0
    engine_split_batch: int = 0
    # The engine's direction ("WRITE": pushed into the peer; "READ": pulled from it) and
    # whether the peer was beyond a pod boundary ("pod") or in the same namespaces ("none").
    operation: str = "WRITE"
    peer_boundary: str = ""
    # Where the pod may not make the boundary's namespaces (an unprivileged pod under the
    # runtime's default seccomp profile), how it was emulated instead: the peer's UCX_TLS,
    # kept to the transports that cross it, and why ("": the namespaces were made).
    boundary_emulation: str = ""
    # UCX moved the bytes by software emulation (through the CPU, over its active-message
    # lane) rather than by a zero-copy or RDMA protocol.
    emulated: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProbeResult:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["per_block_size"] = [BlockResult(**b) for b in data.get("per_block_size") or []]
        return cls(**values)


def classify_probe(
    result: ProbeResult | Mapping[str, Any], expected_link_gbps: float, min_fraction: float
) -> tuple[bool, str, str]:
    """Turn a probe result into ``(ok, reason, message)`` for the ``KVTransferVerified``
    condition. The message names the measured path and, when it fails, the usual fixes."""
    r = result if isinstance(result, ProbeResult) else ProbeResult.from_dict(result)
    floor = expected_link_gbps * min_fraction
    where = r.path or "the KV path"
    if r.error:
        return False, REASON_FAILED, f"transfer probe failed on {where}: {r.error}"
    measured = f"{r.gbps:.1f} GB/s"
    if not r.verified:
        message = (
            f"{r.transport}: {measured} but the bytes that arrived did not match what was sent: "
            "check the memory registration and the NIXL/UCX versions on both sides"
        )
        return False, REASON_CORRUPT, message
    expected = f"expected ≥ {floor:g} GB/s{_over(r)}"
    lanes = f" on {', '.join(r.lanes)}" if r.lanes else ""
    if r.emulated or (r.gbps < floor and r.transport == "tcp"):
        how = "UCX software emulation" if r.emulated else "tcp fallback"
        cause = _fallback_cause(r)
        return False, REASON_TCP, f"{how}: {measured}{lanes}, {expected}: {cause}"
    if r.gbps < floor:
        hint = _SLOW_HINTS.get(r.transport, _TCP_HINT)
        return False, REASON_SLOW, f"{r.transport}: {measured}, {expected}: {hint}"
    message = f"{r.transport}: {measured} on {where} (expected ≥ {floor:g} GB/s), bytes verified"
    return True, REASON_VERIFIED, message


def _fallback_cause(r: ProbeResult) -> str:
    """Why the KV took the slow lane, in plain words, and what fixes it."""
    if r.peer_boundary == "pod" and r.link in _SAME_NODE_LINKS:
        return _POD_BOUNDARY_CAUSE
    if r.peer_boundary == "host-pid" and r.link == "host":
        # cuda_ipc needs only the PID namespace; the shared-memory lanes of host memory need
        # the IPC namespace too (bench/results/issue38-host-namespaces-h200).
        return _IPC_BOUNDARY_CAUSE
    if r.emulated and r.operation == "READ":
        return _READ_EMULATED_CAUSE
    return _TCP_HINT


def _over(r: ProbeResult) -> str:
    """`` over mlx5_3:1`` from the NICs UCX was pinned to (what the operator intended)."""
    devices = r.ucx_net_devices.strip()
    if devices and devices != "all":
        return f" over {devices}"
    return ""
