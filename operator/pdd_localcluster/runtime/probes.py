"""Container probes: when each is due and what its results mean (`ProbeTracker`, pure), and
running one against a container (`run_probe`).

Like the kubelet: a probe first runs initialDelaySeconds after the container started, then
every periodSeconds; successThreshold consecutive successes make it pass, failureThreshold
consecutive failures make it fail. Until the startup probe has passed, readiness and liveness
are not run. Readiness starts failed, liveness and startup start unknown.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Json = dict[str, Any]

KINDS = ("startupProbe", "readinessProbe", "livenessProbe")


@dataclass
class ProbeTracker:
    kind: str
    spec: Json
    next_at: float
    passing: bool | None = None
    successes: int = 0
    failures: int = 0

    @classmethod
    def for_container(
        cls, container: Json, started_at: float, max_period: float | None = None
    ) -> dict[str, ProbeTracker]:
        trackers = {}
        for kind in KINDS:
            spec = container.get(kind)
            if spec:
                if max_period is not None:
                    spec = {**spec, "periodSeconds": min(period(spec), max_period)}
                first = started_at + float(spec.get("initialDelaySeconds", 0))
                trackers[kind] = cls(kind, spec, first, False if kind == "readinessProbe" else None)
        return trackers

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def record(self, ok: bool, now: float) -> bool | None:
        """Counts one result and schedules the next run; the probe's verdict now."""
        self.next_at = now + period(self.spec)
        if ok:
            self.successes, self.failures = self.successes + 1, 0
            if self.successes >= int(self.spec.get("successThreshold", 1)):
                self.passing = True
        else:
            self.failures, self.successes = self.failures + 1, 0
            if self.failures >= int(self.spec.get("failureThreshold", 3)):
                self.passing = False
        return self.passing


def period(spec: Json) -> float:
    return float(spec.get("periodSeconds", 10))


def timeout(spec: Json) -> float:
    return float(spec.get("timeoutSeconds", 1))


def resolve_port(port: int | str, container: Json) -> int:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise ValueError(f"the container has no port named {port!r}")


# Runs a command inside the container; returns its exit code (None on timeout).
ExecInContainer = Callable[[Sequence[str], float], int | None]


def run_probe(spec: Json, container: Json, pod_ip: str, exec_in: ExecInContainer) -> bool:
    try:
        if "httpGet" in spec:
            return _http_get(spec["httpGet"], container, pod_ip, timeout(spec))
        if "tcpSocket" in spec:
            port = resolve_port(spec["tcpSocket"]["port"], container)
            host = spec["tcpSocket"].get("host") or pod_ip
            with socket.create_connection((host, port), timeout=timeout(spec)):
                return True
        if "exec" in spec:
            return exec_in(spec["exec"]["command"], timeout(spec)) == 0
    except (OSError, ValueError, http.client.HTTPException, subprocess.SubprocessError):
        return False
    return False  # grpc probes are not supported locally


def _http_get(get: Json, container: Json, pod_ip: str, seconds: float) -> bool:
    port = resolve_port(get["port"], container)
    host = get.get("host") or pod_ip
    conn: http.client.HTTPConnection
    if get.get("scheme", "HTTP").upper() == "HTTPS":
        # The kubelet does not verify the certificate of an HTTPS probe either.
        conn = http.client.HTTPSConnection(
            host, port, timeout=seconds, context=ssl._create_unverified_context()
        )
    else:
        conn = http.client.HTTPConnection(host, port, timeout=seconds)
    try:
        headers = {h["name"]: h["value"] for h in get.get("httpHeaders") or []}
        conn.request(
            "GET", get.get("path") or "/", headers={"User-Agent": "kube-probe/1.35", **headers}
        )
        status = conn.getresponse().status
        return 200 <= status < 400
    finally:
        conn.close()
