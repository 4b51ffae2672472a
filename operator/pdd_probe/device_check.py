"""The KV-path check with the engine's own devices, run by the preflight init container.

The init container holds the pod's GPUs, RDMA devices and memlock before the engine starts
(the kubelet hands an init container's devices on to the app containers), so a transfer it
measures takes the path the engine's KV will take: between the pod's GPUs over NVLink, or
out through the pinned NIC and back (GPUDirect RDMA loopback) when the KV leaves the node.
The sidecar beside the engine has none of these devices; its probe only shows that the peers
reach each other.

``plan_device_check`` is pure; ``run_device_check`` runs the probe's two processes here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from pdd_contract.env import UCX_NET_DEVICES, UCX_TLS
from pdd_contract.probe_result import ProbeResult
from pdd_probe.boundary import without_transports
from pdd_probe.probe import (
    BOUNDARIES,
    LINK_CONCURRENCY,
    MIB,
    OPERATIONS,
    ProbeSpec,
    run_local_probe,
)

# What a pod's KV path is checked with, beside the engine's own descriptor size: sizes at
# which NIXL reaches the link when it is healthy (docs/benchmarks.md).
LINK_BLOCK_SIZES = (16 * MIB, 64 * MIB)
BYTES_PER_SIZE = 256 * MIB  # on a GPU the engine has not started on yet
# Without a GPU the KV moves between host buffers over TCP or shared memory, and every start
# of a CPU pod runs this check on its node. 16 and 64 MiB blocks moved 80 MiB for 5.3 CPU-s
# (READ to another pod over TCP, this repository's CI machine); 4 and 16 MiB blocks move
# 32 MiB for 3.1 CPU-s and find the same lane, bytes verified, at 0.42 GB/s against 0.57
# (WRITE 0.80 against 0.87): the probe's three process starts are most of what is left.
# Without NIXL's progress thread in host memory (worker.progress_thread_for) that pass takes
# 2.6-2.7 CPU-s, and with the engine's 64 KiB pass the check 4.3-5.0 instead of 5.9-7.0.
HOST_BLOCK_SIZES = (4 * MIB, 16 * MIB)
HOST_BYTES_PER_SIZE = 16 * MIB
_NO_NIC = frozenset({"", "none", "void", "all"})


@dataclass(frozen=True)
class DeviceCheck:
    """What to measure: ``path`` names the link ("nvlink", "rdma", "gpu" for a pod with one
    GPU and no NIC, where no link can be measured, "host" without a GPU). ``spec`` measures
    the link with several requests in flight; ``engine`` the engine's descriptor size in the
    engine's own pattern (one request, its NIXL threads), where that size is known."""

    path: str
    spec: ProbeSpec
    ucx_tls: str
    engine: ProbeSpec | None = None


def plan_device_check(
    gpus: int,
    net_devices: str,
    ucx_tls: str,
    engine_descriptor_bytes: int | None,
    operation: str = "WRITE",
    peer_boundary: str = "pod",
    nixl_threads: int = 0,
    nixl_split_batch: int = 0,
) -> DeviceCheck:
    """The probe for a pod with ``gpus`` GPUs whose engine gets ``UCX_NET_DEVICES=net_devices``
    and ``UCX_TLS=ucx_tls``, moving the KV in the engine's direction (``operation``) to a peer
    beyond ``peer_boundary``. With a NIC the check must go through it, so the GPU-to-GPU
    shortcut (cuda_ipc) is taken out of the transports. The engine's descriptors move as
    the engine moves them: one request at a time through ``nixl_threads`` NIXL threads, each
    taking NIXL's share of it (``nixl_split_batch``, 0: NIXL's default)."""
    sizes = list(LINK_BLOCK_SIZES if gpus else HOST_BLOCK_SIZES)
    has_nic = net_devices.strip().lower() not in _NO_NIC
    if gpus == 0:
        path, mem, last = "host", "DRAM", 0
    else:
        path = "rdma" if has_nic else ("nvlink" if gpus > 1 else "gpu")
        mem, last = "VRAM", gpus - 1
    tls = without_cuda_ipc(ucx_tls) if has_nic and gpus else ucx_tls
    spec = ProbeSpec(
        src_mem=mem, dst_mem=mem, src_device=0, dst_device=last, block_sizes=sizes,
        bytes_per_size=BYTES_PER_SIZE if gpus else HOST_BYTES_PER_SIZE, iterations=5 if gpus else 1,
        concurrency=LINK_CONCURRENCY if gpus else 1, timeout_s=120.0,
        operation=operation, peer_boundary=peer_boundary,
    )  # fmt: skip
    engine = None
    if engine_descriptor_bytes:
        engine = replace(
            spec, block_sizes=[engine_descriptor_bytes], concurrency=1,
            nixl_threads=nixl_threads, nixl_split_batch=nixl_split_batch,
        )  # fmt: skip
    return DeviceCheck(path, spec, tls, engine)


