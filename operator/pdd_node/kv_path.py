"""The preflight's last step: measure the KV path with this pod's own devices.

The init container holds the engine's GPUs, RDMA devices and memlock before the engine starts,
so the transfer it measures (``pdd_probe.device_check``) is the one the engine's KV will take.
It leaves the result in the pod's env volume, where the prober pod's sidecar hands it to the
operator for ``KVTransferVerified``. A slow or failed check does not stop the pod: the condition
says what is wrong, and the engine may still serve over a slower path.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from pdd_contract.env import UCX_NET_DEVICES, UCX_TLS
from pdd_contract.probe_result import ProbeResult
from pdd_probe.device_check import plan_device_check, run_device_check


def check_kv_path(
    gpus: int, net_devices: str, descriptor_bytes: int, env: Mapping[str, str], out: Path
) -> ProbeResult:
    """Run the check for a pod with ``gpus`` GPUs pinned to ``net_devices`` and write it."""
    check = plan_device_check(gpus, net_devices, env.get(UCX_TLS, ""), descriptor_bytes or None)
    probe_env = {**env, UCX_NET_DEVICES: net_devices} if net_devices else dict(env)
    result = run_device_check(check, descriptor_bytes, probe_env)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result.to_dict(), separators=(",", ":")))
    return result


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
    line = f"{result.link} link: {result.transport} at {result.gbps:.1f} GB/s, bytes verified"
    if engine is not None:
        line += f"; {engine.gbps:.1f} GB/s at the engine's {engine.block_size}-byte descriptors"
    return line
