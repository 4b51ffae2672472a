"""A custom metrics API (`custom.metrics.k8s.io/v1beta2`) served by the test itself, for the
stock HPA controller of kube-controller-manager to read through the API server's aggregation
layer, as it reads prometheus-adapter or KEDA's metrics server in a cluster.

Why a network namespace: the aggregator reaches an APIService through its Service's
endpoints (`--enable-aggregator-routing`: no kube-proxy here), and the API server refuses
loopback endpoint addresses. So the test makes a network namespace of its own, joined to the
host by a veth pair with non-loopback addresses, and listens there: its listening socket is
created inside that namespace (setns in a helper thread) while the rest of the test process,
its Kubernetes client included, stays where it was. Traffic goes only to that namespace.
"""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from kubernetes import client

GROUP, VERSION = "custom.metrics.k8s.io", "v1beta2"
CLONE_NEWNET = 0x40000000

# (namespace, metric name, pod names) -> value per pod name
PodMetrics = Callable[[str, str, list[str]], Mapping[str, float]]
# (namespace, resource, object name, metric name) -> the object's value, None: not served
ObjectMetrics = Callable[[str, str, str, str], float | None]
# The kinds of the objects ObjectMetrics may describe, by resource (as an adapter lists them).
OBJECT_KINDS = {"services": "Service"}


def free_subnet(prefix: str = "10.199") -> str:
    """A /24 of `prefix` that no interface here uses. A run killed before its clean-up (a
    CI job stopped, a machine kept between sessions) leaves its namespace and veth behind;
    the same subnet again would route the API server to the old namespace, which refuses."""
    used = subprocess.run(["ip", "-br", "addr"], capture_output=True, text=True).stdout
    for third in range(7, 255):
        if f" {prefix}.{third}." not in f" {used}".replace("\t", " "):
            return f"{prefix}.{third}"
    raise RuntimeError(f"every {prefix}.x.0/24 is in use here")


@contextmanager
def network_namespace(subnet: str | None = None) -> Iterator[tuple[str, str, str]]:
    """A network namespace joined to the host by a veth pair: (name, host ip, namespace ip),
    on `subnet` (default: one no interface uses)."""
    subnet = subnet or free_subnet()
    tag = secrets.token_hex(3)
    name, host_if, ns_if = f"pdd-{tag}", f"pdh{tag}", f"pdn{tag}"
    host_ip, ns_ip = f"{subnet}.1", f"{subnet}.2"
    steps = [
        ["ip", "netns", "add", name],
        ["ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if, "netns", name],
        ["ip", "addr", "add", f"{host_ip}/30", "dev", host_if],
        ["ip", "link", "set", host_if, "up"],
        ["ip", "-n", name, "addr", "add", f"{ns_ip}/30", "dev", ns_if],
        ["ip", "-n", name, "link", "set", ns_if, "up"],
        ["ip", "-n", name, "link", "set", "lo", "up"],
    ]
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True)
        yield name, host_ip, ns_ip
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def listen_in(netns: str, address: str, port: int = 0) -> socket.socket:
    """A listening TCP socket created inside `netns` (a socket keeps the namespace it was
    made in); only a helper thread enters the namespace."""
    libc = ctypes.CDLL(None, use_errno=True)
    result: dict[str, Any] = {}

    def make() -> None:
        fd = os.open(f"/var/run/netns/{netns}", os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns failed")
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, port))
            sock.listen(64)
            result["sock"] = sock
        except Exception as err:
            result["error"] = err
        finally:
            os.close(fd)

    thread = threading.Thread(target=make)  # its namespace dies with it
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    sock: socket.socket = result["sock"]
    return sock


