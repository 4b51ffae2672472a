"""The preflight init container: pin each GPU to its nearest RDMA port and check the RDMA
prerequisites before the inference engine starts.

It runs in the engine's pod with the engine's GPUs (the device plugin hands an init
container's devices on to the app containers), so what it sees is what the engine will get:

1. which GPUs this container has (NVIDIA_VISIBLE_DEVICES, then CUDA_VISIBLE_DEVICES);
2. the node topology (sysfs/procfs), and per GPU the nearest ACTIVE RDMA port -- or the
   ports of the explicit map PDD_NIC_MAP when PDD_NIC_SELECTION=explicit;
3. checks: memlock unlimited, /dev/infiniband/uverbs* present, chosen ports ACTIVE,
   GPUDirect mode as requested (PDD_GPUDIRECT), /dev/shm large enough.

The result is a shell-sourceable env file (UCX_NET_DEVICES, PDD_GPU_NIC_MAP, ...) the engine's
entrypoint sources. A failed *required* check (PDD_REQUIRE_RDMA=true makes the RDMA ones
required; an explicit PDD_GPUDIRECT request is always required) stops the pod: exit 1 and a
message in the termination log saying what to fix, which `kubectl describe pod` shows. Other
problems become warnings in the env file and on stdout.

The checks are pure functions of (topology, config, container facts); `main` does the I/O.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar, get_args

from pdd_contract.env import (
    PDD_GPU_NIC_MAP,
    PDD_GPUDIRECT,
    PDD_GPUDIRECT_MODE,
    PDD_KV_DESCRIPTOR_BYTES,
    PDD_KV_NIXL_SPLIT_BATCH,
    PDD_KV_NIXL_THREADS,
    PDD_KV_OPERATION,
    PDD_KV_PEER_BOUNDARY,
    PDD_NIC_MAP,
    PDD_NIC_SELECTION,
    PDD_REQUIRE_RDMA,
    PDD_VERIFY_TRANSFER,
    UCX_IB_GPU_DIRECT_RDMA,
    UCX_NET_DEVICES,
    GpuDirectRequest,
    KvOperation,
    KvPeerBoundary,
    NicSelectionMode,
)
from pdd_contract.paths import ENV_FILE, KV_PATH_FILE
from pdd_contract.resources import GPU_RESOURCE
from pdd_node.kv_path import KvPathRequest, check_kv_path, summary
from pdd_node.topology.gpudirect import (
    FIX_OPEN_MODULE,
    FIX_PEERMEM,
    dmabuf_missing,
    facts_from_topology,
    gpudirect_blocker,
)
from pdd_node.topology.model import DistanceClass, Gpu, NodeTopology
from pdd_node.topology.nics import choose_ports, distance_rank, nearest_nics
from pdd_node.topology.scan import scan

DEFAULT_ENV_FILE = Path(ENV_FILE)
DEFAULT_TERMINATION_LOG = Path("/dev/termination-log")
# The kubelet keeps at most 4096 bytes of a termination message.
TERMINATION_MESSAGE_LIMIT = 4096
# Docker's and containerd's default /dev/shm is 64 MiB; NCCL/UCX shared-memory lanes and the
# engines' worker queues need far more.
MIN_SHM_BYTES = 1 << 30

Status = Literal["ok", "warning", "failed"]
_T = TypeVar("_T")

_UVERBS = re.compile(r"^uverbs\d+$")
_UCX_DEVICE = re.compile(r"^([A-Za-z0-9_.-]+):(\d+)$")
_NO_DEVICES = frozenset({"none", "void", ""})
_GPUDIRECT_REQUESTS: dict[str, GpuDirectRequest] = {
    name: name for name in get_args(GpuDirectRequest)
}
_NIC_SELECTION_MODES: dict[str, NicSelectionMode] = {
    name: name for name in get_args(NicSelectionMode)
}
_OPERATIONS: dict[str, KvOperation] = {name: name for name in get_args(KvOperation)}
_BOUNDARIES: dict[str, KvPeerBoundary] = {name: name for name in get_args(KvPeerBoundary)}


class PreflightError(ValueError):
    """A configuration the preflight cannot act on; the message says what to fix."""


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: Status
    message: str


@dataclass(frozen=True)
class PreflightConfig:
    """What the operator asked for, from the container's environment."""

    require_rdma: bool = False
    gpudirect: GpuDirectRequest = "auto"
    nic_selection: NicSelectionMode = "auto"
    nic_map: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    nvidia_visible_devices: str | None = None
    cuda_visible_devices: str | None = None
    verify_transfer: bool = False
    kv_descriptor_bytes: int = 0
    # Without the operator's word: WRITE, and a pod boundary, which every P/D pair crosses.
    kv_operation: KvOperation = "WRITE"
    kv_peer_boundary: KvPeerBoundary = "pod"
    kv_nixl_threads: int = 0
    kv_nixl_split_batch: int = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> PreflightConfig:
        gpudirect = _GPUDIRECT_REQUESTS.get(env.get(PDD_GPUDIRECT, "auto").strip().lower())
        if gpudirect is None:
            raise PreflightError(
                f"{PDD_GPUDIRECT}={env[PDD_GPUDIRECT]!r} is not one of auto, dmabuf, peermem, "
                "off: fix spec.kvTransfer.gpuDirect"
            )
        selection = _NIC_SELECTION_MODES.get(env.get(PDD_NIC_SELECTION, "auto").strip().lower())
        if selection is None:
            raise PreflightError(
                f"{PDD_NIC_SELECTION}={env[PDD_NIC_SELECTION]!r} is not auto or explicit: fix "
                "spec.kvTransfer.nicSelection.mode"
            )
        return cls(
            require_rdma=_parse_bool(PDD_REQUIRE_RDMA, env.get(PDD_REQUIRE_RDMA, "false")),
            gpudirect=gpudirect,
            nic_selection=selection,
            nic_map=parse_nic_map(env.get(PDD_NIC_MAP, "")),
            nvidia_visible_devices=env.get("NVIDIA_VISIBLE_DEVICES"),
            cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
            verify_transfer=_parse_bool(PDD_VERIFY_TRANSFER, env.get(PDD_VERIFY_TRANSFER, "")),
            kv_descriptor_bytes=_parse_count(
                PDD_KV_DESCRIPTOR_BYTES, env.get(PDD_KV_DESCRIPTOR_BYTES, "")
            ),
            kv_operation=_choice(PDD_KV_OPERATION, env.get(PDD_KV_OPERATION, "WRITE"), _OPERATIONS),
            kv_peer_boundary=_choice(
                PDD_KV_PEER_BOUNDARY, env.get(PDD_KV_PEER_BOUNDARY, "pod"), _BOUNDARIES
            ),
            kv_nixl_threads=_parse_count(PDD_KV_NIXL_THREADS, env.get(PDD_KV_NIXL_THREADS, "")),
            kv_nixl_split_batch=_parse_count(
                PDD_KV_NIXL_SPLIT_BATCH, env.get(PDD_KV_NIXL_SPLIT_BATCH, "")
            ),
        )