def without_cuda_ipc(ucx_tls: str) -> str:
    """``UCX_TLS`` with cuda_ipc taken out, in UCX's own syntax (``^x`` excludes x)."""
    return without_transports(ucx_tls, ("cuda_ipc",))


def run_device_check(
    check: DeviceCheck,
    engine_descriptor_bytes: int | None,
    env: Mapping[str, str],
    extra_paths: Sequence[str] = (),
) -> ProbeResult:
    """Run the check between two processes here, with the engine's UCX environment."""
    probe_env = dict(env)
    if check.ucx_tls:
        probe_env[UCX_TLS] = check.ucx_tls
    result = run_local_probe(check.spec, extra_paths=extra_paths, env=probe_env)
    if check.engine is not None and not result.error:
        _add_engine_pattern(result, run_local_probe(check.engine, extra_paths, env=probe_env))
        result.engine_nixl_threads = check.engine.nixl_threads
        result.engine_split_batch = check.engine.nixl_split_batch
    # The verdict is about the link: its figure is the best of the large-block sizes, not an
    # average that the engine's small descriptors would pull down (they are reported apart).
    link_sizes = check.spec.block_sizes
    link_rates = [b.gbps for b in result.per_block_size if b.block_size in link_sizes]
    result.gbps = max(link_rates, default=result.gbps)
    result.measured_by = "preflight"
    result.link = check.path
    result.engine_descriptor_bytes = engine_descriptor_bytes or 0
    return result


def _add_engine_pattern(result: ProbeResult, engine: ProbeResult) -> None:
    """The engine-pattern pass's figure beside the link's sizes; a failed pass is named in
    the result's error, as a failed link pass is, since the engine's KV would fail the same."""
    if engine.error:
        result.error = f"at the engine's descriptor size: {engine.error}"
        return
    result.per_block_size += engine.per_block_size
    result.verified = result.verified and engine.verified
    for lane in engine.lanes:
        if lane not in result.lanes:
            result.lanes.append(lane)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pdd_probe.device_check --gpus 2``: the check by hand, its result as JSON."""
    import argparse
    import json
    import os

    parser = argparse.ArgumentParser(description="the KV-path check with this machine's devices")
    parser.add_argument("--gpus", type=int, required=True, help="GPUs to use (0: host memory)")
    parser.add_argument("--net-devices", default=os.environ.get(UCX_NET_DEVICES, ""))
    parser.add_argument("--descriptor-bytes", type=int, default=0, help="the engine's size")
    parser.add_argument("--operation", choices=OPERATIONS, default="WRITE")
    parser.add_argument("--peer-boundary", choices=BOUNDARIES, default="pod")
    parser.add_argument("--nixl-threads", type=int, default=0, help="the engine's NIXL threads")
    parser.add_argument("--nixl-split-batch", type=int, default=0, help="0: NIXL's default")
    args = parser.parse_args(argv)
    check = plan_device_check(
        args.gpus, args.net_devices, os.environ.get(UCX_TLS, ""), args.descriptor_bytes,
        args.operation, args.peer_boundary, args.nixl_threads, args.nixl_split_batch,
    )  # fmt: skip
    result = run_device_check(check, args.descriptor_bytes, dict(os.environ))
    print(json.dumps(result.to_dict(), indent=1))
    return 0 if result.verified and not result.error else 1


if __name__ == "__main__":
    raise SystemExit(main())
