"""`make demo`: a local control plane with simulated 8-GPU nodes, the operator, the example,
and a request through the example's router.

Starts etcd + kube-apiserver + controllers + scheduler on loopback, registers two NVLink
cliques of simulated HGX nodes (with RDMA NICs and the topology the node agent would publish),
installs the CRD, runs the operator and applies examples/vllm-2p4d.yaml. Its pods really run,
as local processes at 127.90.x.y (the local cluster's PodRuntime): the preflight, the pdd
sidecars, vllm-router with the flags the operator rendered and, as the engine, the reference
engine (a test double of vLLM: no GPU here) in place of the example's vllm/vllm-openai image.
Two settings differ from the example, printed when applied: UCX's transports (TCP on
loopback: this machine has no RDMA NIC or GPU) and no shared cache claim (no volume binder).

Once the example is Ready, one request goes through its router; the demo prints the answer,
the prefill and decode pods that served it and the KV bytes the decode pulled and verified.
`--once` exits 0 after that request, non-zero with the reason otherwise; without it, the demo
runs until Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from helpers.operator_proc import OperatorProcess, install_crd  # noqa: E402
from helpers.traffic import complete  # noqa: E402
from pdd_contract.labels import LABEL_DEPLOYMENT, LABEL_GPUDIRECT, LABEL_RDMA_NICS  # noqa: E402
from pdd_localcluster.__main__ import loopback_pod_ips  # noqa: E402
from pdd_localcluster.controlplane import LocalControlPlane  # noqa: E402
from pdd_localcluster.nodes import SimNode, gpu_fleet, gpu_node_capacity  # noqa: E402
from pdd_localcluster.nodesim import NodeSimulator  # noqa: E402
from pdd_localcluster.runtime import PodRuntime  # noqa: E402
from pdd_localcluster.runtime.images import KNOWN_IMAGES, repository  # noqa: E402

EXAMPLE = ROOT / "examples" / "vllm-2p4d.yaml"
REFENGINE = "ghcr.io/pdd-dev/pdd-refengine"
# Here the KV moves over TCP on loopback: no RDMA NIC, no GPU.
LOCAL_TRANSPORTS = ["tcp", "cuda_copy"]
RDMA_RESOURCE = "rdma/rdma_shared_device_a"


def demo_nodes() -> list[SimNode]:
    """Two cliques of four HGX nodes; every node has 8 RDMA NICs and dma-buf GPUDirect."""
    nodes = []
    for node in gpu_fleet(cliques=2, nodes_per_clique=4, racks_per_clique=2):
        capacity = {**gpu_node_capacity(8), RDMA_RESOURCE: "1k"}
        labels = {**node.labels, LABEL_GPUDIRECT: "dmabuf", LABEL_RDMA_NICS: "8"}
        nodes.append(SimNode(node.name, labels=labels, capacity=capacity))
    return nodes


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--state-dir", default=str(ROOT / ".tmp" / "demo"))
    parser.add_argument("--once", action="store_true")
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    state = Path(args.state_dir)
    started = time.time()
    with LocalControlPlane(state) as cp:
        print(
            f"control plane up: kube-apiserver {cp.version} at {cp.server} "
            f"({cp.start_seconds:.1f}s); kubeconfig {cp.kubeconfig}",
            flush=True,
        )
        body = yaml.safe_load(EXAMPLE.read_text())
        engine_image = repository(body["spec"]["engine"]["image"])
        images = {**KNOWN_IMAGES, engine_image: KNOWN_IMAGES[REFENGINE]}
        runtime = PodRuntime(cp.kubeconfig, state / "runtime", images=images)
        print(
            f"pods run as local processes (logs: {state / 'runtime' / 'pods'}); the engine "
            f"image {engine_image} runs as the reference engine, a test double (no GPU here)",
            flush=True,
        )
        nodes = demo_nodes()
        with NodeSimulator(
            cp.kubeconfig, nodes, pod_ips=loopback_pod_ips(), runtime=runtime
        ) as sim:
            print(f"simulated nodes: {', '.join(sim.node_names)}", flush=True)
            api = client.ApiClient(_config(cp))
            install_crd(api)
            operator = OperatorProcess(
                cp.kubeconfig, state / "operator.log", resync_seconds=30
            ).start()
            try:
                return run_example(api, operator, body, args.once, args.timeout, started)
            finally:
                operator.kill()


def run_example(
    api: client.ApiClient,
    operator: OperatorProcess,
    body: dict[str, Any],
    once: bool,
    timeout: float,
    started: float,
) -> int:
    ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
    prepare_model_source(api, body)
    body["spec"]["kvTransfer"].setdefault("ucx", {})["transports"] = LOCAL_TRANSPORTS
    print(f"spec.kvTransfer.ucx.transports: {LOCAL_TRANSPORTS} here (TCP on loopback)", flush=True)
    objects = client.CustomObjectsApi(api)
    objects.create_namespaced_custom_object("pdd.dev", "v1alpha1", ns, "pddeployments", body)
    print(f"applied {EXAMPLE.relative_to(ROOT)}", flush=True)
    deadline = time.time() + timeout
    last = ""
    stop = {"now": False}
    signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
    while not stop["now"]:
        pdd = objects.get_namespaced_custom_object("pdd.dev", "v1alpha1", ns, "pddeployments", name)
        line = summary(pdd)
        if line != last:
            print(line, flush=True)
            last = line
        if is_ready(pdd) and once:
            print_ready(api, pdd, ns)
            print(f"Ready after {time.time() - started:.1f}s from a cold start", flush=True)
            return send_request(api, ns, name, body["spec"]["model"].get("servedName"))
        if once and time.time() > deadline:
            print(f"not Ready after {timeout:.0f}s: {json.dumps(pdd.get('status', {}), indent=1)}")
            print(operator.tail(), file=sys.stderr)
            return 1
        time.sleep(1)
    return 0


def prepare_model_source(api: client.ApiClient, body: dict[str, Any]) -> None:
    """What the example's model source needs: its token Secret (a placeholder: the simulated
    engines download nothing). The shared cache claim is left out: the local control plane
    runs no volume binder, and pods with an unbound claim are never scheduled."""
    hf = body["spec"]["model"].get("source", {}).get("huggingFace", {})
    hf.pop("cache", None)
    ref = hf.get("tokenSecretRef")
    if ref:
        secret = {
            "metadata": {"name": ref["name"]},
            "stringData": {ref.get("key", "HF_TOKEN"): "hf_placeholder"},
        }
        client.CoreV1Api(api).create_namespaced_secret(body["metadata"]["namespace"], secret)
        print(f"created Secret {ref['name']} (the example's Hugging Face token)", flush=True)


def is_ready(pdd: dict[str, Any]) -> bool:
    status = pdd.get("status", {})
    conditions = {c["type"]: c for c in status.get("conditions", [])}
    return (
        status.get("observedGeneration") == pdd["metadata"]["generation"]
        and conditions.get("Ready", {}).get("status") == "True"
    )


def summary(pdd: dict[str, Any]) -> str:
    status = pdd.get("status", {})
    conditions = {c["type"]: c for c in status.get("conditions", [])}
    ready = conditions.get("Ready", {})
    placed = conditions.get("Placed", {})
    return (
        f"NAME {pdd['metadata']['name']}  PREFILL {status.get('prefillReplicas', '-')}  "
        f"DECODE {status.get('decodeReplicas', '-')}  READY {ready.get('status', '-')} "
        f"({ready.get('reason', '')})  PLACED {placed.get('message', '-')}"
    )


def print_ready(api: client.ApiClient, pdd: dict[str, Any], ns: str) -> None:
    print("\nconditions:")
    for cond in pdd["status"]["conditions"]:
        print(f"  {cond['type']:<20} {cond['status']:<6} {cond['reason']:<22} {cond['message']}")
    print("\npods:")
    pods = client.CoreV1Api(api).list_namespaced_pod(ns, label_selector=LABEL_DEPLOYMENT)
    for pod in sorted(pods.items, key=lambda p: p.metadata.name):
        node, ip = pod.spec.node_name, pod.status.pod_ip
        print(f"  {pod.metadata.name:<34} {pod.status.phase:<8} node={node:<10} ip={ip}")


def send_request(api: client.ApiClient, ns: str, name: str, model: str | None) -> int:
    """One completion through the example's router; 0 when tokens came out with verified KV."""
    pods = client.CoreV1Api(api).list_namespaced_pod(
        ns, label_selector=f"{LABEL_DEPLOYMENT}={name}"
    )
    routers = [p for p in pods.items if p.metadata.labels.get("pdd.dev/role") == "router"]
    if not routers or not routers[0].status.pod_ip:
        print("no router pod with an address", file=sys.stderr)
        return 1
    url = f"http://{routers[0].status.pod_ip}:8000"
    prompt = "Explain prefill/decode disaggregation in one sentence."
    print(f"\nPOST {url}/v1/completions  prompt={prompt!r}", flush=True)
    outcome = complete(url, model or name, prompt, max_tokens=12, timeout=60)
    if not outcome.ok:
        print(f"the request failed: {outcome.error}", file=sys.stderr)
        return 1
    served = outcome.served
    print(f"answer: {outcome.text.strip()!r}")
    print(
        f"served by prefill {served.get('prefill')} ({served.get('prefill_address')}) and decode "
        f"{served.get('decode')} ({served.get('decode_address')})"
    )
    print(f"KV moved prefill -> decode by NIXL: {served.get('kv_bytes')} bytes in "
          f"{served.get('kv_seconds')} s, verified: {served.get('kv_verified')}; "
          f"request took {outcome.seconds:.2f} s", flush=True)  # fmt: skip
    return 0 if served.get("kv_verified") else 1


def _config(cp: LocalControlPlane) -> client.Configuration:
    from kubernetes import config

    configuration = client.Configuration()
    config.load_kube_config(config_file=str(cp.kubeconfig), client_configuration=configuration)
    return configuration


if __name__ == "__main__":
    sys.exit(main())