@dataclass(frozen=True)
class ContainerFacts:
    """What the preflight measures about its own container, besides the node topology."""

    memlock_soft: int
    memlock_hard: int
    uverbs_devices: tuple[str, ...]
    shm_bytes: int | None  # None: no /dev/shm
    unlimited: int = resource.RLIM_INFINITY


@dataclass(frozen=True)
class RankDevices:
    """The RDMA ports for one GPU of this container; rank is its CUDA device ordinal."""

    rank: int
    gpu: Gpu
    devices: tuple[str, ...]
    distance: DistanceClass | None


@dataclass(frozen=True)
class PreflightReport:
    ranks: tuple[RankDevices, ...]
    gpudirect_mode: str
    checks: tuple[CheckResult, ...]
    ucx_gpu_direct_rdma: str | None = None

    @property
    def failures(self) -> list[CheckResult]:
        return [check for check in self.checks if check.status == "failed"]

    @property
    def warnings(self) -> list[CheckResult]:
        return [check for check in self.checks if check.status == "warning"]

    @property
    def ucx_net_devices(self) -> str:
        """Every rank's ports, deduplicated, in rank order."""
        devices = (device for rank in self.ranks for device in rank.devices)
        return ",".join(dict.fromkeys(devices))

    @property
    def gpu_nic_map(self) -> str:
        """`0:mlx5_0:1,1:mlx5_1:1`: rank -> its port(s), several joined by `+`."""
        return ",".join(
            f"{rank.rank}:{'+'.join(rank.devices)}" for rank in self.ranks if rank.devices
        )


