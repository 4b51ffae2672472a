"""Which replica reconciles: the standby phase of `pdd-operator run`.

With a leader-election Lease configured (the chart always configures one), `run` first
waits as a standby until this process holds the Lease (kube/lease.py), answering the liveness
endpoint meanwhile so that the pod's probes keep it, and only then starts kopf. A thread
renews the Lease while kopf runs; every write is fenced by it, and a replica that lost the
Lease exits (its Deployment starts it again, as a standby). Without a Lease the process leads
at once: one replica only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

from pdd_operator.config import OperatorConfig
from pdd_operator.kube.client import KubeApi, load_api_client
from pdd_operator.kube.lease import KubeLeaseStore, LeaderElector, LeaseTimings
from pdd_operator.metrics import OperatorMetrics

log = logging.getLogger(__name__)

# The exit status of a replica that lost the Lease: the Deployment restarts it as a standby.
EXIT_LEADERSHIP_LOST = 3
# A standby whose election loop made no attempt for this long answers its liveness probe
# with 503 (the loop is stuck: the kubelet restarts the container).
STANDBY_STALL_S = 30.0
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def elect(config: OperatorConfig, metrics: OperatorMetrics) -> LeaderElector | None:
    """Return once this process may reconcile: at once without a Lease (None), else as the
    Lease's holder, with its renewer running."""
    if not config.leader_election_lease:
        metrics.leader.set(1)
        return None
    metrics.leader.set(0)
    timings = LeaseTimings()
    store = KubeLeaseStore(
        # A client of its own: renewals never wait for one of the reconciler's connections.
        KubeApi(load_api_client(config.kubeconfig)),
        lease_namespace(config.leader_election_namespace),
        config.leader_election_lease,
        timings.request_timeout_s,
    )
    elector = LeaderElector(store, identity(), exit_process, timings)
    log.info("standby: waiting for the Lease %s as %s", store.where, elector.identity)
    health = standby_health(config.liveness, lambda: _standby_alive(elector))
    with health, stopped_by_signals(elector.stop):
        acquired = elector.acquire()
    if not acquired:
        log.info("standby: stopped (SIGTERM or SIGINT) before it led; exiting")
        raise SystemExit(0)
    elector.start_renewing()
    metrics.leader.set(1)
    return elector


@contextlib.contextmanager
def stopped_by_signals(stop: Callable[[], None]) -> Iterator[None]:
    """SIGTERM and SIGINT call `stop` while the block runs (a standby's pod is deleted or
    rolled: it ends at once, not after the grace period), whatever the process inherited:
    a parent that ignores SIGTERM passes that on to its children. kopf installs its own
    handlers when it starts; these are undone first."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers (tests run elections in threads)
        return
    wanted = (signal.SIGTERM, signal.SIGINT)
    previous = {sig: signal.signal(sig, lambda *_: stop()) for sig in wanted}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def identity() -> str:
    """The pod's name (its host name) and a random suffix: a restarted container is a new
    candidate, never mistaken for the holder it was."""
    return f"{socket.gethostname()}_{secrets.token_hex(4)}"


def lease_namespace(configured: str) -> str:
    if configured:
        return configured
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


def exit_process(reason: str) -> None:
    """Stop every thread of this process at once, before any of them writes again."""
    log.critical(
        "lost the leadership (%s): exiting so that no write of this replica follows the new "
        "leader's; the Deployment restarts it as a standby",
        reason,
    )
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(EXIT_LEADERSHIP_LOST)


def _standby_alive(elector: LeaderElector) -> bool:
    return time.monotonic() - elector.last_attempt_at < STANDBY_STALL_S


@contextlib.contextmanager
def standby_health(endpoint: str, alive: Callable[[], bool]) -> Iterator[None]:
    """Answer the liveness endpoint (kopf's, which is not running yet) while waiting: 200
    while `alive()`. The port is free again when the block ends, for kopf to take."""
    if not endpoint:
        yield
        return
    parts = urlsplit(endpoint)
    if parts.scheme != "http":
        raise ValueError(f"unsupported liveness endpoint {endpoint!r} (http only)")
    path = parts.path or "/"

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if urlsplit(self.path).path != path:
                self.send_error(404)
                return
            ok = alive()
            body = b'{"standby": true}' if ok else b'{"standby": "stalled"}'
            self.send_response(200 if ok else 503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return  # a probe every few seconds is not worth a log line

    server = ThreadingHTTPServer((parts.hostname or "0.0.0.0", parts.port or 80), Health)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="pdd-standby-health", daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
