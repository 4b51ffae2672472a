"""The operator's Prometheus metrics (prometheus-client), named by Prometheus conventions."""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.reconciles = Counter(
            "pdd_operator_reconciles_total", "Reconcile passes run.", registry=self.registry
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

    def reconcile_timer(self) -> Callable[[], None]:
        start = time.perf_counter()
        self.reconciles.inc()

        def done() -> None:
            self.reconcile_seconds.observe(time.perf_counter() - start)

        return done

    def serve(self, port: int) -> None:
        start_http_server(port, registry=self.registry)
