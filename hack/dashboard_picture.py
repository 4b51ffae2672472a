"""A picture of the chart's Grafana dashboard over a real run (docs/observability.md).

Starts what `make demo` starts (the local control plane, simulated GPU nodes, the operator,
examples/vllm-2p4d.yaml with the reference engine, a test double of vLLM, as its engine), and
Prometheus (hack/fetch-prometheus.sh) scraping it the way the chart sets scraping up: the
chart's PodMonitors, rendered by `helm template`, translated into scrape jobs as the
Prometheus Operator would (hack/scrape_config.py: the monitors' selectors, ports, target
labels and relabelings; the pods are listed from the API server with kubernetes_sd's meta
labels, Debian's build being without kubernetes_sd), and the operator's /metrics with
honor_labels, as its ServiceMonitor says (the operator runs as a local process here, not
behind its Service). Traffic goes through the example's router in phases of 2, 4, 8 and 3
clients; then every query of charts/pdd-operator/dashboards/pdd-deployment.json, unchanged
but for its $namespace and $deployment, is evaluated over the run by Prometheus's
query_range API and plotted, one plot per panel: docs/img/dashboard.png, with what each
panel's series came to in docs/img/dashboard.json.

The engines take 20 ms per token after the first (PDD_REFENGINE_STEP_SECONDS, a knob of the
test double): the inter-token latency shows that setting, the time to first token is
measured (the KV handoff over NIXL on loopback TCP included).

    .venv/bin/python hack/dashboard_picture.py      # about 8 minutes
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "hack"))

from demo import (  # noqa: E402
    EXAMPLE,
    LOCAL_TRANSPORTS,
    REFENGINE,
    _config,
    demo_nodes,
    is_ready,
    prepare_model_source,
)
from scrape_config import pod_monitor_jobs, pod_targets  # noqa: E402

from helpers.operator_proc import OperatorProcess, free_port, install_crd  # noqa: E402
from helpers.traffic import SteadyTraffic  # noqa: E402
from pdd_localcluster.__main__ import loopback_pod_ips  # noqa: E402
from pdd_localcluster.controlplane import LocalControlPlane, resolve_bin_dir  # noqa: E402
from pdd_localcluster.nodesim import NodeSimulator  # noqa: E402
from pdd_localcluster.runtime import PodRuntime  # noqa: E402
from pdd_localcluster.runtime.images import KNOWN_IMAGES, repository  # noqa: E402

CHART = ROOT / "charts" / "pdd-operator"
DASHBOARD = CHART / "dashboards" / "pdd-deployment.json"
# The test double's knobs: 20 ms per token after the first, and a KV region that holds the
# 8 clients' requests at once: it plays a 70B model's KV, whose 256-token blocks (the operator's
# choice for this model) are 80 MiB each, and the default region holds four (1 GiB: twelve).
ENGINE_ENV = {"PDD_REFENGINE_STEP_SECONDS": "0.02", "PDD_REFENGINE_KV_REGION_BYTES": str(1 << 30)}
# Grafana's unit ids in the dashboard, as an axis says them.
UNITS = {"reqps": "req/s", "s": "s", "short": "", "GBs": "GB/s", "percentunit": "fraction"}
PHASES = ((2, 75), (4, 75), (8, 75), (3, 75))  # (clients, seconds)
SCRAPE_INTERVAL = "5s"
PROMETHEUS_PORT = free_port()  # on 127.0.0.1, for the run's length


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state-dir", default=str(ROOT / ".tmp" / "dashboard-picture"))
    parser.add_argument("--out", default=str(ROOT / "docs" / "img" / "dashboard.png"))
    parser.add_argument("--prometheus", default="", help="its binary (default: fetched)")
    args = parser.parse_args()
    state = Path(args.state_dir)
    # A fresh run each time: Prometheus's data of an earlier run would reach into this one's
    # rate windows (the same namespace and deployment).
    shutil.rmtree(state, ignore_errors=True)
    prometheus = args.prometheus or _fetched_prometheus()
    body = yaml.safe_load(EXAMPLE.read_text())
    with LocalControlPlane(state / "cluster") as cp:
        api = client.ApiClient(_config(cp))
        engine = repository(body["spec"]["engine"]["image"])
        stepping = replace(
            KNOWN_IMAGES[REFENGINE],
            extra_env={**KNOWN_IMAGES[REFENGINE].extra_env, **ENGINE_ENV},
        )
        runtime = PodRuntime(
            cp.kubeconfig, state / "runtime", images={**KNOWN_IMAGES, engine: stepping}
        )
        with NodeSimulator(
            cp.kubeconfig, demo_nodes(), pod_ips=loopback_pod_ips(), runtime=runtime
        ):
            install_crd(api)
            operator = OperatorProcess(cp.kubeconfig, state / "operator.log", resync_seconds=30)
            operator.start()
            try:
                router = _deployed(api, body)
                config = _prometheus_config(api, operator.metrics_port, state)
                with _running(prometheus, config, state / "prometheus"):
                    start = time.time()
                    _send_traffic(router, body["spec"]["model"].get("servedName") or "")
                    time.sleep(15)  # the last scrapes
                    end = time.time()
                    panels = _evaluate(
                        body["metadata"]["namespace"], body["metadata"]["name"], start, end
                    )
            finally:
                operator.kill()
    _plot(panels, Path(args.out), start, end)
    Path(args.out).with_suffix(".json").write_text(
        json.dumps(_summary(panels, start, end), indent=1) + "\n"
    )
    print(f"wrote {args.out} and its summary")
    return 0


def _fetched_prometheus() -> str:
    done = subprocess.run(
        ["bash", str(ROOT / "hack" / "fetch-prometheus.sh")],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip().splitlines()[-1]


def _deployed(api: client.ApiClient, body: dict[str, Any]) -> str:
    """Apply the example as `make demo` does; the router's URL once it is Ready."""
    ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
    prepare_model_source(api, body)
    body["spec"]["kvTransfer"].setdefault("ucx", {})["transports"] = LOCAL_TRANSPORTS
    objects = client.CustomObjectsApi(api)
    objects.create_namespaced_custom_object("pdd.dev", "v1alpha1", ns, "pddeployments", body)
    deadline = time.time() + 300
    while time.time() < deadline:
        pdd = objects.get_namespaced_custom_object("pdd.dev", "v1alpha1", ns, "pddeployments", name)
        if is_ready(pdd) and pdd.get("status", {}).get("transfer", {}).get("measuredGBps"):
            break
        time.sleep(2)
    else:
        raise SystemExit(f"{name} not Ready with a measured KV path after 300 s")
    pods = client.CoreV1Api(api).list_namespaced_pod(ns, label_selector="pdd.dev/role=router")
    print(f"{name} Ready; router pod {pods.items[0].metadata.name}", flush=True)
    return f"http://{pods.items[0].status.pod_ip}:8000"


