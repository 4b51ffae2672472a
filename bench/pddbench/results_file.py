"""One place that reads and writes a run's raw results: gzip-compressed JSON.

The raw per-second series of a full run are tens of thousands of lines; in git they live
compressed, and the summary (``summary.md``, plots) is what the docs cite.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

NAME = "results.json.gz"


def load(path: Path) -> dict[str, Any]:
    """A run's results from ``results.json.gz`` (or a plain ``results.json`` given by name)."""
    raw = path.read_bytes()
    text = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    document: dict[str, Any] = json.loads(text)
    return document


def median_view(run: dict[str, Any]) -> dict[str, Any]:
    """A run as the tables and plots read it: the arms (``operator``, ``direct``) and
    ratios of its median pair at the top level. A run from before pairs is as it was."""
    pairs = run.get("pairs")
    if not pairs:
        return run
    return {**run, **pairs[int(run.get("median_pair", 0))]}


def save(path: Path, results: dict[str, Any]) -> None:
    """Write atomically, so an interrupted run never leaves half a file behind."""
    tmp = path.with_name(path.name + ".tmp")
    payload = json.dumps(results, separators=(",", ":"), default=str).encode()
    tmp.write_bytes(gzip.compress(payload, mtime=0))
    tmp.replace(path)
