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
import sys
import time
from pathlib import Path
from typing import Any

KIB, MIB = 1 << 10, 1 << 20
BLOCK_SIZES = [256 * KIB, 1 * MIB, 4 * MIB, 16 * MIB]
GPU_PATHS = [("VRAM", "VRAM"), ("DRAM", "VRAM"), ("VRAM", "DRAM")]
CPU_PATHS = [("DRAM", "DRAM")]


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    extra_paths = [args.site] if args.site and os.path.isdir(args.site) else []
    sys.path[:0] = extra_paths
    from pdd_sidecar.probe import ProbeSpec, block_plan, run_local_probe

    torch = _cuda_torch()
    paths = GPU_PATHS if torch is not None else CPU_PATHS
    per_size = args.bytes_per_size or (256 * MIB if torch is not None else 16 * MIB)
    iterations = args.iterations or (10 if torch is not None else 2)
    rows, probes = [], []
    for src, dst in paths:
        spec = ProbeSpec(
            src_mem=src, dst_mem=dst, block_sizes=BLOCK_SIZES, bytes_per_size=per_size,
            iterations=iterations, src_device=args.src_device, dst_device=args.dst_device,
            timeout_s=args.timeout,
        )  # fmt: skip
        print(f"probe {src}->{dst} ...", file=sys.stderr, flush=True)
        result = run_local_probe(spec, extra_paths=extra_paths).to_dict()
        probes.append(result)
        measured = {b["block_size"]: b for b in result["per_block_size"]}
        for slot in block_plan(BLOCK_SIZES, per_size):
            baseline = _baseline(torch, src, dst, slot.block_size, slot.count, iterations, args)
            nixl = measured.get(slot.block_size, {}).get("gbps")
            rows.append(
                {
                    "path": f"{src}->{dst}",
                    "block_size": slot.block_size,
                    "blocks": slot.count,
                    "nixl_gbps": nixl,
                    "transport": result["transport"],
                    "verified": result["verified"],
                    "error": result["error"],
                    **baseline,
                    "nixl_vs_copy": round(nixl / baseline["copy_gbps"], 3)
                    if nixl and baseline["copy_gbps"]
                    else None,
                }
            )
    document = {
        "machine": _machine(torch),
        "spec": {"block_sizes": BLOCK_SIZES, "bytes_per_size": per_size, "iterations": iterations},
        "rows": rows,
        "probes": probes,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "nixl_probe.json").write_text(json.dumps(document, indent=2) + "\n")
    (out / "nixl_probe.md").write_text(_markdown(document))
    print((out / "nixl_probe.md").read_text())
    failed = [p for p in probes if p["error"] or not p["verified"]]
    return 1 if failed else 0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--site", default="/tmp/site", help="extra sys.path entry (nixl wheel)")
    parser.add_argument("--bytes-per-size", type=int, default=0, help="default 256 MiB GPU, 16 CPU")
    parser.add_argument("--iterations", type=int, default=0, help="default 10 GPU, 2 CPU")
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

    sync = torch.cuda.synchronize
    result = {
        "copy": "torch copy_ (pinned host)" if "DRAM" in (src, dst) else "torch copy_",
        "copy_gbps": _rate(per_block, nbytes, iterations, sync),
        "copy_contiguous_gbps": _rate(contiguous, nbytes, iterations, sync),
    }
    return result


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
        "ucx_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("UCX_")},
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
        "| path | block | blocks | NIXL GB/s | transport | copy | copy GB/s (same blocks) "
        "| copy GB/s (contiguous) | NIXL / copy | verified |",
        "|---|---:|---:|---:|---|---|---:|---:|---:|---|",
    ]
    for row in document["rows"]:
        block = f"{row['block_size'] // KIB} KiB" if row["block_size"] < MIB else (
            f"{row['block_size'] // MIB} MiB"
        )  # fmt: skip
        lines.append(
            f"| {row['path']} | {block} | {row['blocks']} | {_num(row['nixl_gbps'])} "
            f"| {row['transport']} | {row['copy']} | {_num(row['copy_gbps'])} "
            f"| {_num(row['copy_contiguous_gbps'])} | {_num(row['nixl_vs_copy'])} "
            f"| {'yes' if row['verified'] else 'NO: ' + str(row['error'])} |"
        )
    return "\n".join(lines) + "\n"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    sys.exit(main())