# --- which GPUs this container has -------------------------------------------------------


def visible_gpus(
    gpus: Sequence[Gpu], nvidia_visible_devices: str | None, cuda_visible_devices: str | None
) -> list[Gpu]:
    """The container's GPUs in CUDA ordinal order.

    NVIDIA_VISIBLE_DEVICES (set by the device plugin) picks node GPUs by nvidia-smi index or
    UUID; unset or `all` means every GPU. The container sees them in PCI bus order, and
    CUDA_VISIBLE_DEVICES then picks and orders among those, by position or UUID (prefix).
    """
    by_index = sorted(gpus, key=lambda gpu: gpu.index)
    exposed = _select_exposed(by_index, nvidia_visible_devices)
    if cuda_visible_devices is None:
        return exposed
    return _select_cuda_visible(exposed, cuda_visible_devices)


def _select_exposed(gpus: list[Gpu], value: str | None) -> list[Gpu]:
    if value is None or value.strip().lower() == "all":
        return gpus
    if value.strip().lower() in _NO_DEVICES:
        return []
    chosen: set[int] = set()
    for token in _tokens(value):
        if token.isdigit():
            chosen.add(_gpu_by_index(gpus, int(token), "NVIDIA_VISIBLE_DEVICES").index)
        else:
            chosen.add(_gpu_by_uuid(gpus, token, "NVIDIA_VISIBLE_DEVICES").index)
    return [gpu for gpu in gpus if gpu.index in chosen]


def _select_cuda_visible(exposed: list[Gpu], value: str) -> list[Gpu]:
    selected: list[Gpu] = []
    for token in _tokens(value):
        if token.lstrip("-").isdigit():
            position = int(token)
            if position < 0:
                break  # CUDA stops at an invalid ordinal; "-1" is the idiom for "no GPU"
            if position >= len(exposed):
                raise PreflightError(
                    f"CUDA_VISIBLE_DEVICES names device {position} but the container has "
                    f"{len(exposed)} GPU(s): fix CUDA_VISIBLE_DEVICES or request more GPUs"
                )
            gpu = exposed[position]
        else:
            gpu = _gpu_by_uuid(exposed, token, "CUDA_VISIBLE_DEVICES")
        if gpu not in selected:
            selected.append(gpu)
    return selected


def _gpu_by_index(gpus: list[Gpu], index: int, variable: str) -> Gpu:
    for gpu in gpus:
        if gpu.index == index:
            return gpu
    raise PreflightError(
        f"{variable} names GPU {index}, but this node has GPUs "
        f"{_index_list(gpus)}: the device plugin and the node disagree; check the node's GPUs"
    )


def _gpu_by_uuid(gpus: list[Gpu], token: str, variable: str) -> Gpu:
    if token.startswith("MIG-"):
        raise PreflightError(
            f"{variable} names a MIG device ({token}); KV transfer over RDMA needs whole GPUs: "
            f"request {GPU_RESOURCE}, not a MIG profile"
        )
    matches = [gpu for gpu in gpus if gpu.uuid and gpu.uuid.startswith(token)]
    if len(matches) != 1:
        raise PreflightError(
            f"{variable} names {token}, which matches {len(matches)} of this container's GPUs "
            f"(UUIDs from /proc/driver/nvidia/gpus: {_uuid_list(gpus)}): check that the NVIDIA "
            "driver's /proc entries are visible in the container"
        )
    return matches[0]


# --- which RDMA ports each GPU gets ------------------------------------------------------


