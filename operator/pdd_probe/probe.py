"""The NIXL transfer probe: what to move, and running it between two local processes.

A probe is a target process (registers memory, publishes its metadata, checks what arrived)
and an initiator process (WRITEs a KV-sized block mix into it, times it, reads from UCX which
transport carried it). Both are ``pdd_probe.worker``; this module builds their specs
and merges their answers into a ``ProbeResult``. ``run_local_probe`` runs both on this machine
(CLI ``probe loopback``, the benchmark, the tests); the sidecar runs the two halves in two pods
(``pdd_sidecar.probe_service``).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, get_args

from pdd_contract.env import KvOperation, KvPeerBoundary
from pdd_contract.probe_result import ProbeResult, classify_probe
from pdd_probe import boundary

__all__ = [
    "DEFAULT_BLOCK_SIZES",
    "LINK_CONCURRENCY",
    "ProbeResult",
    "ProbeSpec",
    "Slot",
    "block_plan",
    "classify_probe",
    "merge_results",
    "run_local_probe",
    "worker_command",
    "worker_env",
]

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
DEFAULT_BLOCK_SIZES = (256 * KIB, 1 * MIB, 4 * MIB, 16 * MIB)
MEMORY_KINDS = ("auto", "DRAM", "VRAM")
# The contract's spellings: what the operator renders and the preflight reads.
OPERATIONS: tuple[str, ...] = get_args(KvOperation)
BOUNDARIES: tuple[str, ...] = get_args(KvPeerBoundary)
MAX_BYTES_PER_SIZE = 4 * GIB  # a probe must never take a GPU's memory from the engine
MAX_CONCURRENCY = 32
# Requests in flight that reached the link between two H200 over NVLink (4 and 8 alike,
# 16 no better; docs/benchmarks.md): what a probe that must measure the link uses.
LINK_CONCURRENCY = 8
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)
# Workers prefix their JSON lines with this; UCX and NIXL may print other lines to stdout.
MARKER = "@@pdd-probe "
VERIFY_TAG = b"pdd-probe-verify:"


@dataclass
class ProbeSpec:
    """What to move: for each block size, ``bytes_per_size`` worth of blocks (at least one).
    Memory: the largest slot on the initiator, the sum of all slots on the target."""

    # "auto": GPU memory when the worker process has torch with CUDA, else host memory.
    src_mem: str = "auto"
    dst_mem: str = "auto"
    block_sizes: list[int] = field(default_factory=lambda: list(DEFAULT_BLOCK_SIZES))
    bytes_per_size: int = 32 * MIB
    iterations: int = 3
    src_device: int = 0
    dst_device: int = 0
    timeout_s: float = 120.0
    seed: int = 1
    # Transfer requests kept in flight at once. UCX's cuda_ipc transport runs every copy of one
    # UCX worker to one peer GPU on a single CUDA stream, so one request cannot fill NVLink;
    # each request here is bound to its own UCX worker (NIXL ``num_workers``) and stream.
    concurrency: int = 1
    # NIXL's UCX thread pool (``num_threads``): splits one request over that many threads,
    # each with its own worker. 0 keeps NIXL's default single progress thread.
    nixl_threads: int = 0
    # Descriptors per thread's share of a request (NIXL ``split_batch_size``) with
    # ``nixl_threads``; 0 keeps NIXL's default, which is what the engines run with (neither
    # vLLM nor SGLang sets it), 1 spreads every descriptor.
    nixl_split_batch: int = 1
    # The engine's direction: "WRITE" (the initiator pushes into the target: SGLang, vLLM's
    # push connector) or "READ" (the initiator pulls from the target: vLLM's NixlConnector,
    # where decode reads prefill's KV). The bytes always go from the KV's owner to its user.
    operation: str = "WRITE"
    # "pod": the target runs beyond a pod boundary of its own (``pdd_probe.boundary``), as the
    # peer pod's engine does; "none": both in this pod's namespaces (one pod, or hostPID).
    peer_boundary: str = "none"

    def validate(self) -> None:
        for mem in (self.src_mem, self.dst_mem):
            if mem not in MEMORY_KINDS:
                raise ValueError(f"memory kind must be one of {MEMORY_KINDS}, not {mem!r}")
        if not self.block_sizes or any(s <= 0 for s in self.block_sizes):
            raise ValueError("block_sizes must be positive")
        if not 0 < self.bytes_per_size <= MAX_BYTES_PER_SIZE:
            raise ValueError(f"bytes_per_size must be in (0, {MAX_BYTES_PER_SIZE}]")
        if max(self.block_sizes) > MAX_BYTES_PER_SIZE:
            raise ValueError(f"block sizes must be at most {MAX_BYTES_PER_SIZE}")
        if self.iterations < 1 or self.timeout_s <= 0:
            raise ValueError("iterations and timeout_s must be positive")
        if not 1 <= self.concurrency <= MAX_CONCURRENCY:
            raise ValueError(f"concurrency must be in [1, {MAX_CONCURRENCY}]")
        if not 0 <= self.nixl_threads <= MAX_CONCURRENCY:
            raise ValueError(f"nixl_threads must be in [0, {MAX_CONCURRENCY}]")
        if self.nixl_split_batch < 0:
            raise ValueError("nixl_split_batch must be 0 (NIXL's default) or positive")
        if self.operation not in OPERATIONS:
            raise ValueError(f"operation must be one of {OPERATIONS}, not {self.operation!r}")
        if self.peer_boundary not in BOUNDARIES:
            raise ValueError(f"peer_boundary must be one of {BOUNDARIES}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProbeSpec:
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown probe fields: {sorted(unknown)}")
        spec = cls(**dict(data))
        spec.validate()
        return spec

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def target_spec(self, agent_name: str) -> dict[str, Any]:
        return {
            "agent_name": agent_name,
            "mem": self.dst_mem,
            "device": self.dst_device,
            "region_bytes": region_bytes(block_plan(self.block_sizes, self.bytes_per_size)),
            "timeout_s": self.timeout_s,
            # A READ's source: the target lays the KV out before the initiator pulls it.
            "operation": self.operation,
            "block_sizes": list(self.block_sizes),
            "bytes_per_size": self.bytes_per_size,
            "seed": self.seed,
        }

    def initiator_spec(self, agent_name: str, target: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "agent_name": agent_name,
            "mem": self.src_mem,
            "device": self.src_device,
            "block_sizes": list(self.block_sizes),
            "bytes_per_size": self.bytes_per_size,
            "iterations": self.iterations,
            "seed": self.seed,
            "timeout_s": self.timeout_s,
            "concurrency": self.concurrency,
            "nixl_threads": self.nixl_threads,
            "nixl_split_batch": self.nixl_split_batch,
            "operation": self.operation,
            "peer_boundary": self.peer_boundary,
            "target": dict(target),
        }


@dataclass(frozen=True)
class Slot:
    """Where the blocks of one size live in the target region."""

    block_size: int
    count: int
    offset: int

    @property
    def nbytes(self) -> int:
        return self.block_size * self.count


def block_plan(block_sizes: Sequence[int], bytes_per_size: int) -> list[Slot]:
    """One slot per block size, back to back, each ``bytes_per_size`` rounded down to whole
    blocks (at least one)."""
    slots, offset = [], 0
    for size in block_sizes:
        count = max(1, bytes_per_size // size)
        slots.append(Slot(size, count, offset))
        offset += size * count
    return slots


def region_bytes(plan: Sequence[Slot]) -> int:
    return sum(slot.nbytes for slot in plan)


def new_agent_name(role: str) -> str:
    return f"pdd-probe-{role}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def worker_command(role: str, peer_boundary: str = "none") -> list[str]:
    """The worker's command line; beyond the boundary the other pod's process would be."""
    argv = [sys.executable, "-m", "pdd_probe.worker", role]
    if peer_boundary == "none":
        return argv
    return boundary.command(argv, **_kept_namespaces(peer_boundary))


def _kept_namespaces(peer_boundary: str) -> dict[str, bool]:
    host_pid = peer_boundary in ("host-pid", "host-pid-ipc")
    return {"keep_pid": host_pid, "keep_ipc": peer_boundary == "host-pid-ipc"}


@dataclass(frozen=True)
class TargetLaunch:
    """How the target runs beyond ``peer_boundary``: in namespaces of its own, or, where this
    process may not make them (``refused`` says why), here with ``env``'s UCX_TLS kept to the
    transports that cross the boundary (``boundary.crossing_tls``)."""

    peer_boundary: str
    env: Mapping[str, str]
    refused: str = ""

    @classmethod
    def plan(cls, peer_boundary: str, env: Mapping[str, str]) -> TargetLaunch:
        if peer_boundary == "none":
            return cls(peer_boundary, env)
        refused = boundary.refusal(**_kept_namespaces(peer_boundary))
        if not refused:
            return cls(peer_boundary, env)
        tls = boundary.crossing_tls(env.get("UCX_TLS", ""), peer_boundary)
        # An empty UCX_TLS is an error to UCX: nothing to take out leaves the variable as is.
        return cls("none", {**env, "UCX_TLS": tls} if tls else dict(env), refused)

    @property
    def emulation(self) -> str:
        """For the result: how the boundary was emulated ("": it was not)."""
        if not self.refused:
            return ""
        tls = self.env.get("UCX_TLS") or "all (nothing stopped)"
        return f"UCX_TLS={tls} (namespaces refused: {self.refused})"


def worker_env(
    extra_paths: Sequence[str] = (), base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The caller's environment (UCX_* included: the probe must see what the engine sees) with
    this package importable."""
    env = dict(os.environ if base is None else base)
    paths = [
        _PACKAGE_ROOT,
        *extra_paths,
        *filter(None, env.get("PYTHONPATH", "").split(os.pathsep)),
    ]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def merge_results(initiator: Mapping[str, Any], target: Mapping[str, Any] | None) -> ProbeResult:
    """The initiator measured; only the target can say whether the bytes arrived intact."""
    result = ProbeResult.from_dict(initiator)
    if target is None:
        result.verified = False
        result.error = result.error or "the target never reported what it received"
        return result
    # A WRITE is checked where it landed; a READ where it arrived, and the target confirms
    # that its source was left intact.
    read_ok = bool(initiator.get("read_verified")) if result.operation == "READ" else True
    result.verified = bool(target.get("verified")) and read_ok and not result.error
    if not result.error and target.get("error") and target.get("error") != "digest mismatch":
        result.error = f"target: {target['error']}"
    return result


