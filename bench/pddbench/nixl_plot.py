"""The NIXL transfer curve (GB/s over block size) of one or more nixl_probe.json documents,
with the engines' KV descriptor sizes marked."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

KIB = 1 << 10
# One block of one layer of Llama-3.1-70B (8 KV heads x 128 x bf16), pdd_operator.planning.
# kv_layout: vLLM (K and V in one descriptor) at its default 16-token blocks on TP 8 and TP 1
# and at 128-token blocks; SGLang at its default one-token pages (K or V) on TP 1.
ENGINE_MARKS = {"SGLang TP1, page 1": 2 * KIB, "vLLM TP8, block 16": 8 * KIB,
                "vLLM TP1, block 16": 64 * KIB, "vLLM TP1, block 128": 512 * KIB}  # fmt: skip


def plot_curves(documents: list[dict[str, Any]], out: Path) -> Path:
    curves: dict[str, dict[int, float]] = defaultdict(dict)
    contiguous: dict[int, float] = {}
    for document in documents:
        sgl = document["machine"].get("ucx_env", {}).get("NIXL_UCX_SGL_ENABLE") == "y"
        for row in document["rows"]:
            if row["path"] != "VRAM->VRAM" or not row["nixl_gbps"]:
                continue
            label = f"NIXL, {row['concurrency']} request(s) in flight"
            if row["nixl_threads"]:
                label += f", {row['nixl_threads']} NIXL threads"
            if sgl:
                label += ", scatter-gather"
            curves[label][row["block_size"]] = row["nixl_gbps"]
            contiguous[row["block_size"]] = row["copy_contiguous_gbps"]
    fig, ax = plt.subplots(figsize=(8, 5))
    for label, points in sorted(curves.items()):
        sizes = sorted(points)
        ax.plot(sizes, [points[s] for s in sizes], marker="o", label=label)
    sizes = sorted(contiguous)
    ax.plot(sizes, [contiguous[s] for s in sizes], "k--", label="one contiguous copy (torch)")
    for name, size in ENGINE_MARKS.items():
        ax.axvline(size, color="grey", alpha=0.4)
        ax.text(size, 0.6, name, rotation=90, fontsize=7, va="bottom")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("bytes per descriptor (block)")
    ax.set_ylabel("GB/s (10^9 B/s)")
    ax.set_title("GPU0 -> GPU1 over NVLink (2x H200, NV18), NIXL 1.5.1 + UCX cuda_ipc")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main() -> int:
    *inputs, out = sys.argv[1:]
    documents = [json.loads(Path(p).read_text()) for p in inputs]
    print(plot_curves(documents, Path(out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