def rank_devices(
    topology: NodeTopology, gpus: Sequence[Gpu], config: PreflightConfig
) -> tuple[RankDevices, ...]:
    if config.nic_selection == "explicit":
        return tuple(
            _explicit_rank(topology, rank, gpu, config.nic_map) for rank, gpu in enumerate(gpus)
        )
    choices = choose_ports(topology, [gpu.index for gpu in gpus])
    return tuple(
        RankDevices(
            rank=rank,
            gpu=gpu,
            devices=(choices[gpu.index].ucx_device,) if gpu.index in choices else (),
            distance=choices[gpu.index].distance if gpu.index in choices else None,
        )
        for rank, gpu in enumerate(gpus)
    )


def _explicit_rank(
    topology: NodeTopology, rank: int, gpu: Gpu, nic_map: Mapping[int, tuple[str, ...]]
) -> RankDevices:
    devices = nic_map.get(gpu.index, ())
    first_nic = _split_device(devices[0])[0] if devices else None
    distance = topology.distance(gpu.index, first_nic) if first_nic else None
    return RankDevices(rank=rank, gpu=gpu, devices=devices, distance=distance)


# --- the checks --------------------------------------------------------------------------


def check_gpus_visible(ranks: Sequence[RankDevices], config: PreflightConfig) -> CheckResult:
    if ranks:
        listed = ", ".join(f"{rank.rank}=GPU {rank.gpu.index}" for rank in ranks)
        return CheckResult("gpus", "ok", f"GPUs (CUDA ordinal=node index): {listed}")
    return CheckResult(
        "gpus",
        "warning",
        "no GPU is visible in this container (NVIDIA_VISIBLE_DEVICES="
        f"{config.nvidia_visible_devices!r}), so no RDMA port is pinned: request {GPU_RESOURCE} "
        "for the pod if the engine should use GPUs",
    )


def check_rdma_ports(
    topology: NodeTopology, ranks: Sequence[RankDevices], config: PreflightConfig
) -> list[CheckResult]:
    """Every GPU has an ACTIVE port; explicit ports exist and are ACTIVE; and a warning when a
    GPU's port is farther than its nearest NIC or crosses sockets."""
    if not ranks:
        return []
    if config.nic_selection == "explicit":
        results = [r for rank in ranks for r in _check_explicit_ports(topology, rank, config)]
    else:
        results = _check_auto_ports(topology, ranks, config)
    if results:
        return results
    if any(rank.devices for rank in ranks):
        return [CheckResult("rdma-ports", "ok", "every GPU has an ACTIVE RDMA port")]
    return [CheckResult("rdma-ports", "ok", "no RDMA NIC on this node and none required")]


def _check_auto_ports(
    topology: NodeTopology, ranks: Sequence[RankDevices], config: PreflightConfig
) -> list[CheckResult]:
    without_port = [rank.gpu for rank in ranks if not rank.devices]
    results: list[CheckResult] = []
    # No RDMA NIC at all and none asked for: TCP is the plan, nothing to warn about.
    if without_port and (topology.nics or config.require_rdma):
        results.append(
            CheckResult(
                "rdma-ports",
                _required(config.require_rdma),
                f"GPU {_index_list(without_port)} has no ACTIVE RDMA port "
                f"({_port_summary(topology)}): bring a port up (check the cable and switch "
                "port, `ibstat`), or schedule on nodes whose RDMA NICs are up",
            )
        )
    with_port = [rank for rank in ranks if rank.devices]
    results += [w for rank in with_port if (w := _fallback_warning(topology, rank))]
    across_sockets = [rank for rank in with_port if rank.distance == "SYS"]
    if across_sockets:
        pinned = ", ".join(f"GPU {r.gpu.index}->{r.devices[0]}" for r in across_sockets)
        results.append(
            CheckResult(
                "rdma-ports",
                "warning",
                f"{pinned}: these GPUs reach their RDMA port only across the CPU socket "
                "interconnect (SYS), well below the NIC's line rate: use nodes with a NIC on "
                "each socket, or GPUs on the NICs' socket",
            )
        )
    return results