def run_local_probe(
    spec: ProbeSpec,
    extra_paths: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> ProbeResult:
    """Target and initiator as two processes on this machine; always returns a result."""
    spec.validate()
    child_env = worker_env(extra_paths, env)
    launch = TargetLaunch.plan(spec.peer_boundary, child_env)
    deadline = time.monotonic() + spec.timeout_s + 30
    with (
        _Worker("target", launch.env, launch.peer_boundary) as target,
        _Worker("initiator", child_env) as initiator,
    ):
        try:
            target.send(spec.target_spec(new_agent_name("target")))
            ready = target.read_event("ready", deadline)
            ready.pop("event", None)
            initiator.send(spec.initiator_spec(new_agent_name("initiator"), ready))
            measured = initiator.read_event("result", deadline)
            verdict = target.read_event("verified", deadline) if not measured.get("error") else None
        except (TimeoutError, RuntimeError) as exc:
            return ProbeResult(
                path=f"{spec.src_mem}->{spec.dst_mem}",
                block_sizes=list(spec.block_sizes),
                operation=spec.operation,
                peer_boundary=spec.peer_boundary,
                boundary_emulation=launch.emulation,
                error=f"{exc}; {target.stderr_tail()} {initiator.stderr_tail()}".strip(),
            )
        if measured.get("error"):
            # What the other side said is often the cause (a crash, a refused memory key).
            measured["error"] = f"{measured['error']}; {target.stderr_tail()}".strip("; ")
    result = merge_results(measured, verdict)
    result.peer_boundary = spec.peer_boundary
    result.boundary_emulation = launch.emulation
    return result


class _Worker:
    """One probe worker subprocess speaking JSON lines; killed on exit from the block."""

    def __init__(self, role: str, env: Mapping[str, str], peer_boundary: str = "none") -> None:
        self.role = role
        self._buffer = b""
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed in __exit__
        self._proc = subprocess.Popen(
            worker_command(role, peer_boundary),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=dict(env),
        )

    def __enter__(self) -> _Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()  # a target still waiting: it keeps its log and tidies up
            try:
                self._proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._proc.wait(timeout=10)
        for stream in (self._proc.stdin, self._proc.stdout):
            if stream:
                stream.close()
        self._stderr.close()

    def send(self, document: Mapping[str, Any]) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(document).encode() + b"\n")
        self._proc.stdin.flush()

    def read_event(self, event: str, deadline: float) -> dict[str, Any]:
        while True:
            text = self._readline(deadline).decode(errors="replace")
            if text.startswith(MARKER):
                document: dict[str, Any] = json.loads(text[len(MARKER) :])
                if document.get("event") == event:
                    return document

    def _readline(self, deadline: float) -> bytes:
        """A line from the worker's stdout, without blocking past the deadline."""
        assert self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            readable, _, _ = select.select([fd], [], [], max(remaining, 0))
            if not readable:
                raise TimeoutError(f"the probe {self.role} did not answer in time")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise RuntimeError(f"probe {self.role} exited (rc={self._proc.wait()})")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def stderr_tail(self, limit: int = 800) -> str:
        self._stderr.seek(0)
        tail = self._stderr.read().decode(errors="replace")[-limit:].strip()
        return f"[{self.role} stderr: {tail}]" if tail else ""
