"""The preflight's last step: measure the KV path with this pod's own devices.

The init container holds the engine's GPUs, RDMA devices and memlock before the engine starts,
so the transfer it measures (``pdd_probe.device_check``) uses the devices the engine's KV will
use. The KV goes to another pod, so the check's peer runs beyond a pod boundary of its own
(``pdd_probe.boundary``), and the bytes move in the engine's direction (READ for vLLM's
NixlConnector, WRITE for SGLang). It leaves the result in the pod's env volume, where the
prober pod's sidecar hands it to the operator for ``KVTransferVerified``. A slow or failed
check does not stop the pod: the condition says what is wrong, and the engine may still serve
over a slower path.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pdd_contract.env import UCX_NET_DEVICES, UCX_TLS, KvOperation, KvPeerBoundary
from pdd_contract.probe_result import ProbeResult
from pdd_probe.device_check import plan_device_check, run_device_check


@dataclass(frozen=True)
class KvPathRequest:
    """What to check: a pod with ``gpus`` GPUs pinned to ``net_devices``, the engine's
    descriptor size (0: unknown), its pattern (direction, NIXL threads and their split of a
    request), and the boundary to the peer pod."""

    gpus: int
    net_devices: str = ""
    descriptor_bytes: int = 0
    operation: KvOperation = "WRITE"
    peer_boundary: KvPeerBoundary = "pod"
    nixl_threads: int = 0
    nixl_split_batch: int = 0


def check_kv_path(request: KvPathRequest, env: Mapping[str, str], out: Path) -> ProbeResult:
    """Run the check and write its result to ``out``."""
    check = plan_device_check(
        request.gpus,
        request.net_devices,
        env.get(UCX_TLS, ""),
        request.descriptor_bytes or None,
        operation=request.operation,
        peer_boundary=request.peer_boundary,
        nixl_threads=request.nixl_threads,
        nixl_split_batch=request.nixl_split_batch,
    )
    probe_env = dict(env)
    if request.net_devices:
        probe_env[UCX_NET_DEVICES] = request.net_devices
    result = run_device_check(check, request.descriptor_bytes, probe_env)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result.to_dict(), separators=(",", ":")))
    return result


_PEER_WORDS = {
    "pod": "to another pod",
    "host-pid": "to another pod in the host's PID namespace",
    "host-pid-ipc": "to another pod in the host's PID and IPC namespaces",
}


def summary(result: ProbeResult) -> str:
    """One preflight log line: what was measured and what it reached."""
    if result.error:
        return f"the {result.link or 'KV'} path check failed: {result.error}"
    if not result.verified:
        return f"{result.transport}: {result.gbps:.1f} GB/s but the bytes did not arrive intact"
    engine = next(
        (b for b in result.per_block_size if b.block_size == result.engine_descriptor_bytes),
        None,
    )
    how = f"{result.operation} {_PEER_WORDS.get(result.peer_boundary, 'in-pod')}"
    line = (
        f"{result.link} link, {how}: {result.transport} at {result.gbps:.1f} GB/s"
        f"{' (UCX software emulation)' if result.emulated else ''}, bytes verified"
    )
    if engine is not None:
        line += (
            f"; {engine.gbps:.1f} GB/s at the engine's {engine.block_size}-byte descriptors "
            f"(one request, {result.engine_nixl_threads} NIXL threads)"
        )
    if result.boundary_emulation:
        line += f"; the boundary emulated: peer kept to {result.boundary_emulation}"
    return line