def _fallback_warning(topology: NodeTopology, rank: RankDevices) -> CheckResult | None:
    """A GPU pinned to a farther NIC because its nearest one has no ACTIVE port."""
    nearest, nearest_names = nearest_nics(topology, rank.gpu.index)
    if rank.distance is None or nearest is None:
        return None
    if distance_rank(nearest) >= distance_rank(rank.distance):
        return None
    return CheckResult(
        "rdma-ports",
        "warning",
        f"GPU {rank.gpu.index}'s nearest NIC {'/'.join(nearest_names)} ({nearest}) has no "
        f"ACTIVE port ({_port_summary(topology, nearest_names)}); using {rank.devices[0]} "
        f"({rank.distance}) at lower bandwidth: bring the near port up (cable, switch port, "
        "`ibstat`)",
    )


def _check_explicit_ports(
    topology: NodeTopology, rank: RankDevices, config: PreflightConfig
) -> list[CheckResult]:
    gpu = rank.gpu
    if not rank.devices:
        return [
            CheckResult(
                "rdma-ports",
                _required(config.require_rdma),
                f"spec.kvTransfer.nicSelection.map has no entry for GPU {gpu.index}, which this "
                "pod got: add one (GPU index = nvidia-smi index on the node), or use mode auto",
            )
        ]
    results: list[CheckResult] = []
    for device in rank.devices:
        problem = _explicit_port_problem(topology, device)
        if problem is not None:
            status = "failed" if problem.unknown else _required(config.require_rdma)
            results.append(
                CheckResult(
                    "rdma-ports",
                    status,
                    f"spec.kvTransfer.nicSelection.map gives GPU {gpu.index} {device}, but "
                    f"{problem.text}: fix the map or use mode auto",
                )
            )
    return results


@dataclass(frozen=True)
class _PortProblem:
    text: str
    unknown: bool


def _explicit_port_problem(topology: NodeTopology, device: str) -> _PortProblem | None:
    nic_name, port_number = _split_device(device)
    nics = {nic.name: nic for nic in topology.nics}
    if nic_name not in nics:
        known = ", ".join(nics) or "none"
        return _PortProblem(f"this node has no RDMA NIC {nic_name} (NICs: {known})", True)
    ports = {port.port: port for port in nics[nic_name].ports}
    if port_number not in ports:
        return _PortProblem(f"{nic_name} has no port {port_number}", True)
    if not ports[port_number].active:
        return _PortProblem(f"that port is {ports[port_number].state}, not ACTIVE", False)
    return None


def check_memlock(facts: ContainerFacts, rdma_in_use: bool, require_rdma: bool) -> CheckResult:
    """RDMA pins (registers) memory; a limited memlock makes registration of the KV cache
    fail or fall back to TCP."""
    if facts.memlock_soft == facts.unlimited:
        return CheckResult("memlock", "ok", "memlock is unlimited")
    if not (rdma_in_use or require_rdma):
        return CheckResult("memlock", "ok", "memlock is limited, but no RDMA is in use")
    if facts.memlock_hard == facts.unlimited:
        fix = (
            "the hard limit is unlimited, so raise the soft limit before the engine starts "
            "(`ulimit -l unlimited` in the entrypoint)"
        )
    else:
        fix = (
            "run the container with IPC_LOCK and set the container runtime's memlock ulimit to "
            "unlimited (containerd: LimitMEMLOCK=infinity in its systemd unit; CRI-O: "
            'default_ulimits = ["memlock=-1:-1"]); Kubernetes has no ulimit field'
        )
    return CheckResult(
        "memlock",
        _required(require_rdma),
        f"memlock is {_bytes(facts.memlock_soft)}; RDMA needs unlimited: {fix}",
    )


def check_uverbs(facts: ContainerFacts, rdma_in_use: bool, require_rdma: bool) -> CheckResult:
    if facts.uverbs_devices:
        return CheckResult("uverbs", "ok", f"RDMA devices: {', '.join(facts.uverbs_devices)}")
    if not (rdma_in_use or require_rdma):
        return CheckResult("uverbs", "ok", "no /dev/infiniband/uverbs*, and no RDMA is in use")
    return CheckResult(
        "uverbs",
        _required(require_rdma),
        "no /dev/infiniband/uverbs* in this container, so it cannot open an RDMA NIC: give "
        "the pod an RDMA resource (spec.kvTransfer.rdma.resourceName, e.g. "
        "rdma/rdma_shared_device_a from the RDMA shared device plugin or an SR-IOV VF "
        "resource) or enable spec.topology.dra",
    )


