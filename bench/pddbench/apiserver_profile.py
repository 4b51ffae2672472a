"""Where the kube-apiserver spends its CPU during an arm: Go CPU profiles taken from its own
/debug/pprof endpoint in short back-to-back windows, merged and grouped by what the server
was doing.

The API server is the bench's bottleneck (about one of the two cores in both arms), so the
converge ratio follows what each arm asks of it. Both arms are profiled the same way; the
difference between their groups is what the operator costs the server beyond the children
themselves.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pdd_localcluster.kubejson import KubeJson

# A window ends with the profile; the next starts at once. Short, so that stopping after
# convergence adds little of the idle tail.
WINDOW_S = 3

# What a sample was doing, decided by the first rule any frame of its stack matches; the
# rules go from the specific (a step inside a request) to the general (serving any request).
# Not by request handler: the server finishes a request on a goroutine of its own and cuts
# deep stacks (a merge walk) short, so most samples do not show which handler they serve.
WORK_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("admission policies (CEL)", ("/plugin/policy/", "/cel.", "cel-go", "/cel/")),
    ("audit log", ("/pkg/audit", "/plugin/pkg/audit")),
    ("server-side apply, managed fields", ("/managedfields", "structured-merge-diff")),
    ("etcd client", ("/storage/etcd3", "go.etcd.io/etcd/client", "google.golang.org/grpc")),
    ("watch: events to watchers", ("(*cacheWatcher)", "serveWatch", "(*WatchServer)")),
    ("watch cache", ("/storage/cacher",)),
    ("encode responses", ("transformObject", "SerializeObject", "WriteObjectNegotiated")),
    ("decode requests", ("limitedReadBody", "(*codec).Decode", "json.Unmarshal", "Decode")),
    ("request filters: authn, authz, flow control", ("/endpoints/filters", "/server/filters")),
    ("TLS, HTTP/2", ("crypto/tls", "net/http", "golang.org/x/net/http2")),
    ("garbage collection", ("runtime.gcBgMarkWorker", "runtime.gcDrain", "runtime.bgsweep")),
)

_SEPARATOR = re.compile(r"^-+\+-+$")
_VALUE = re.compile(r"^\s*([0-9.]+)(ns|us|µs|ms|s)\s+(\S.*)$")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}


class ApiServerProfiler:
    """Back-to-back CPU profiles of the API server into `out_dir`, from `start()` until
    `stop()` (which waits for the window in flight)."""

    def __init__(self, kube: KubeJson, out_dir: Path, prefix: str) -> None:
        self.kube = kube
        self.out_dir = out_dir
        self.prefix = prefix
        self.files: list[Path] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> ApiServerProfiler:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for old in self.out_dir.glob(f"{self.prefix}-*.pb.gz"):
            old.unlink()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Idempotent: a second call finds the thread gone."""
        self._stop.set()
        self._thread.join(WINDOW_S + 30)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.kube.get_bytes(
                    "/debug/pprof/profile", {"seconds": WINDOW_S}, timeout=WINDOW_S + 20
                )
            except Exception as err:  # a lost window is reported, not fatal to the run
                self.errors.append(str(err)[:200])
                self._stop.wait(1.0)
                continue
            path = self.out_dir / f"{self.prefix}-{len(self.files):04d}.pb.gz"
            path.write_bytes(data)
            self.files.append(path)


def summarize(files: Sequence[Path]) -> dict[str, Any]:
    """CPU seconds of the merged windows, in total and by work."""
    if not files:
        return {}
    stacks = list(parse_traces(_pprof_traces(files)))
    total = sum(v for v, _ in stacks)
    return {
        "windows": len(files),
        "window_s": WINDOW_S,
        "cpu_s": round(total, 2),
        "by_work_s": _grouped(stacks, WORK_RULES),
    }


def _pprof_traces(files: Sequence[Path]) -> str:
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("the Go toolchain (go tool pprof) is not on PATH")
    proc = subprocess.run(
        [go, "tool", "pprof", "-traces", *map(str, files)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return proc.stdout


def parse_traces(text: str) -> Iterable[tuple[float, list[str]]]:
    """(seconds, frames from leaf to root) per distinct stack of `pprof -traces` output."""
    value: float | None = None
    frames: list[str] = []
    for line in text.splitlines():
        if _SEPARATOR.match(line.strip()):
            if value is not None:
                yield value, frames
            value, frames = None, []
            continue
        head = _VALUE.match(line)
        if head is not None and value is None:
            value = float(head.group(1)) * _UNIT_S[head.group(2)]
            frames = [head.group(3).strip()]
        elif value is not None and line.strip():
            frames.append(line.strip())
    if value is not None:
        yield value, frames


def classify(frames: Sequence[str], rules: Sequence[tuple[str, tuple[str, ...]]]) -> str:
    for name, needles in rules:
        if any(needle in frame for frame in frames for needle in needles):
            return name
    return "other"


def _grouped(
    stacks: Iterable[tuple[float, list[str]]], rules: Sequence[tuple[str, tuple[str, ...]]]
) -> dict[str, float]:
    seconds: Counter[str] = Counter()
    for value, frames in stacks:
        seconds[classify(frames, rules)] += value
    return {name: round(s, 2) for name, s in seconds.most_common()}
