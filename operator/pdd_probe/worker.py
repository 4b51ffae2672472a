"""The two NIXL processes of the transfer probe: a target that registers memory and checks
what arrived, and an initiator that WRITEs a KV-like block mix into it, or READs one out of it
(the direction of the engine's connector), and times it.

Each runs in its own process (``python -m pdd_probe.worker target|initiator``) so that
the UCX environment is read fresh, exactly as the engine's would be, and so that NIXL's blocking
calls never run inside the sidecar's event loop. A process reads one JSON document (its spec) on
stdin, because agent metadata is secret and must not appear in ``ps`` output, and answers with
JSON lines on stdout prefixed by ``MARKER``; anything else on stdout (UCX, NIXL) is ignored by
the reader.

The target region holds one slot per block size (``probe.block_plan``). Blocks land in a
permuted order, as paged KV blocks do, so NIXL cannot merge them into one large copy; the
initiator sends the digest of the layout it expects and the target compares it with what is in
its memory. For a READ the target lays the blocks out first and the initiator checks what it
pulled; the target then confirms its source was left as it was.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import hashlib
import importlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pdd_contract.env import UCX_NET_DEVICES, UCX_TLS
from pdd_probe.cuda import CudaDriver, CudaError, DeviceMemory
from pdd_probe.probe import MARKER, VERIFY_TAG, Slot, block_plan, region_bytes

# The UCX protocol table that serves each NIXL operation.
UCX_OPERATIONS = {"WRITE": "remote memory write", "READ": "remote memory read"}
# Spin on a transfer this long before backing off: sleeping while a 50 GB/s transfer of a few
# milliseconds completes would add the oversleep to the measurement.
_POLL_SPIN_S = 0.05


@dataclass
class Buffer:
    """A region NIXL can register: host memory (numpy) or GPU memory (CUDA driver API)."""

    mem: str  # "DRAM" | "VRAM"
    addr: int
    nbytes: int
    device: int
    _keep: np.ndarray | DeviceMemory  # what owns the memory

    def write(self, data: np.ndarray) -> None:
        if isinstance(self._keep, np.ndarray):
            self._keep[:] = data
        else:
            self._keep.write(data)

    def host_copy(self) -> np.ndarray:
        if isinstance(self._keep, np.ndarray):
            return self._keep
        return self._keep.read()


def resolve_memory_kind(mem: str) -> str:
    """``auto``: VRAM when this process has a GPU (KV caches live there), else DRAM."""
    if mem != "auto":
        return mem
    try:
        return "VRAM" if CudaDriver().device_count() > 0 else "DRAM"
    except CudaError:
        return "DRAM"


def allocate(mem: str, nbytes: int, device: int = 0) -> Buffer:
    """Zeroed memory of the given kind."""
    mem = resolve_memory_kind(mem)
    if mem == "DRAM":
        array = np.zeros(nbytes, dtype=np.uint8)
        return Buffer("DRAM", array.ctypes.data, nbytes, 0, array)
    if mem == "VRAM":
        memory = CudaDriver().allocate(nbytes, device)
        return Buffer("VRAM", memory.addr, nbytes, device, memory)
    raise ValueError(f"unknown memory kind {mem!r} (DRAM or VRAM)")


def permutation(count: int, seed: int) -> np.ndarray:
    """Where local block i lands remotely: a fixed shuffle, like a paged KV block table."""
    return np.random.default_rng(seed).permutation(count)


def pattern(nbytes: int, seed: int) -> np.ndarray:
    """Reproducible random bytes, writable."""
    return np.frombuffer(bytearray(np.random.default_rng(seed).bytes(nbytes)), dtype=np.uint8)


def expected_digest(src: np.ndarray, plan: list[Slot], seed: int) -> str:
    """Digest of the target region after every slot was written once."""
    digest = hashlib.blake2b(digest_size=16)
    for k, slot in enumerate(plan):
        inverse = np.argsort(permutation(slot.count, seed + k))
        size = slot.block_size
        for j in range(slot.count):
            i = int(inverse[j])
            digest.update(src[i * size : (i + 1) * size].data)
    return digest.hexdigest()


def region_digest(buf: Buffer, nbytes: int) -> str:
    return hashlib.blake2b(buf.host_copy()[:nbytes].data, digest_size=16).hexdigest()


def emit(event: str, **fields: Any) -> None:
    sys.stdout.write(MARKER + json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def nixl_api() -> Any:
    """``nixl._api``, or a backend wheel's own module when the ``nixl`` meta package is absent
    or picks a CUDA major version whose wheel is not installed."""
    try:
        return importlib.import_module("nixl._api")
    except ImportError:
        for backend in ("nixl_cu13", "nixl_cu12"):
            with contextlib.suppress(ImportError):
                return importlib.import_module(f"{backend}._api")
        raise


def make_agent(
    name: str,
    workers: int = 1,
    threads: int = 0,
    split_batch: int = 1,
    progress_thread: bool = True,
) -> Any:
    """A NIXL agent with a UCX backend of ``workers`` UCX workers (one per request in flight)
    and, with ``threads``, NIXL's UCX thread pool splitting every request over them in shares
    of ``split_batch`` descriptors (0: NIXL's default share, as the engines run it).

    ``progress_thread``: NIXL's own thread progressing the UCX workers, as the engines run it.
    NIXL's Python API starts it without a pause between its polls (``pthrDelay`` 0), which
    keeps half a core busy per idle agent; without it, the workers progress whenever the
    caller checks a transfer's state or asks for notifications."""
    api = nixl_api()
    config = api.nixl_agent_config(enable_prog_thread=progress_thread, backends=[])
    agent = api.nixl_agent(name, config)
    params = {"num_workers": str(max(1, workers))}
    if threads:
        params["num_threads"] = str(threads)
    if threads and split_batch:
        params["split_batch_size"] = str(split_batch)
    agent.create_backend("UCX", params)
    return agent


def progress_thread_for(buf: Buffer) -> bool:
    """NIXL's progress thread where the KV is in GPU memory, as the engines run it. In host
    memory the probe measures the CPU pods' lane (TCP), whose engine is the reference engine,
    and moves the KV as it does (pdd_refengine.kvcache): the caller's own polls progress NIXL
    (``wait_for``), instead of a thread that spins a core for as long as the agent lives."""
    return buf.mem == "VRAM"


def register(agent: Any, buf: Buffer) -> Any:
    return agent.register_memory([(buf.addr, buf.nbytes, buf.device, "")], buf.mem)


def wait_for(done: Callable[[], bool], deadline: float, what: str) -> None:
    """Poll ``done`` with a short spin, then exponential backoff up to 1 ms, until deadline."""
    start = time.perf_counter()
    delay = 0.0
    while not done():
        now = time.perf_counter()
        if now > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        if now - start > _POLL_SPIN_S:
            delay = min(max(delay * 2, 50e-6), 1e-3)
            time.sleep(delay)


def run_target(spec: dict[str, Any]) -> int:
    """Register a region, publish it, then compare what is in it with the digest sent: what
    arrived (WRITE), or the source left intact (READ)."""
    deadline = time.perf_counter() + float(spec.get("timeout_s", 120))
    # Memory first: GPU memory needs a CUDA context before UCX looks for cuda transports.
    buf = allocate(spec["mem"], int(spec["region_bytes"]), int(spec.get("device", 0)))
    if spec.get("operation") == "READ":
        lay_out_source(buf, spec)
    agent = make_agent(spec["agent_name"], progress_thread=progress_thread_for(buf))
    register(agent, buf)
    emit(
        "ready",
        agent=spec["agent_name"],
        metadata_b64=base64.b64encode(agent.get_agent_metadata()).decode(),
        addr=buf.addr,
        nbytes=buf.nbytes,
        device=buf.device,
        mem=buf.mem,
    )
    received: list[bytes] = []

    def verify_notif_arrived() -> bool:
        for messages in agent.get_new_notifs().values():
            received.extend(m for m in messages if m.startswith(VERIFY_TAG))
        return bool(received)

    try:
        wait_for(verify_notif_arrived, deadline, "the initiator's verify notification")
    except TimeoutError as exc:
        emit("verified", verified=False, error=str(exc))
        return 1
    expected = received[0][len(VERIFY_TAG) :].decode()
    nbytes, _, digest = expected.partition(":")
    actual = region_digest(buf, int(nbytes))
    ok = actual == digest
    emit("verified", verified=ok, error=None if ok else "digest mismatch")
    return 0


def lay_out_source(buf: Buffer, spec: dict[str, Any]) -> None:
    """The region as a WRITE of the same plan would leave it: slot k holds the pattern's
    blocks at their permuted places, so block i of a READ's destination is block i of the
    pattern."""
    plan = block_plan([int(s) for s in spec["block_sizes"]], int(spec["bytes_per_size"]))
    seed = int(spec.get("seed", 1))
    data = pattern(max(slot.nbytes for slot in plan), seed)
    region = np.zeros(region_bytes(plan), dtype=np.uint8)
    for k, slot in enumerate(plan):
        size, perm = slot.block_size, permutation(slot.count, seed + k)
        blocks = data[: slot.nbytes].reshape(slot.count, size)
        region[slot.offset : slot.offset + slot.nbytes].reshape(slot.count, size)[perm] = blocks
    buf.write(np.concatenate([region, np.zeros(buf.nbytes - region.size, dtype=np.uint8)]))


def run_initiator(spec: dict[str, Any]) -> int:
    """WRITE every block size into the target, or READ it from there, timing only the posted
    transfers."""
    started = time.time()
    t0 = time.perf_counter()
    try:
        result = _initiate(spec)
    except Exception as exc:  # reported as data: the caller turns it into a condition
        result = {
            "error": f"{type(exc).__name__}: {exc}",
            "operation": str(spec.get("operation", "WRITE")),
            "peer_boundary": str(spec.get("peer_boundary", "none")),
        }
    result["started_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))
    result["duration_s"] = round(time.perf_counter() - t0, 3)
    _keep_full_ucx_log("initiator")  # before the caller may kill us
    emit("result", **result)
    return 0 if not result.get("error") else 1


def _initiate(spec: dict[str, Any]) -> dict[str, Any]:
    from pdd_probe.ucx_info import report_for_transfer

    target = spec["target"]
    plan = block_plan([int(s) for s in spec["block_sizes"]], int(spec["bytes_per_size"]))
    iterations = int(spec.get("iterations", 3))
    seed = int(spec.get("seed", 1))
    deadline = time.perf_counter() + float(spec.get("timeout_s", 120))

    operation = str(spec.get("operation", "WRITE"))
    src_bytes = max(slot.nbytes for slot in plan)
    src = allocate(spec["mem"], src_bytes, int(spec.get("device", 0)))
    data = pattern(src_bytes, seed)
    if operation == "WRITE":
        src.write(data)
    read_intact = True
    concurrency = int(spec.get("concurrency", 1))
    threads, split_batch = int(spec.get("nixl_threads", 0)), int(spec.get("nixl_split_batch", 1))
    agent = make_agent(
        spec["agent_name"], concurrency, threads, split_batch, progress_thread_for(src)
    )
    register(agent, src)
    remote = agent.add_remote_agent(base64.b64decode(target["metadata_b64"]))
    agent.make_connection(remote)

    timings = []
    for k, slot in enumerate(plan):
        if operation == "READ":
            src.write(np.zeros(src_bytes, dtype=np.uint8))  # stale bytes must not pass
        seconds = _timed_transfers(
            agent, operation, remote, src, target, slot, seed + k, iterations, concurrency,
            deadline,
        )  # fmt: skip
        if operation == "READ":
            pulled = src.host_copy()[: slot.nbytes]
            read_intact = read_intact and bool(np.array_equal(pulled, data[: slot.nbytes]))
        moved = slot.nbytes * iterations
        timings.append(
            {
                "block_size": slot.block_size,
                "blocks": slot.count,
                "bytes": moved,
                "seconds": seconds,
                "gbps": round(moved / seconds / 1e9, 3),
            }
        )
    digest = expected_digest(data, plan, seed)
    agent.send_notif(remote, VERIFY_TAG + f"{region_bytes(plan)}:{digest}".encode())

    sizes = [slot.block_size for slot in plan]
    ucx_log = _read_ucx_log()
    _keep_ucx_log(ucx_log, f"{operation.lower()}-{src.mem}-{target['mem']}")
    report = report_for_transfer(
        ucx_log, sizes, operation=UCX_OPERATIONS[operation], src_mem=src.mem, dst_mem=target["mem"]
    )
    total_bytes = sum(t["bytes"] for t in timings)
    total_s = sum(t["seconds"] for t in timings)
    return {
        "path": f"{src.mem}->{target['mem']}",
        "transport": report.transport,
        "transports": list(report.transports),
        "lanes": list(report.lanes),
        "devices": list(report.devices),
        "gbps": round(total_bytes / total_s / 1e9, 3),
        "bytes": total_bytes,
        "blocks": sum(slot.count for slot in plan) * iterations,
        "block_sizes": sizes,
        "iterations": iterations,
        "concurrency": concurrency,
        "nixl_threads": int(spec.get("nixl_threads", 0)),
        "nixl_split_batch": int(spec.get("nixl_split_batch", 1)),
        "per_block_size": timings,
        "ucx_tls": os.environ.get(UCX_TLS, ""),
        "ucx_net_devices": os.environ.get(UCX_NET_DEVICES, ""),
        "operation": operation,
        "peer_boundary": str(spec.get("peer_boundary", "none")),
        "emulated": report.emulated,
        "read_verified": read_intact if operation == "READ" else None,
        "error": None,
    }


def _timed_transfers(
    agent: Any,
    operation: str,
    remote: str,
    src: Buffer,
    target: dict[str, Any],
    slot: Slot,
    seed: int,
    iterations: int,
    concurrency: int,
    deadline: float,
) -> float:
    """All blocks of one size, split over ``concurrency`` requests posted together; one untimed
    warm-up round."""
    size, count = slot.block_size, slot.count
    perm = permutation(count, seed)
    base = int(target["addr"]) + slot.offset
    local = np.array(
        [(src.addr + i * size, size, src.device) for i in range(count)], dtype=np.uint64
    )
    remote_descs = np.array(
        [(base + int(perm[i]) * size, size, int(target["device"])) for i in range(count)],
        dtype=np.uint64,
    )
    local_side = agent.prep_xfer_dlist("NIXL_INIT_AGENT", local, src.mem)
    remote_side = agent.prep_xfer_dlist(remote, remote_descs, target["mem"])
    handles = _requests_on_own_workers(
        agent, operation, local_side, remote_side, count, concurrency
    )
    try:
        post_and_wait(agent, handles, deadline)  # warm-up: rkey unpack, lane wire-up
        start = time.perf_counter()
        for _ in range(iterations):
            post_and_wait(agent, handles, deadline)
        return time.perf_counter() - start
    finally:
        for handle in handles:
            handle.release()
        local_side.release()
        remote_side.release()


def _requests_on_own_workers(
    agent: Any, operation: str, local_side: Any, remote_side: Any, count: int, concurrency: int
) -> list[Any]:
    """One request per chunk of the descriptors, each on a UCX worker of its own."""
    chunks = np.array_split(np.arange(count, dtype=np.int32), min(concurrency, count))
    return prepare_on_own_workers(
        agent,
        lambda k: agent.make_prepped_xfer(operation, local_side, chunks[k], remote_side, chunks[k]),
        len(chunks),
    )


def prepare_on_own_workers(agent: Any, prepare: Callable[[int], Any], count: int) -> list[Any]:
    """``prepare(k)`` for k < count, each on a thread of its own. NIXL's UCX backend binds a
    request to the UCX worker of the thread that prepares it (one worker per thread, round
    robin), so this gives each request a worker, and a CUDA stream, of its own: several
    requests in flight is what reaches an NVLink's bandwidth. A failure releases the others."""
    handles: list[Any] = [None] * count
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            handles[k] = prepare(k)
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)

    if count == 1:
        run(0)
    else:
        threads = [threading.Thread(target=run, args=(k,)) for k in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    if errors:
        for handle in filter(None, handles):
            agent.release_xfer_handle(handle)
        raise errors[0]
    return handles


def post_and_wait(agent: Any, handles: list[Any], deadline: float) -> None:
    """Post every request, then wait until all of them are done."""
    pending = []
    for handle in handles:
        state = agent.transfer(handle)
        if state == "ERR":
            raise RuntimeError("NIXL refused to post the transfer")
        if state != "DONE":
            pending.append(handle)

    def finished() -> bool:
        for handle in list(pending):
            current = agent.check_xfer_state(handle)
            if current == "ERR":
                raise RuntimeError("NIXL reported a transfer error")
            if current == "DONE":
                pending.remove(handle)
        return not pending

    if pending:
        wait_for(finished, deadline, "the transfer")


def _keep_ucx_log(text: str, label: str) -> None:
    """With PDD_PROBE_KEEP_UCX_LOG=DIR, keep UCX's protocol tables as evidence (benchmarks)."""
    keep = os.environ.get("PDD_PROBE_KEEP_UCX_LOG", "")
    if keep and text:
        os.makedirs(keep, exist_ok=True)
        with open(os.path.join(keep, f"ucx-proto-{label}.log"), "w", encoding="utf-8") as fh:
            fh.write(text)


def _keep_full_ucx_log(role: str) -> None:
    """The whole UCX log, warnings included, where a benchmark keeps evidence: read only
    then (with UCX_PROTO_INFO it is large, and a probe of the operator's has no use for it)."""
    if os.environ.get("PDD_PROBE_KEEP_UCX_LOG"):
        _keep_ucx_log(_read_ucx_log(), f"{role}-full")


def _read_ucx_log() -> str:
    # UCX writes its log through a buffered C stream: without a flush the last tables (often
    # the very ones for the probed memory types) are still in the process, not in the file.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).fflush(None)
    path = os.environ.get("UCX_LOG_FILE", "")
    if not path or not os.path.exists(path):
        return ""
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read()


def _prepare_ucx_env(role: str) -> str:
    """UCX reads its environment when NIXL creates the backend, i.e. after this runs.

    The initiator asks UCX for its protocol tables (the only reliable record of the transport
    used) in a private log file; the target sends UCX's log to a file too, so nothing can fill
    the stdout pipe its parent stops reading after the ready line.
    """
    log_dir = tempfile.mkdtemp(prefix="pdd-probe-")
    os.environ["UCX_LOG_FILE"] = os.path.join(log_dir, "ucx.log")
    os.environ["UCX_PROTO_INFO"] = "y" if role == "initiator" else "n"
    return log_dir


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in ("target", "initiator"):
        sys.stderr.write("usage: python -m pdd_probe.worker target|initiator < spec.json\n")
        return 2
    spec = json.loads(sys.stdin.readline())
    log_dir = _prepare_ucx_env(args[0])
    # Stopped by the caller (a target still waiting for a transfer that failed): the log is
    # still kept, and the temporary directory removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return run_target(spec) if args[0] == "target" else run_initiator(spec)
    finally:
        if args[0] == "target":
            _keep_full_ucx_log("target")
        shutil.rmtree(log_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