def check_gpudirect(
    topology: NodeTopology, requested: GpuDirectRequest, rdma_in_use: bool
) -> CheckResult:
    """An explicit request (dmabuf, peermem) is a requirement; auto takes what the node has."""
    node_mode = topology.gpudirect
    if requested == "off":
        return CheckResult("gpudirect", "ok", "GPUDirect RDMA off as requested")
    if requested == "auto":
        if node_mode != "none" or not rdma_in_use:
            return CheckResult("gpudirect", "ok", f"GPUDirect RDMA: {node_mode}")
        return CheckResult(
            "gpudirect",
            "warning",
            "GPU memory will be staged through host memory (slower): " + topology.gpudirect_reason,
        )
    if requested == "dmabuf":
        return _check_dmabuf(topology)
    return _check_peermem(topology)


def _check_dmabuf(topology: NodeTopology) -> CheckResult:
    if topology.gpudirect == "dmabuf":
        return CheckResult("gpudirect", "ok", "GPUDirect RDMA through dma-buf")
    facts = facts_from_topology(topology)
    blocker = gpudirect_blocker(facts)
    if blocker is None:
        blocker = f"{'; '.join(dmabuf_missing(facts))}. Fix: {FIX_OPEN_MODULE}"
    alternative = " (this node has nvidia-peermem)" if topology.peermem_loaded else ""
    return CheckResult(
        "gpudirect",
        "failed",
        f"{PDD_GPUDIRECT}=dmabuf, but this node cannot do GPUDirect RDMA through dma-buf: "
        f"{blocker}; or set spec.kvTransfer.gpuDirect to auto{alternative}",
    )


def _check_peermem(topology: NodeTopology) -> CheckResult:
    blocker = gpudirect_blocker(facts_from_topology(topology))
    if blocker is None and topology.peermem_loaded:
        return CheckResult("gpudirect", "ok", "GPUDirect RDMA through nvidia-peermem")
    if blocker is None:
        blocker = f"nvidia_peermem is not loaded. Fix: {FIX_PEERMEM}"
    return CheckResult(
        "gpudirect",
        "failed",
        f"{PDD_GPUDIRECT}=peermem, but GPUDirect RDMA through nvidia-peermem is unavailable on "
        f"this node: {blocker}; or set spec.kvTransfer.gpuDirect to auto",
    )


def check_shm(facts: ContainerFacts) -> CheckResult:
    if facts.shm_bytes is None:
        return CheckResult(
            "shm",
            "warning",
            "no /dev/shm in this container: mount an emptyDir with medium: Memory at /dev/shm",
        )
    if facts.shm_bytes < MIN_SHM_BYTES:
        return CheckResult(
            "shm",
            "warning",
            f"/dev/shm is {_bytes(facts.shm_bytes)}: mount an emptyDir with medium: Memory at "
            "/dev/shm (spec.kvTransfer.sharedMemorySize) of at least 1 GiB",
        )
    return CheckResult("shm", "ok", f"/dev/shm is {_bytes(facts.shm_bytes)}")


# --- putting it together -----------------------------------------------------------------


def run_preflight(
    topology: NodeTopology, config: PreflightConfig, facts: ContainerFacts
) -> PreflightReport:
    try:
        gpus = visible_gpus(
            topology.gpus, config.nvidia_visible_devices, config.cuda_visible_devices
        )
    except PreflightError as error:
        return PreflightReport((), "none", (CheckResult("gpus", "failed", str(error)),))
    ranks = rank_devices(topology, gpus, config)
    rdma_in_use = any(rank.devices for rank in ranks)
    checks = [
        check_gpus_visible(ranks, config),
        *check_rdma_ports(topology, ranks, config),
        check_memlock(facts, rdma_in_use, config.require_rdma),
        check_uverbs(facts, rdma_in_use, config.require_rdma),
        check_gpudirect(topology, config.gpudirect, rdma_in_use),
        check_shm(facts),
    ]
    return PreflightReport(
        ranks=ranks,
        gpudirect_mode="off" if config.gpudirect == "off" else topology.gpudirect,
        checks=tuple(checks),
        ucx_gpu_direct_rdma=_ucx_gpu_direct_rdma(config.gpudirect),
    )


