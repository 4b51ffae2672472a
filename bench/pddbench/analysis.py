"""Pure helpers: percentiles, RSS drift, prefill->decode pair classes and KV-transfer times,
py-spy profile summaries, Prometheus histogram quantiles."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from pdd_contract.labels import LABEL_DEPLOYMENT, LABEL_ROLE

# The KV cache of a 4,096-token prompt of a 70B-class model (80 layers, 8 KV heads, head dim
# 128, bf16): 2 (K and V) x 80 x 8 x 128 x 2 bytes = 320 KiB per token.
KV_BYTES_PER_TOKEN = 2 * 80 * 8 * 128 * 2
PROMPT_TOKENS = 4096
KV_BYTES = KV_BYTES_PER_TOKEN * PROMPT_TOKENS  # 1.342 GB

# Link speeds (GB/s) from ../shared/DESIGN.md. A prefill and a decode pod on one node are
# separate pods: UCX's cuda_ipc does not cross their PID namespaces (measured on one H200,
# bench/results/issue35-kv-boundary-h200), so their KV takes the RDMA NIC, ~50 GB/s, not
# NVLink. Same NVLink clique, other node: NVLink through fabric handles, ~400 GB/s (the clique
# label names an NVLink domain; not measured here). Anything else crosses a 400 Gb/s RoCE NIC,
# ~50 GB/s; across racks the path adds a spine hop, assumed non-blocking here
# (`SPINE_OVERSUBSCRIBED` is the 2:1 sensitivity case).
LINK_GBPS = {"node": 50.0, "clique": 400.0, "rack": 50.0, "cross-rack": 50.0}
SPINE_OVERSUBSCRIBED = {**LINK_GBPS, "cross-rack": 25.0}
PAIR_CLASSES = ("node", "clique", "rack", "cross-rack")


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank-with-interpolation percentile (numpy's 'linear'); None when empty."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def rss_drift_pct(samples: Sequence[tuple[float, float]], warmup_s: float) -> float | None:
    """RSS growth over a soak, in %: the last (t, RSS) sample against the first one taken
    `warmup_s` or more after the first sample (caches and pools fill first, and that growth
    is not a leak). None without two samples after the warm-up."""
    if not samples:
        return None
    after = [rss for t, rss in samples if t - samples[0][0] >= warmup_s]
    if len(after) < 2 or after[0] <= 0:
        return None
    return round(100.0 * (after[-1] - after[0]) / after[0], 2)


def dist(values: Sequence[float], scale: float = 1.0, digits: int = 3) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    vals = [v * scale for v in values]
    return {
        "n": len(vals),
        "p50": round(percentile(vals, 50) or 0.0, digits),
        "p90": round(percentile(vals, 90) or 0.0, digits),
        "p99": round(percentile(vals, 99) or 0.0, digits),
        "max": round(max(vals), digits),
        "mean": round(sum(vals) / len(vals), digits),
    }


def pair_class(a: tuple[str, str, str], b: tuple[str, str, str]) -> str:
    """a, b: (node, clique, rack)."""
    if a[0] == b[0]:
        return "node"
    if a[1] == b[1]:
        return "clique"
    if a[2] == b[2]:
        return "rack"
    return "cross-rack"


def deployment_pairs(
    pods: Iterable[Mapping[str, Any]], domains: Mapping[str, tuple[str, str]]
) -> dict[str, list[str]]:
    """deployment -> the class of every prefill->decode pod pair (P x D pairs)."""
    by_dep: dict[str, dict[str, list[tuple[str, str, str]]]] = {}
    for pod in pods:
        labels = pod["metadata"].get("labels") or {}
        dep, role = labels.get(LABEL_DEPLOYMENT), labels.get(LABEL_ROLE)
        node = (pod.get("spec") or {}).get("nodeName")
        if not dep or role not in ("prefill", "decode") or not node or node not in domains:
            continue
        clique, rack = domains[node]
        by_dep.setdefault(dep, {"prefill": [], "decode": []})[role].append((node, clique, rack))
    return {
        dep: [pair_class(p, d) for p in roles["prefill"] for d in roles["decode"]]
        for dep, roles in by_dep.items()
    }


def transfer_ms(cls: str, links: Mapping[str, float] = LINK_GBPS) -> float:
    return KV_BYTES / (links[cls] * 1e9) * 1e3


def pair_summary(pairs: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    every = [c for cs in pairs.values() for c in cs]
    n = len(every)
    shares = {c: round(sum(1 for x in every if x == c) / n, 4) if n else 0.0 for c in PAIR_CLASSES}
    times = [transfer_ms(c) for c in every]
    times_os = [transfer_ms(c, SPINE_OVERSUBSCRIBED) for c in every]
    return {
        "pairs": n,
        "deployments": len(pairs),
        "share": shares,
        "share_within_clique": round(shares["node"] + shares["clique"], 4),
        "share_within_rack": round(shares["node"] + shares["clique"] + shares["rack"], 4),
        "kv_transfer_ms": dist(times, digits=2),
        "kv_transfer_ms_spine_2to1": dist(times_os, digits=2),
    }


def fits(groups: Sequence[tuple[int, int]], free: Sequence[int]) -> bool:
    """First-fit decreasing of (gpus per instance, count) groups into nodes' free GPUs."""
    room = sorted(free, reverse=True)
    for size, count in sorted(groups, reverse=True):
        left = count
        for i, r in enumerate(room):
            if not left:
                break
            take = min(left, r // size)
            room[i] -= take * size
            left -= take
        if left:
            return False
    return True


def histogram_quantile(buckets: Sequence[tuple[float, float]], q: float) -> float | None:
    """Prometheus-style quantile from cumulative (le, count) buckets."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] == 0:
        return None
    rank = q * buckets[-1][1]
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return prev_le
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return None


def summarize_profile(raw: str, top: int = 25) -> dict[str, Any]:
    """py-spy `--format raw` (collapsed stacks: `frame;frame;... count`) -> the functions
    with the largest inclusive and self share of samples."""
    inclusive: dict[str, int] = {}
    self_: dict[str, int] = {}
    total = 0
    for stack, count in _stacks(raw):
        total += count
        frames = [_short(f) for f in stack.split(";")]
        # the first frame is the thread (py-spy --threads is off: the process name)
        for f in set(frames):
            inclusive[f] = inclusive.get(f, 0) + count
        self_[frames[-1]] = self_.get(frames[-1], 0) + count

    def ranked(table: dict[str, int]) -> list[dict[str, Any]]:
        rows = sorted(table.items(), key=lambda kv: -kv[1])[:top]
        return [{"frame": f, "samples": c, "share": round(c / total, 4)} for f, c in rows]

    return {"samples": total, "inclusive": ranked(inclusive), "self": ranked(self_)}


def _stacks(raw: str) -> Iterator[tuple[str, int]]:
    """(`frame;frame;...`, sample count) per line of py-spy's `--format raw` output."""
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            yield stack, int(count)


def _short(frame: str) -> str:
    """`func (path/to/module.py:123)` -> `func (module.py)`: lines differ per call site."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    parts = path.split("/")
    short = "/".join(parts[-2:]) if len(parts) > 1 else path
    return f"{name} ({short})"


# Where the operator's samples go, first match wins (frames are `function (file:line)`).
PROFILE_CATEGORIES = (
    # FleetCache.fleet since 7ac4505 (node facts and GPU use of one snapshot); node_facts
    # directly in the runs before it.
    ("reconcile: placement facts (fleet snapshot of Nodes and Pods)",
     ("FleetCache.fleet (", "node_facts (")),
    ("reconcile: plan_placement", ("plan_placement (",)),
    ("reconcile: render + fingerprint children", ("render_children (",)),
    ("reconcile: status computation", ("compute_status (", "rollout_partitions (")),
    # handlers/ was the informers' room in the profiles of runs before 2026-12-06.
    (
        "informers: watch events (JSON decode, summaries)",
        ("informers/listwatch.py", "handlers/listwatch.py"),
    ),
    ("reconcile: API calls (worker threads: JSON, TLS, HTTP)", ("kube/client.py",)),
    # reconcile.py became the reconcile/ package on 2026-12-06.
    ("reconcile: other", ("pdd_operator/reconcile.py", "pdd_operator/reconcile/")),
    ("kopf indexing (index handlers)", ("index_resource (",)),
    ("kopf per-event cause detection (diff-base deepcopy)", ("_detect_causes (",)),
    ("kopf per-event processing (other)", ("process_resource_event (",)),
    ("kopf watch streams (JSON parse, aiohttp)", ("infinite_watch (", "continuous_watch (",
                                                   "watch_objs (")),
    ("kopf event posting", ("posting.py",)),
)  # fmt: skip


IDLE = "idle: event loop in epoll, pool threads waiting"
IDLE_LEAVES = ("EpollSelector.select ", "_PollLikeSelector.select ", "_worker (")
# A thread blocked reading a socket (an API answer, the next watch event) holds no CPU, but
# py-spy counts it as active; it is waiting, not work.
WAITING = "waiting: blocked on a socket read (API answers, watch streams)"
WAITING_LEAVES = ("SSLSocket.read ", "SSLSocket.recv_into ", "SocketIO.readinto ")


def categorize_profile(raw: str) -> dict[str, Any]:
    """Shares of samples per category (see PROFILE_CATEGORIES); "other" for the rest."""
    counts: dict[str, int] = {}
    total = 0
    for stack, n in _stacks(raw):
        total += n
        leaf = stack.rsplit(";", 1)[-1]
        if leaf.startswith(IDLE_LEAVES) or leaf.startswith(WAITING_LEAVES):
            kind = IDLE if leaf.startswith(IDLE_LEAVES) else WAITING
            counts[kind] = counts.get(kind, 0) + n
            continue
        label = "other (event loop, logging, threads)"
        for name, needles in PROFILE_CATEGORIES:
            if any(needle in stack for needle in needles):
                label = name
                break
        counts[label] = counts.get(label, 0) + n
    busy = total - counts.get(IDLE, 0) - counts.get(WAITING, 0)
    rows = sorted(counts.items(), key=lambda kv: -kv[1])
    return {
        "samples": total,
        "busy_samples": busy,
        "categories": [
            {
                "category": k,
                "samples": v,
                "share": round(v / total, 4) if total else 0.0,
                "share_of_busy": round(v / busy, 4) if busy and k not in (IDLE, WAITING) else None,
            }
            for k, v in rows
        ],
    }
