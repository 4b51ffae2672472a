"""The operator's Prometheus metrics (prometheus-client), named by Prometheus conventions."""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from pdd_operator.api.names import DeploymentKey, instance_id

# The labels of a deployment's KV-transfer series: namespace, deployment, deployment_id (the
# pods' pdd.dev/deployment label, which a PodMonitor turns into pdd_dev_deployment: the name,
# or a shortened, hashed form of a name that is no label value), path, domain.
TRANSFER_LABELS = ["namespace", "deployment", "deployment_id", "path", "domain"]
TransferLabels = tuple[str, str, str, str, str]


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.leader = Gauge(
            "pdd_operator_leader",
            "1 while this replica reconciles (it holds the leader-election Lease, or runs "
            "without election); 0 while it waits as a standby.",
            registry=self.registry,
        )
        self.reconciles = Counter(
            "pdd_operator_reconciles_total", "Reconcile passes run.", registry=self.registry
        )
        # Asked for, not run: passes asked for while one is due or running fold into it.
        self.pass_requests = Counter(
            "pdd_operator_pass_requests_total",
            "Reconcile passes asked for, by what asked: the kind whose change was seen "
            "(its plural), resync, or retry.",
            ["cause"],
            registry=self.registry,
        )
        self.reconcile_errors = Counter(
            "pdd_operator_reconcile_errors_total",
            "Reconcile passes that raised.",
            registry=self.registry,
        )
        self.reconcile_seconds = Histogram(
            "pdd_operator_reconcile_duration_seconds",
            "Time of one reconcile pass.",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5),
            registry=self.registry,
        )
        self.writes = Counter(
            "pdd_operator_api_writes_total",
            "Mutating API requests sent, by verb and kind.",
            ["verb", "kind"],
            registry=self.registry,
        )
        self.drift_corrections = Counter(
            "pdd_operator_drift_corrections_total",
            "Children whose owned fields were changed outside the operator and put back.",
            ["kind"],
            registry=self.registry,
        )
        # Both per process, one series each: a restarted operator has re-verified every
        # deployment when the first equals their number, and the second going back to its
        # level after deployments come and go shows no per-deployment state left behind.
        self.deployments_reconciled = Gauge(
            "pdd_operator_deployments_reconciled",
            "Existing PDDeployments that had at least one reconcile pass in this process.",
            registry=self.registry,
        )
        self.deployments_tracked = Gauge(
            "pdd_operator_deployments_tracked",
            "PDDeployments the reconciler holds per-deployment state for.",
            registry=self.registry,
        )
        self.kv_transfer_gbps = Gauge(
            "pdd_kv_transfer_gbps",
            "KV transfer bandwidth of the deployment's verified path, in GB/s (1e9 bytes/s, "
            "as status.transfer.measuredGBps), from the latest answered probe.",
            TRANSFER_LABELS,
            registry=self.registry,
        )
        self.kv_transfer_verified = Gauge(
            "pdd_kv_transfer_verified",
            "1 while the latest probe verified the deployment's KV path (KVTransferVerified="
            "True), 0 while it found it degraded.",
            TRANSFER_LABELS,
            registry=self.registry,
        )
        # One series per deployment: the labels it was last exported with, so a new path or
        # domain replaces the old series instead of adding one (bounded cardinality).
        self._transfer_labels: dict[DeploymentKey, TransferLabels] = {}
        # Counted for every watch event that asks for a pass; `labels()` takes a lock and
        # validates its arguments each time, so each cause's series is looked up once.
        self._pass_requests_by_cause: dict[str, Counter] = {}

    def count_pass_request(self, cause: str) -> None:
        series = self._pass_requests_by_cause.get(cause)
        if series is None:
            series = self._pass_requests_by_cause[cause] = self.pass_requests.labels(cause=cause)
        series.inc()

    def set_kv_transfer(
        self, key: DeploymentKey, path: str, domain: str, gbps: float, verified: bool
    ) -> None:
        """Export the deployment's latest KV-transfer measurement."""
        labels = (key[0], key[1], instance_id(key[1]), path, domain)
        if self._transfer_labels.get(key) not in (None, labels):
            self.forget_kv_transfer(key)
        self._transfer_labels[key] = labels
        self.kv_transfer_gbps.labels(*labels).set(gbps)
        self.kv_transfer_verified.labels(*labels).set(1 if verified else 0)

    def forget_kv_transfer(self, key: DeploymentKey) -> None:
        """No measurement to export (none yet, or the deployment is gone): no series, rather
        than a stale one that a guard would go on trusting."""
        labels = self._transfer_labels.pop(key, None)
        if labels is not None:
            self.kv_transfer_gbps.remove(*labels)
            self.kv_transfer_verified.remove(*labels)

    def reconcile_timer(self) -> Callable[[], None]:
        start = time.perf_counter()
        self.reconciles.inc()

        def done() -> None:
            self.reconcile_seconds.observe(time.perf_counter() - start)

        return done

    def serve(self, port: int) -> None:
        start_http_server(port, registry=self.registry)