def _ucx_gpu_direct_rdma(requested: GpuDirectRequest) -> str | None:
    """After an explicit request passed its check, make UCX fail loudly rather than fall back
    silently; `off` is rendered into the pod spec by the operator; auto keeps UCX's `try`."""
    return "yes" if requested in ("dmabuf", "peermem") else None


def render_env_file(report: PreflightReport) -> str:
    lines = [
        "# Written by the pdd preflight init container; sourced before the engine starts.",
        *(_rank_comment(rank) for rank in report.ranks),
        *(f"# warning [{check.name}]: {_one_line(check.message)}" for check in report.warnings),
    ]
    variables = {
        UCX_NET_DEVICES: report.ucx_net_devices,
        PDD_GPU_NIC_MAP: report.gpu_nic_map,
        PDD_GPUDIRECT_MODE: report.gpudirect_mode,
        UCX_IB_GPU_DIRECT_RDMA: report.ucx_gpu_direct_rdma or "",
    }
    # An empty UCX_NET_DEVICES would not mean "any device" to UCX: leave unset ones out.
    lines += [f"export {name}={shlex.quote(value)}" for name, value in variables.items() if value]
    return "\n".join(lines) + "\n"


def _rank_comment(rank: RankDevices) -> str:
    devices = "+".join(rank.devices) or "no RDMA port"
    distance = f" ({rank.distance})" if rank.distance else ""
    return f"# rank {rank.rank}: GPU {rank.gpu.index} {rank.gpu.pci_address} -> {devices}{distance}"


def termination_message(report: PreflightReport) -> str:
    """The failed checks, one paragraph each, cut to what the kubelet keeps."""
    text = "\n\n".join(f"preflight: {_one_line(check.message)}" for check in report.failures)
    encoded = text.encode()
    if len(encoded) <= TERMINATION_MESSAGE_LIMIT:
        return text
    return encoded[: TERMINATION_MESSAGE_LIMIT - 3].decode(errors="ignore") + "..."


def read_container_facts(dev_root: Path) -> ContainerFacts:
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    try:
        uverbs = tuple(
            sorted(e.name for e in (dev_root / "infiniband").iterdir() if _UVERBS.match(e.name))
        )
    except OSError:
        uverbs = ()
    try:
        stats = os.statvfs(dev_root / "shm")
        shm_bytes: int | None = stats.f_blocks * stats.f_frsize
    except OSError:
        shm_bytes = None
    return ContainerFacts(soft, hard, uverbs, shm_bytes)


def main(argv: list[str] | None = None) -> int:
    """`pdd-node preflight [...]`; `argv` is what follows `preflight`."""
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    try:
        config = PreflightConfig.from_env(os.environ)
    except PreflightError as error:
        report = PreflightReport((), "none", (CheckResult("config", "failed", str(error)),))
    else:
        topology = scan(args.sysfs_root, args.procfs_root)
        report = run_preflight(topology, config, read_container_facts(args.dev_root))
    for check in report.checks:
        print(f"preflight [{check.status}] {check.name}: {check.message}")
    if report.failures:
        _write_quietly(args.termination_log, termination_message(report))
        return 1
    args.env_file.parent.mkdir(parents=True, exist_ok=True)
    args.env_file.write_text(render_env_file(report))
    print(f"preflight: wrote {args.env_file}")
    if config.verify_transfer:
        _check_kv_path(report, config, args.kv_path_file)
    return 0


def _check_kv_path(report: PreflightReport, config: PreflightConfig, out: Path) -> None:
    result = check_kv_path(
        KvPathRequest(
            gpus=len(report.ranks),
            net_devices=report.ucx_net_devices,
            descriptor_bytes=config.kv_descriptor_bytes,
            operation=config.kv_operation,
            peer_boundary=config.kv_peer_boundary,
            nixl_threads=config.kv_nixl_threads,
            nixl_split_batch=config.kv_nixl_split_batch,
        ),
        os.environ,
        out,
    )
    status = "ok" if result.verified and not result.error else "warning"
    print(f"preflight [{status}] kv-path: {summary(result)}")