class CustomMetricsServer:
    """Serves discovery, pod and object metrics of `custom.metrics.k8s.io/v1beta2` over TLS
    on a socket given to it. `pod_metrics` answers for the pods the request's label selector
    picks (listed from the API server, as an adapter would); `object_metrics` for one object
    of OBJECT_KINDS (a Service: what an HPA that scales from zero reads, as no pod is there
    to measure). Every request is recorded."""

    def __init__(
        self,
        sock: socket.socket,
        api: client.ApiClient,
        pod_metrics: PodMetrics,
        cert_dir: Path,
        object_metrics: ObjectMetrics | None = None,
    ) -> None:
        self.api = api
        self.pod_metrics = pod_metrics
        self.object_metrics = object_metrics
        self.requests: list[str] = []
        cert, key = _self_signed(cert_dir)
        address = sock.getsockname()
        self.httpd = ThreadingHTTPServer(address, _handler(self), bind_and_activate=False)
        self.httpd.socket.close()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.httpd.socket = context.wrap_socket(sock, server_side=True)
        self.port = int(address[1])
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> CustomMetricsServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def answer(self, path: str, query: Mapping[str, list[str]]) -> tuple[int, dict[str, Any]]:
        self.requests.append(path)
        base = f"/apis/{GROUP}/{VERSION}"
        if path == base:
            return 200, _discovery()
        parts = path.removeprefix(base + "/").split("/")
        # namespaces/{ns}/pods/{name or *}/{metric}
        if path.startswith(base + "/namespaces/") and len(parts) == 5 and parts[2] == "pods":
            namespace, pod, metric = parts[1], parts[3], parts[4]
            selector = (query.get("labelSelector") or [""])[0]
            return 200, self._pod_values(namespace, pod, metric, selector)
        # namespaces/{ns}/{resource}/{name}/{metric}
        if path.startswith(base + "/namespaces/") and len(parts) == 5 and parts[2] in OBJECT_KINDS:
            namespace, resource, name, metric = parts[1], parts[2], parts[3], parts[4]
            served = self.object_metrics
            value = None if served is None else served(namespace, resource, name, metric)
            if value is not None:
                described = {"kind": OBJECT_KINDS[resource], "namespace": namespace, "name": name}
                return 200, _value_list([(described | {"apiVersion": "/v1"}, metric, value)])
        return 404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404}

    def _pod_values(self, namespace: str, pod: str, metric: str, selector: str) -> dict[str, Any]:
        core = client.CoreV1Api(self.api)
        pods = core.list_namespaced_pod(namespace, label_selector=selector or None).items
        names = [p.metadata.name for p in pods if pod in ("*", p.metadata.name)]
        values = self.pod_metrics(namespace, metric, names)
        pod_ref = {"kind": "Pod", "namespace": namespace, "apiVersion": "/v1"}
        return _value_list(
            [(pod_ref | {"name": name}, metric, values[name]) for name in names if name in values]
        )


def _value_list(values: list[tuple[dict[str, str], str, float]]) -> dict[str, Any]:
    """A MetricValueList of (described object, metric, value)."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    items = [
        {
            "describedObject": described,
            "metric": {"name": metric},
            "timestamp": now,
            "windowSeconds": 60,
            "value": f"{int(value * 1000)}m",
        }
        for described, metric, value in values
    ]
    return {
        "kind": "MetricValueList",
        "apiVersion": f"{GROUP}/{VERSION}",
        "metadata": {},
        "items": items,
    }


def register(api: client.ApiClient, namespace: str, address: str, port: int) -> None:
    """A selector-less Service whose endpoint is the server's address, and the APIService
    that sends the group to it (TLS unverified: the serving cert is self-signed)."""
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": namespace}})
    name = "custom-metrics"
    core.create_namespaced_service(
        namespace,
        {
            "metadata": {"name": name},
            "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port}]},
        },
    )
    core.create_namespaced_endpoints(
        namespace,
        {
            "metadata": {"name": name},
            "subsets": [
                {"addresses": [{"ip": address}], "ports": [{"name": "https", "port": port}]}
            ],
        },
    )
    client.DiscoveryV1Api(api).create_namespaced_endpoint_slice(
        namespace,
        {
            "metadata": {
                "name": f"{name}-1",
                "labels": {"kubernetes.io/service-name": name},
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
        },
    )
    client.ApiregistrationV1Api(api).create_api_service(
        {
            "metadata": {"name": f"{VERSION}.{GROUP}"},
            "spec": {
                "group": GROUP,
                "version": VERSION,
                "service": {"namespace": namespace, "name": name, "port": 443},
                "insecureSkipTLSVerify": True,
                "groupPriorityMinimum": 100,
                "versionPriority": 200,
            },
        }
    )


def api_service_available(api: client.ApiClient) -> bool:
    svc = client.ApiregistrationV1Api(api).read_api_service(f"{VERSION}.{GROUP}")
    return any(c.type == "Available" and c.status == "True" for c in (svc.status.conditions or []))


def _discovery() -> dict[str, Any]:
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{GROUP}/{VERSION}",
        "resources": [
            {
                "name": f"{resource}/*",
                "singularName": "",
                "namespaced": True,
                "kind": "MetricValueList",
                "verbs": ["get"],
            }
            for resource in ("pods", *OBJECT_KINDS)
        ],
    }


def _handler(server: CustomMetricsServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlparse(self.path)
            status, body = server.answer(unquote(url.path), parse_qs(url.query))
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return

    return Handler


def _self_signed(cert_dir: Path) -> tuple[Path, Path]:
    cert_dir.mkdir(parents=True, exist_ok=True)
    cert, key = cert_dir / "metrics.crt", cert_dir / "metrics.key"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
            "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key), "-out", str(cert),
            "-days", "1", "-subj", "/CN=custom-metrics",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key