def _prometheus_config(api: client.ApiClient, operator_port: int, state: Path) -> Path:
    rendered = subprocess.run(
        [
            str(resolve_bin_dir() / "helm"), "template", "pdd", str(CHART),
            "--namespace", "pdd-system", "--kube-version", "1.35.0",
            "--set", "metrics.podMonitors.enabled=true",
            "--set", "metrics.podMonitors.skipCapabilityCheck=true",
            "--set", f"metrics.podMonitors.interval={SCRAPE_INTERVAL}",
            "--set", "metrics.podMonitors.scrapeTimeout=4s",
        ],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    monitors = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "PodMonitor"]
    # Debian's Prometheus is built without kubernetes_sd: the pods, with the meta labels it
    # would give, are written to a file (the pods do not change during the run).
    targets = state / "pods.json"
    pods = api.sanitize_for_serialization(client.CoreV1Api(api).list_pod_for_all_namespaces())
    targets.write_text(json.dumps(pod_targets(pods["items"])))
    discovery = {"file_sd_configs": [{"files": [str(targets)]}]}
    jobs = [job for monitor in monitors for job in pod_monitor_jobs(monitor, discovery)]
    jobs.append(
        {
            "job_name": "pdd-operator",
            "honor_labels": True,
            "static_configs": [{"targets": [f"127.0.0.1:{operator_port}"]}],
        }
    )
    config = {
        "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
        "scrape_configs": jobs,
    }
    path = state / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    print(
        f"Prometheus: the chart's {len(monitors)} PodMonitors as {len(jobs) - 1} jobs, "
        "and the operator",
        flush=True,
    )
    return path