def _parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="pdd-node preflight",
        description="Pin each GPU to its nearest RDMA port and check the RDMA prerequisites.",
    )
    parser.add_argument("--env-file", type=Path, default=DEFAULT_ENV_FILE)
    parser.add_argument("--kv-path-file", type=Path, default=Path(KV_PATH_FILE))
    parser.add_argument("--termination-log", type=Path, default=DEFAULT_TERMINATION_LOG)
    parser.add_argument("--sysfs-root", type=Path, default=Path("/sys"))
    parser.add_argument("--procfs-root", type=Path, default=Path("/proc"))
    parser.add_argument("--dev-root", type=Path, default=Path("/dev"))
    return parser.parse_args(argv)


def parse_nic_map(value: str) -> dict[int, tuple[str, ...]]:
    """PDD_NIC_MAP `0=mlx5_0:1;1=mlx5_1:1,mlx5_2:1` -> {0: ("mlx5_0:1",), 1: (...)}; the keys
    are node GPU indices (nvidia-smi's)."""
    nic_map: dict[int, tuple[str, ...]] = {}
    for entry in filter(None, (part.strip() for part in value.split(";"))):
        key, separator, devices = entry.partition("=")
        parsed = tuple(_tokens(devices))
        if (
            not separator
            or not key.strip().isdigit()
            or not parsed
            or not all(_UCX_DEVICE.match(d) for d in parsed)
        ):
            raise PreflightError(
                f"{PDD_NIC_MAP} entry {entry!r} is not `<gpu index>=<device>:<port>[,...]`: fix "
                "spec.kvTransfer.nicSelection.map"
            )
        nic_map[int(key)] = parsed
    return nic_map


def _parse_bool(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no", ""):
        return False
    raise PreflightError(f"{name}={value!r} is not true or false")


def _choice(name: str, value: str, choices: Mapping[str, _T]) -> _T:
    chosen = choices.get(value.strip())
    if chosen is None:
        raise PreflightError(
            f"{name}={value!r} is not one of {', '.join(choices)}: the operator renders it; "
            "remove it from the podTemplate"
        )
    return chosen


def _parse_count(name: str, value: str) -> int:
    if not value.strip():
        return 0
    if not value.strip().isdigit():
        raise PreflightError(f"{name}={value!r} is not a whole number")
    return int(value)


def _required(required: bool) -> Status:
    return "failed" if required else "warning"


def _split_device(device: str) -> tuple[str, int]:
    match = _UCX_DEVICE.match(device)
    if match is None:
        raise PreflightError(f"{device!r} is not a UCX device:port such as mlx5_3:1")
    return match.group(1), int(match.group(2))


def _port_summary(topology: NodeTopology, nic_names: Sequence[str] | None = None) -> str:
    ports = [
        f"{nic.name}:{port.port} {port.state}"
        for nic in topology.nics
        if nic_names is None or nic.name in nic_names
        for port in nic.ports
    ]
    return "ports: " + (", ".join(ports) if ports else "none; no RDMA NIC in /sys/class/infiniband")


def _tokens(value: str) -> list[str]:
    return [token.strip() for token in value.split(",") if token.strip()]


def _index_list(gpus: Sequence[Gpu]) -> str:
    return ", ".join(str(gpu.index) for gpu in gpus) or "none"


def _uuid_list(gpus: Sequence[Gpu]) -> str:
    return ", ".join(gpu.uuid or f"GPU {gpu.index}: unknown" for gpu in gpus) or "none"


def _bytes(count: int) -> str:
    """8388608 -> "8 MiB"; 270553174016 -> "252.0 GiB"."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count // size} {unit}" if count % size == 0 else f"{count / size:.1f} {unit}"
    return f"{count} bytes"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _write_quietly(path: Path, text: str) -> None:
    """The termination log is a best effort: stderr carries the same text."""
    print(text, file=sys.stderr)
    try:
        path.write_text(text)
    except OSError as error:
        print(f"preflight: cannot write {path}: {error}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
