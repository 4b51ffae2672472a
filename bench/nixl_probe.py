#!/usr/bin/env python3
"""NIXL transfer probe on one machine, beside a plain copy of the same bytes as the baseline.

On a GPU machine: VRAM->VRAM, DRAM->VRAM and VRAM->DRAM through the probe (two processes,
NIXL + UCX, as between a prefill and a decode engine), and torch ``copy_`` in one process
(device-to-device, and host<->device from pinned memory). On a machine without CUDA: DRAM->DRAM
against a numpy copy (a smoke test of the same code path).

    PYTHONPATH=operator python3 bench/nixl_probe.py --out bench/results/nixl-probe

Writes ``nixl_probe.json`` and ``nixl_probe.md`` into ``--out``. NIXL is imported only in the
probe's worker processes; ``--site`` (default /tmp/site, if present) is added to their path and
to this one's, for a wheel installed with ``pip install --target``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

KIB, MIB = 1 << 10, 1 << 20
# From the engines' per-layer KV descriptors (a few KiB to a few hundred KiB, see
# pdd_operator.planning.kv_layout) up to what a contiguous KV region moves in one go.
GPU_BLOCK_SIZES = "4K,16K,64K,256K,1M,4M,16M,64M"
CPU_BLOCK_SIZES = "256K,1M,4M,16M"
GPU_PATHS = "VRAM-VRAM,DRAM-VRAM,VRAM-DRAM"
CPU_PATHS = "DRAM-DRAM"


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    extra_paths = [args.site] if args.site and os.path.isdir(args.site) else []
    sys.path[:0] = extra_paths
    from pdd_probe.probe import ProbeSpec, block_plan, run_local_probe

    torch = _cuda_torch()
    on_gpu = torch is not None
    paths = [
        tuple(p.split("-")) for p in (args.paths or (GPU_PATHS if on_gpu else CPU_PATHS)).split(",")
    ]
    sizes = parse_sizes(args.block_sizes or (GPU_BLOCK_SIZES if on_gpu else CPU_BLOCK_SIZES))
    per_size = args.bytes_per_size or (512 * MIB if on_gpu else 16 * MIB)
    iterations = args.iterations or (10 if on_gpu else 2)
    configs = [
        (int(c), int(t)) for c in args.concurrency.split(",") for t in args.nixl_threads.split(",")
    ]
    rows: list[dict[str, Any]] = []
    probes: list[dict[str, Any]] = []
    baselines: dict[tuple[str, str, int], dict[str, Any]] = {}
    document = {
        "command": " ".join(
            ["python3", "bench/nixl_probe.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "machine": _machine(torch),
        "spec": {
            "block_sizes": sizes,
            "bytes_per_size": per_size,
            "iterations": iterations,
            "src_device": args.src_device,
            "dst_device": args.dst_device,
        },
        "rows": rows,
        "probes": probes,
    }
    for src, dst in paths:
        for concurrency, threads in configs:
            spec = ProbeSpec(
                src_mem=src, dst_mem=dst, block_sizes=sizes, bytes_per_size=per_size,
                iterations=iterations, src_device=args.src_device, dst_device=args.dst_device,
                timeout_s=args.timeout, concurrency=concurrency, nixl_threads=threads,
            )  # fmt: skip
            print(f"probe {src}->{dst} concurrency={concurrency} threads={threads} ...",
                  file=sys.stderr, flush=True)  # fmt: skip
            result = run_local_probe(spec, extra_paths=extra_paths).to_dict()
            result.update(concurrency=concurrency, nixl_threads=threads)
            probes.append(result)
            measured = {b["block_size"]: b for b in result["per_block_size"]}
            for slot in block_plan(sizes, per_size):
                key = (src, dst, slot.block_size)
                if key not in baselines:
                    baselines[key] = _baseline(
                        torch, src, dst, slot.block_size, slot.count, iterations, args
                    )
                baseline = baselines[key]
                nixl = measured.get(slot.block_size, {}).get("gbps")
                rows.append(
                    {
                        "path": f"{src}->{dst}",
                        "concurrency": concurrency,
                        "nixl_threads": threads,
                        "block_size": slot.block_size,
                        "blocks": slot.count,
                        "nixl_gbps": nixl,
                        "transport": result["transport"],
                        "verified": result["verified"],
                        "error": result["error"],
                        **baseline,
                        "nixl_vs_contiguous": round(nixl / baseline["copy_contiguous_gbps"], 3)
                        if nixl and baseline["copy_contiguous_gbps"]
                        else None,
                    }
                )
            _write(Path(args.out), document)  # a run cut short keeps what it measured
    print((Path(args.out) / "nixl_probe.md").read_text())
    failed = [p for p in probes if p["error"] or not p["verified"]]
    return 1 if failed else 0


def _write(out: Path, document: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "nixl_probe.json").write_text(json.dumps(document, indent=1) + "\n")
    (out / "nixl_probe.md").write_text(_markdown(document))


def parse_sizes(text: str) -> list[int]:
    """``4K,1M`` -> bytes."""
    units = {"K": KIB, "M": MIB, "G": 1 << 30}
    sizes = []
    for item in filter(None, (s.strip().upper() for s in text.split(","))):
        scale = units.get(item[-1], 1)
        sizes.append(int(item.rstrip("KMG")) * scale)
    return sizes


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--site", default="/tmp/site", help="extra sys.path entry (nixl wheel)")
    parser.add_argument("--paths", default="", help=f"default {GPU_PATHS} (GPU), {CPU_PATHS}")
    parser.add_argument("--block-sizes", default="", help=f"default {GPU_BLOCK_SIZES} (GPU)")
    parser.add_argument("--bytes-per-size", type=int, default=0, help="default 512 MiB GPU, 16 CPU")
    parser.add_argument("--iterations", type=int, default=0, help="default 10 GPU, 2 CPU")
    parser.add_argument("--concurrency", default="8", help="requests in flight, a list: 1,4,8")
    parser.add_argument("--nixl-threads", default="0", help="NIXL UCX thread pool sizes: 0,8")
    parser.add_argument("--src-device", type=int, default=0)
    parser.add_argument("--dst-device", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=300.0)
    return parser.parse_args(argv)


def _cuda_torch() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


# -- baselines: the same bytes, the same block layout, one process, no NIXL ------------------


def _baseline(
    torch: Any, src: str, dst: str, size: int, count: int, iterations: int, args: Any
) -> dict[str, Any]:
    if torch is None:
        return _numpy_baseline(size, count, iterations)
    result = _torch_baseline(torch, src, dst, size, count, iterations, args)
    torch.cuda.empty_cache()  # give the buffers back before the next probe allocates
    return result


def _numpy_baseline(size: int, count: int, iterations: int) -> dict[str, Any]:
    import numpy as np

    src = np.ones(size * count, dtype=np.uint8)
    dst = np.zeros_like(src)
    order = np.random.default_rng(1).permutation(count)

    def per_block() -> None:
        for i in range(count):
            j = int(order[i])
            dst[j * size : (j + 1) * size] = src[i * size : (i + 1) * size]

    def contiguous() -> None:
        np.copyto(dst, src)

    return {
        "copy": "numpy slice copy",
        "copy_gbps": _rate(per_block, size * count, iterations, lambda: None),
        "copy_contiguous_gbps": _rate(contiguous, size * count, iterations, lambda: None),
    }


def _torch_baseline(
    torch: Any, src: str, dst: str, size: int, count: int, iterations: int, args: Any
) -> dict[str, Any]:
    nbytes = size * count

    def alloc(mem: str, device: int) -> Any:
        if mem == "VRAM":
            return torch.ones(nbytes, dtype=torch.uint8, device=f"cuda:{device}")
        return torch.ones(nbytes, dtype=torch.uint8, pin_memory=True)

    a, b = alloc(src, args.src_device), alloc(dst, args.dst_device)
    order = torch.randperm(count, generator=torch.Generator().manual_seed(1)).tolist()

    def per_block() -> None:
        for i in range(count):
            j = order[i]
            b[j * size : (j + 1) * size].copy_(a[i * size : (i + 1) * size], non_blocking=True)

    def contiguous() -> None:
        b.copy_(a, non_blocking=True)

    # A copy between two GPUs is queued on one device's stream and runs on the other's too:
    # the clock stops only when every device that took part is idle.
    devices = sorted({args.src_device, args.dst_device})

    def sync() -> None:
        for device in devices:
            torch.cuda.synchronize(device)

    return {
        "copy": "torch copy_ (pinned host)" if "DRAM" in (src, dst) else "torch copy_",
        "copy_gbps": _rate(per_block, nbytes, iterations, sync),
        "copy_contiguous_gbps": _rate(contiguous, nbytes, iterations, sync),
    }


def _rate(step: Any, nbytes: int, iterations: int, sync: Any) -> float:
    step()  # warm-up
    sync()
    start = time.perf_counter()
    for _ in range(iterations):
        step()
    sync()
    return round(nbytes * iterations / (time.perf_counter() - start) / 1e9, 3)


# -- report ------------------------------------------------------------------------------------


def _machine(torch: Any) -> dict[str, Any]:
    info: dict[str, Any] = {
        "host": platform.node(),
        "python": platform.python_version(),
        "ucx_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(("UCX_", "NIXL_"))},
        "gpu_topology": _gpu_topology(),
        "nixl": {},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    for dist in ("nixl", "nixl-cu12", "nixl-cu13"):
        try:
            info["nixl"][dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    if torch is not None:
        info["torch"] = torch.__version__
        info["cuda"] = torch.version.cuda
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def _gpu_topology() -> str:
    """``nvidia-smi topo -m``: how the GPUs are linked (NV18 = 18 NVLinks), where there is one."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip()