class _running:
    """Prometheus on 127.0.0.1 for the length of a `with`."""

    def __init__(self, binary: str, config: Path, data: Path) -> None:
        self.argv = [
            binary, f"--config.file={config}", f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{PROMETHEUS_PORT}",
        ]  # fmt: skip
        self.log = data.with_suffix(".log")

    def __enter__(self) -> _running:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(self.argv, stdout=self.log.open("w"), stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{PROMETHEUS_PORT}/-/ready", timeout=1)
                return self
            except OSError:
                time.sleep(0.5)
        raise SystemExit(f"Prometheus not ready; see {self.log}")

    def __exit__(self, *_: object) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def _send_traffic(router: str, model: str) -> None:
    for clients, seconds in PHASES:
        traffic = SteadyTraffic(router, model, workers=clients, pause_s=0.2).start()
        time.sleep(seconds)
        outcomes = traffic.stop()
        failed = [o for o in outcomes if not o.ok]
        print(
            f"{clients} clients for {seconds} s: {len(outcomes)} requests, {len(failed)} failed",
            flush=True,
        )
        for error in sorted({o.error for o in failed})[:3]:
            print(f"  failed: {error[:200]}", flush=True)


def _evaluate(namespace: str, deployment: str, start: float, end: float) -> list[dict[str, Any]]:
    """Each panel's series: (legend, [(t, value)]) per target's result."""
    panels = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        series = []
        for target in panel.get("targets", []):
            expr = (
                target["expr"].replace("$namespace", namespace).replace("$deployment", deployment)
            )
            for result in _query_range(expr, start, end):
                legend = _legend(target.get("legendFormat", ""), result["metric"])
                points = [
                    (float(t), float(v)) for t, v in result["values"] if math.isfinite(float(v))
                ]
                series.append({"legend": legend, "points": points})
        panels.append(
            {
                "title": panel["title"],
                "unit": panel.get("fieldConfig", {}).get("defaults", {}).get("unit", ""),
                "series": series,
            }
        )
    return panels


def _query_range(expr: str, start: float, end: float) -> list[dict[str, Any]]:
    query = urllib.parse.urlencode(
        {"query": expr, "start": start, "end": end, "step": SCRAPE_INTERVAL}
    )
    url = f"http://127.0.0.1:{PROMETHEUS_PORT}/api/v1/query_range?{query}"
    with urllib.request.urlopen(url, timeout=30) as response:
        answer = json.loads(response.read())
    if answer.get("status") != "success":
        raise SystemExit(f"Prometheus refused {expr}: {answer}")
    return answer["data"]["result"]  # type: ignore[no-any-return]


def _legend(template: str, labels: dict[str, str]) -> str:
    for key, value in labels.items():
        template = template.replace("{{" + key + "}}", value).replace("{{ " + key + " }}", value)
    return template or ", ".join(f"{k}={v}" for k, v in labels.items()) or "value"


def _plot(panels: list[dict[str, Any]], out: Path, start: float, end: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = 3
    rows = -(-len(panels) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(16, 3.2 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, panels, strict=False):
        ax.set_title(panel["title"], fontsize=9)
        for series in panel["series"]:
            ax.plot(
                [(t - start) / 60 for t, _ in series["points"]],
                [v for _, v in series["points"]],
                label=series["legend"],
            )
        if not panel["series"]:
            ax.text(
                0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="grey"
            )
        ax.set_xlim(0, (end - start) / 60)
        ax.set_ylabel(UNITS.get(panel["unit"], panel["unit"]), fontsize=8)
        ax.tick_params(labelsize=7)
        if any(s["legend"] for s in panel["series"]):
            ax.legend(fontsize=7, loc="upper left")
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("minutes into the run", fontsize=8)
    figure.suptitle(
        "charts/pdd-operator/dashboards/pdd-deployment.json over hack/dashboard_picture.py "
        "(Prometheus 2.42; vllm-router 0.1.17; reference engine, vLLM names)",
        fontsize=10,
    )
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=80)


def _summary(panels: list[dict[str, Any]], start: float, end: float) -> dict[str, Any]:
    """What each panel's series came to: its last and its largest value."""
    return {
        "seconds": round(end - start),
        "panels": {
            p["title"]: {
                s["legend"]: {
                    "last": round(s["points"][-1][1], 6) if s["points"] else None,
                    "max": round(max(v for _, v in s["points"]), 6) if s["points"] else None,
                }
                for s in p["series"]
            }
            for p in panels
        },
    }


if __name__ == "__main__":
    sys.exit(main())
