"""Write charts/pdd-operator/dashboards/pdd-deployment.json, the Grafana dashboard of one
PDDeployment that the chart ships (metrics.dashboards.enabled), from the panels below.

    .venv/bin/python hack/dashboards.py

Every query names metrics the pinned engines and routers export (tests/fixtures/metrics,
hack/metric_names.py) or the operator and sidecar register; tests/chart/test_dashboards.py
checks each one. Series carry the target labels the chart's PodMonitors add (namespace, and
pdd_dev_deployment / pdd_dev_role from the pods' pdd.dev/ labels); the operator's own
KV-path series carry the deployment's namespace and name as labels of their own (its
ServiceMonitor honours them).
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = (
    Path(__file__).resolve().parents[1]
    / "charts"
    / "pdd-operator"
    / "dashboards"
    / "pdd-deployment.json"
)
POD = 'namespace="$namespace", pdd_dev_deployment="$deployment"'
DECODE = POD + ', pdd_dev_role="decode"'
# The operator's own series name the deployment as its pods' label does (deployment_id).
OPERATOR = 'namespace="$namespace", deployment_id="$deployment"'


def quantile(q: str, metric: str, selector: str) -> str:
    return f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket{{{selector}}}[5m])))"


def either(vllm: str, sglang: str) -> str:
    """A deployment runs one engine: the other's series are absent and `or` keeps the one."""
    return f"({vllm}) or ({sglang})"


def latency_panel(title: str, metric: str) -> tuple[str, str, list[tuple[str, str]], int]:
    """p50 and p95 of a histogram both engines name alike (vllm:<metric>, sglang:<metric>),
    on the decode engines."""
    targets = [
        (
            f"p{q[2:]}",
            either(quantile(q, f"vllm:{metric}", DECODE), quantile(q, f"sglang:{metric}", DECODE)),
        )
        for q in ("0.50", "0.95")
    ]
    return (title, "s", targets, 12)


# (title, unit, [(legend, query)], width)
PANELS: list[tuple[str, str, list[tuple[str, str]], int]] = [
    (
        "Requests per second through the router",
        "reqps",
        [
            (
                "requests",
                either(
                    f"sum(rate(vllm_router_pd_requests_total{{{POD}}}[5m]))",
                    f"sum(rate(smg_router_requests_total{{{POD}}}[5m]))",
                ),
            )
        ],
        12,
    ),
    (
        "Router errors per second",
        "reqps",
        [
            (
                "errors",
                either(
                    f"sum(rate(vllm_router_pd_decode_errors_total{{{POD}}}[5m]))",
                    f'sum(rate(smg_http_responses_total{{{POD}, status_code=~"5.."}}[5m]))',
                ),
            ),
            ("worker errors (smg)", f"sum(rate(smg_worker_errors_total{{{POD}}}[5m]))"),
        ],
        12,
    ),
    # A decode engine counts its time to first token from the request reaching it: the KV
    # transfer and the first decode step, not the prefill before them.
    latency_panel(
        "Decode's time to first token (KV transfer and first step)",
        "time_to_first_token_seconds",
    ),
    latency_panel("Inter-token latency (decode engines)", "inter_token_latency_seconds"),
    (
        "Waiting requests by role",
        "short",
        [
            (
                "{{pdd_dev_role}}",
                either(
                    f"sum by (pdd_dev_role) (vllm:num_requests_waiting{{{POD}}})",
                    f"sum by (pdd_dev_role) (sglang:num_queue_reqs{{{POD}}})",
                ),
            )
        ],
        8,
    ),
    (
        "Running requests by role",
        "short",
        [
            (
                "{{pdd_dev_role}}",
                either(
                    f"sum by (pdd_dev_role) (vllm:num_requests_running{{{POD}}})",
                    f"sum by (pdd_dev_role) (sglang:num_running_reqs{{{POD}}})",
                ),
            )
        ],
        8,
    ),
    (
        "Engine pods by role (P:D, autoscaling)",
        "short",
        [
            (
                "{{pdd_dev_role}}",
                # Pods, not series: vLLM's data-parallel engines of one pod are series each.
                either(
                    f"count by (pdd_dev_role) (count by (pod, pdd_dev_role) "
                    f"(vllm:num_requests_running{{{POD}}}))",
                    f"count by (pdd_dev_role) (count by (pod, pdd_dev_role) "
                    f"(sglang:num_running_reqs{{{POD}}}))",
                ),
            )
        ],
        8,
    ),
    (
        "KV path: measured GB/s (operator's probe)",
        "GBs",
        [("{{path}}", f"pdd_kv_transfer_gbps{{{OPERATOR}}}")],
        8,
    ),
    (
        "KV path verified (1) or degraded (0)",
        "short",
        [("{{path}}", f"pdd_kv_transfer_verified{{{OPERATOR}}}")],
        8,
    ),
    (
        "Transfers waiting on the decode side",
        "short",
        [
            (
                "pending decode (vllm-router)",
                f"sum(vllm_router_pd_pending_decode_requests{{{POD}}})",
            ),
            ("transfer queue (SGLang)", f"sum(sglang:num_decode_transfer_queue_reqs{{{DECODE}}})"),
        ],
        8,
    ),
    (
        "KV cache usage by role",
        "percentunit",
        [
            (
                "{{pdd_dev_role}}",
                either(
                    f"avg by (pdd_dev_role) (vllm:kv_cache_usage_perc{{{POD}}})",
                    f"avg by (pdd_dev_role) (sglang:token_usage{{{POD}}})",
                ),
            )
        ],
        12,
    ),
]


def panel(
    index: int, title: str, unit: str, targets: list[tuple[str, str]], width: int, x: int, y: int
) -> dict[str, object]:
    return {
        "id": index + 1,
        "type": "timeseries",
        "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": width, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [
            {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
            for i, (legend, expr) in enumerate(targets)
        ],
    }


def dashboard() -> dict[str, object]:
    panels, x, y = [], 0, 0
    for index, (title, unit, targets, width) in enumerate(PANELS):
        if x + width > 24:
            x, y = 0, y + 8
        panels.append(panel(index, title, unit, targets, width, x, y))
        x += width
    variable = {"type": "prometheus", "uid": "${datasource}"}
    return {
        "title": "PDDeployment",
        "uid": "pdd-deployment",
        "description": "One PDDeployment: requests, latency, queues and pods per role, the KV "
        "path's measured bandwidth and verdict (pdd-operator chart).",
        "tags": ["pdd", "llm", "inference"],
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus"},
                {
                    "name": "namespace",
                    "type": "query",
                    "datasource": variable,
                    "query": 'label_values(up{pdd_dev_role="decode"}, namespace)',
                    "refresh": 2,
                },
                {
                    "name": "deployment",
                    "type": "query",
                    "datasource": variable,
                    "query": 'label_values(up{namespace="$namespace", pdd_dev_role="decode"}, '
                    "pdd_dev_deployment)",
                    "refresh": 2,
                },
            ]
        },
        "panels": panels,
    }


if __name__ == "__main__":
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(dashboard(), indent=1) + "\n")
    print(f"wrote {OUT}")