def _markdown(document: dict[str, Any]) -> str:
    machine = document["machine"]
    lines = [
        "# NIXL transfer probe vs. a plain copy",
        "",
        f"Host `{machine['host']}`, GPUs: {', '.join(machine.get('gpus', [])) or 'none'}, "
        f"NIXL {machine['nixl'] or 'unknown'}, UCX env {machine['ucx_env'] or '{}'}. "
        f"{document['spec']['bytes_per_size'] // MIB} MiB per block size, "
        f"{document['spec']['iterations']} iterations. GB/s = 10^9 bytes/s.",
        "",
        "| path | requests in flight | NIXL threads | block | blocks | NIXL GB/s | transport "
        "| copy | copy GB/s (same blocks) | copy GB/s (contiguous) | NIXL / contiguous "
        "| verified |",
        "|---|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---|",
    ]
    for row in document["rows"]:
        block = f"{row['block_size'] // KIB} KiB" if row["block_size"] < MIB else (
            f"{row['block_size'] // MIB} MiB"
        )  # fmt: skip
        lines.append(
            f"| {row['path']} | {row['concurrency']} | {row['nixl_threads']} | {block} "
            f"| {row['blocks']} | {_num(row['nixl_gbps'])} "
            f"| {row['transport']} | {row['copy']} | {_num(row['copy_gbps'])} "
            f"| {_num(row['copy_contiguous_gbps'])} | {_num(row['nixl_vs_contiguous'])} "
            f"| {'yes' if row['verified'] else 'NO: ' + str(row['error'])} |"
        )
    return "\n".join(lines) + "\n"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    sys.exit(main())
