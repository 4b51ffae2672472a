"""The request path: a request goes in through the router the operator deployed, tokens come out.

A PDDeployment per engine (vLLM, SGLang) is applied to the real control plane and reconciled by
the real operator. Its pods then really run, at loopback addresses of their own (the local
cluster's PodRuntime): the preflight init container, the pdd sidecar, the upstream router from
its pinned wheel (vllm-router for vLLM, smg for SGLang) with the flags and Kubernetes service
discovery the operator rendered, and the engine. The engine is the reference engine, the one
test double here (no model, no GPU): it speaks each engine's P/D protocol and moves real KV
bytes prefill -> decode with NIXL (UCX over loopback), metadata through the sidecars, and the
decode checks every byte before it answers.

Then, under steady traffic: a prefill pod is deleted (no request may hang past its timeout,
and the router must stop choosing it), the engine image is rolled (a coordinated rollout: no
request may pair a prefill and a decode of different revisions, and the router must always
have a pair to send to), and decode is scaled up and down (no request may fail). Per engine
the summary prints the router binary and version, the requests sent / succeeded / failed, the
failures and the KV bytes the decodes verified.
"""

from __future__ import annotations

import importlib.metadata
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from helpers.operator_proc import OperatorProcess
from helpers.pod_watch import watching_pods
from helpers.running_pods import (
    OwnNodes,
    ready_router_url,
    ready_router_url_of,
    refengine_image,
    refengine_pdd,
    router_pods,
    running_nodes,
)
from helpers.traffic import Outcome, Tally, complete, steady_traffic
from helpers.waits import wait_for
from pdd_localcluster import LocalControlPlane
from pdd_localcluster.runtime import PodRuntime

GROUP, VERSION, PLURAL = "pdd.dev", "v1alpha1", "pddeployments"
NODES = OwnNodes("pdd.test/request-path", ("rp-0", "rp-1"))
# engine -> the router's wheel (its console script runs in the router pod)
ROUTER = {"vllm": "vllm-router", "sglang": "smg"}
TIMEOUT_S = 20.0  # each request's own timeout: nothing may take longer than this
READY_S = 240.0

REPORT: dict[str, dict[str, Any]] = {}


@pytest.fixture(scope="module")
def runtime(
    control_plane: LocalControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PodRuntime]:
    state = tmp_path_factory.mktemp("request-path")
    with running_nodes(control_plane, state, NODES, "127.87") as rt:
        yield rt


def pdd_body(name: str, engine: str, release: str | None = None) -> dict[str, Any]:
    return refengine_pdd(name, engine, NODES, replicas=2, release=release)


@dataclass
class Revisions:
    """Which engine revision each pod IP had, seen by watching the pods: the runtime never
    hands an address out twice, so an IP names one pod for good."""

    by_ip: dict[str, str] = field(default_factory=dict)

    def seen(self, pod: Any) -> None:
        """Called with every version of every pod the watch delivers."""
        if pod.status.pod_ip:
            self.by_ip[pod.status.pod_ip] = pod.metadata.labels["pdd.dev/revision"]

    def crossed(self, outcomes: list[Outcome]) -> list[dict[str, Any]]:
        """Answers whose prefill and decode were of different revisions."""
        return [
            o.served
            for o in outcomes
            if o.ok
            and self.by_ip.get(o.served.get("prefill_address", ""))
            != self.by_ip.get(o.served.get("decode_address", ""))
        ]


def status(api: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    obj = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, name
    )
    return obj


def serving(api: client.ApiClient, ns: str, name: str) -> bool:
    obj = status(api, ns, name)
    st = obj.get("status", {})
    conditions = {c["type"]: c["status"] for c in st.get("conditions", [])}
    settled = all(
        role.get("updated", 0) == role.get("desired", 0) == role.get("ready", 0)
        for role in (st.get("prefill", {}), st.get("decode", {}))
    )
    return (
        st.get("observedGeneration") == obj["metadata"]["generation"]
        and conditions.get("Ready") == "True"
        and settled
    )


def wait_serving(api: client.ApiClient, ns: str, name: str, runtime: PodRuntime) -> None:
    try:
        wait_for(lambda: serving(api, ns, name), READY_S, what=f"{ns}/{name} Ready")
    except AssertionError as err:
        pytest.fail(f"{err}\n{diagnosis(api, ns, name, runtime)}")


def diagnosis(api: client.ApiClient, ns: str, name: str, runtime: PodRuntime) -> str:
    lines = [f"status: {status(api, ns, name).get('status')}"]
    for pod in client.CoreV1Api(api).list_namespaced_pod(ns).items:
        ready = [c.status for c in pod.status.conditions or [] if c.type == "Ready"]
        lines.append(f"pod {pod.metadata.name} {pod.status.phase} ip={pod.status.pod_ip} {ready}")
        for c in pod.spec.init_containers or []:
            lines.append(_tail(runtime, pod, c.name))
        for c in pod.spec.containers:
            lines.append(_tail(runtime, pod, c.name))
    return "\n".join(lines)


def _tail(runtime: PodRuntime, pod: Any, container: str) -> str:
    path = runtime.log_path(pod.to_dict() | {"metadata": pod.metadata.to_dict()}, container)
    text = Path(path).read_text(errors="replace")[-1500:] if Path(path).exists() else "(no log)"
    return f"--- {pod.metadata.name}/{container}\n{text}"


def verified_on_decodes(core: client.CoreV1Api, ns: str, name: str) -> int:
    """What the decode pods' own metrics say they verified."""
    total = 0
    selector = f"pdd.dev/deployment={name},pdd.dev/role=decode"
    for pod in core.list_namespaced_pod(ns, label_selector=selector).items:
        with urllib.request.urlopen(f"http://{pod.status.pod_ip}:8000/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("pdd_refengine_kv_bytes_verified_total"):
                    total += int(float(line.rsplit(" ", 1)[1]))
    return total


def patch_spec(api: client.ApiClient, ns: str, name: str, spec: dict[str, Any]) -> None:
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, name, {"spec": spec}
    )


def settle(seconds: float) -> None:
    time.sleep(seconds)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_requests_through_the_router_return_tokens_with_verified_kv(
    operator: OperatorProcess,
    api_client: client.ApiClient,
    namespace: str,
    runtime: PodRuntime,
    engine: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    core = client.CoreV1Api(api_client)
    name = f"tiny-{engine}"
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, pdd_body(name, engine)
    )
    wait_serving(api_client, namespace, name, runtime)
    url = ready_router_url(core, namespace, name)
    tally = Tally()

    # Requests one by one: tokens come out, the KV each moved was checked by the decode.
    first = [complete(url, "tiny", f"hello {i} " * 20, timeout=TIMEOUT_S) for i in range(6)]
    tally.add(first)
    assert all(o.ok for o in first), [o.error for o in first]
    assert all(o.served.get("kv_verified") and o.kv_bytes > 0 for o in first), first
    served_by = {(o.served["prefill"], o.served["decode"]) for o in first}
    assert all(p.startswith(f"{name}-prefill-") and d.startswith(f"{name}-decode-")
               for p, d in served_by), served_by  # fmt: skip
    assert verified_on_decodes(core, namespace, name) == sum(o.kv_bytes for o in first)

    revisions = Revisions()
    with (
        watching_pods(core, namespace, "pdd.dev/revision", on_pod=revisions.seen),
        watching_pods(core, namespace, router_pods(name)) as routers,
    ):
        url = lambda: ready_router_url_of(routers.pods())  # noqa: E731 - asked per request
        disruptions = run_disruptions(api_client, namespace, name, runtime, engine, url)
    for outcomes in disruptions.values():
        tally.add(outcomes)

    # Deleting a prefill pod: no request hung, and once replaced every request succeeded.
    deleted = disruptions["delete prefill pod"]
    assert max(o.seconds for o in deleted) < TIMEOUT_S + 5
    assert all(o.ok for o in deleted[-8:]), [o.error for o in deleted[-8:]]
    # The coordinated rollout: no request paired revisions, and the router always had a
    # prefill and a decode to send to (both routers answer 503 when they have none; the old
    # routers did, while the rollout replaced their last pod of a role).
    rolled = disruptions["roll the engine image"]
    assert revisions.crossed(rolled) == []
    assert [o.error for o in rolled if o.status == 503] == []
    # Scaling decode: no request failed.
    scaled = disruptions["scale decode 2 -> 3 -> 2"]
    assert all(o.ok for o in scaled), [o.error for o in scaled if not o.ok]

    REPORT[engine] = report = {
        "router": f"{ROUTER[engine]} {importlib.metadata.version(ROUTER[engine])}",
        "sent": tally.sent,
        "succeeded": tally.succeeded,
        "failed": tally.failed,
        "kv_bytes_verified": tally.kv_bytes_verified,
        "failed_per_step": {k: sum(not o.ok for o in v) for k, v in disruptions.items()},
        "failures": [
            f"{step} after {o.seconds:.2f} s: {o.error}"
            for step, outcomes in disruptions.items()
            for o in outcomes
            if not o.ok
        ][:6],
        "slowest_s": round(tally.slowest_s, 2),
        "slowest_per_step": {
            k: round(max((o.seconds for o in v), default=0.0), 2) for k, v in disruptions.items()
        },
    }
    with capsys.disabled():
        print(f"\nrequest path [{engine}]: {report}")


# The previous protocol generation each engine still supports: vLLM 0.11's
# kv_transfer_params and SGLang 0.5.4's bootstrap exchange (the newest run above).
PREVIOUS = [("vllm", "0.11.0"), ("sglang", "0.5.4")]


@pytest.mark.parametrize(("engine", "release"), PREVIOUS)
def test_the_previous_protocol_generation_serves_through_the_router(
    operator: OperatorProcess,
    api_client: client.ApiClient,
    namespace: str,
    runtime: PodRuntime,
    engine: str,
    release: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Engines of the previous release, wired for it and speaking its P/D protocol, serve
    through the same router, one by one and under steady traffic, every KV byte verified.
    (The disruptions above do not depend on the protocol; they run on the newest.)"""
    core = client.CoreV1Api(api_client)
    name = f"prev-{engine}"
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, pdd_body(name, engine, release)
    )
    wait_serving(api_client, namespace, name, runtime)
    url = ready_router_url(core, namespace, name)
    tally = Tally()
    first = [complete(url, "tiny", f"hello {i} " * 20, timeout=TIMEOUT_S) for i in range(6)]
    tally.add(first)
    assert all(o.ok and o.served.get("kv_verified") and o.kv_bytes > 0 for o in first), first
    with steady_traffic(url, "tiny", workers=2, timeout=TIMEOUT_S) as traffic:
        settle(6)
    tally.add(traffic.outcomes)
    assert traffic.outcomes and all(o.ok for o in traffic.outcomes), [
        o.error for o in traffic.outcomes if not o.ok
    ]
    assert verified_on_decodes(core, namespace, name) == tally.kv_bytes_verified
    report = {"sent": tally.sent, "failed": tally.failed, "kv_bytes": tally.kv_bytes_verified}
    with capsys.disabled():
        print(f"\nrequest path [{engine} {release} protocol]: {report}")


# Four long prefixes (about 500 bytes each), each asked with four endings, as in
# test_routing_policies.py; they differ from their first word on.
PREFIXES = [
    f"{w} report. " + f"{w} section of a shared context. " * 14 for w in ("Ab", "Cd", "Ef", "Gh")
]
ENDINGS = ["Summarise it.", "List the names.", "Translate it.", "What comes next?"]
# vllm-router 0.1.17 binds the prefills of a pool a request named on its one-second tick, and
# probes one whose binding failed again 3 s later (src/routers/http/pd_kv_state.rs): how long
# until it is subscribed depends on the machine's load, so the test waits for it to show.
SUBSCRIBE_TIMEOUT_S = 60.0
# Events reach the routers asynchronously (ZMQ): a request sent right after the one that
# stored its prefix may be routed before they arrive.
EVENTS_SETTLE_S = 0.5


def ready_router_urls(core: client.CoreV1Api, ns: str, name: str) -> list[str]:
    pods = core.list_namespaced_pod(
        ns, label_selector=f"pdd.dev/deployment={name},pdd.dev/role=router"
    ).items
    ready = [
        p
        for p in pods
        if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
    ]
    return [f"http://{p.status.pod_ip}:8000" for p in ready if p.status.pod_ip]


def prefill_of(url: str, prompt: str) -> str:
    outcome = complete(url, "tiny", prompt, max_tokens=2, timeout=TIMEOUT_S)
    assert outcome.ok and outcome.served.get("kv_verified"), outcome
    return str(outcome.served["prefill"])


def test_kv_aware_routing_sends_a_prefix_to_the_prefill_that_holds_it(
    operator: OperatorProcess,
    api_client: client.ApiClient,
    namespace: str,
    runtime: PodRuntime,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """spec.router.prefillPolicy kv_aware with two router replicas, as the operator renders
    them: the routers find the prefills by Kubernetes discovery and subscribe to their KV
    events. Each prefix is first served by one prefill pod directly, which no router sees
    (as traffic through another replica, or before a router restarted, is not); its later
    requests, through either router, reach that prefill: the routers know it from the
    prefill's events alone."""
    core = client.CoreV1Api(api_client)
    name = "kv-aware"
    body = pdd_body(name, "vllm")
    body["spec"]["router"] |= {"replicas": 2, "prefillPolicy": "kv_aware"}
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body
    )
    wait_serving(api_client, namespace, name, runtime)
    conditions = {c["type"]: c for c in status(api_client, namespace, name)["status"]["conditions"]}
    assert conditions["KVAwareRouting"]["status"] == "True", conditions["KVAwareRouting"]
    wait_for(lambda: len(ready_router_urls(core, namespace, name)) == 2, 60, what="2 routers")
    routers = ready_router_urls(core, namespace, name)
    for url in routers:
        prefill_of(url, "An unrelated opening request.")
    prefills = pod_urls(core, namespace, name, "prefill")
    wait_subscribed(routers, prefills)
    holder: dict[str, str] = {}
    for i, prefix in enumerate(PREFIXES):
        pod, url = prefills[i % len(prefills)]
        outcome = complete(url, "tiny", prefix + ENDINGS[0], max_tokens=2, timeout=TIMEOUT_S)
        assert outcome.ok, outcome
        holder[prefix] = pod
    time.sleep(EVENTS_SETTLE_S)
    later = [
        (holder[prefix], prefill_of(routers[j % 2], prefix + ending))
        for prefix in PREFIXES
        for j, ending in enumerate(ENDINGS[1:])
    ]
    hits = sum(held == went for held, went in later)
    with capsys.disabled():
        print(
            f"\nrequest path [vllm kv_aware, two router replicas]: prefix hit rate "
            f"{hits / len(later):.2f} ({hits}/{len(later)}), prefixes held by "
            f"{sorted(set(holder.values()))}"
        )
    assert hits / len(later) >= 0.9, later


def wait_subscribed(routers: list[str], prefills: list[tuple[str, str]]) -> None:
    """Until every router has routed a prompt to the prefill that alone held its prefix (a
    fresh prefix each time, stored there by a direct request no router sees): then each router
    reads each prefill's KV events."""
    pending = {(router, pod, url) for router in routers for pod, url in prefills}
    attempt = 0

    def one_more_shown() -> bool:
        nonlocal attempt
        for router, pod, url in sorted(pending):
            attempt += 1
            warmup = f"Warm-up {attempt}. " + f"Line {attempt} of a context no one shares. " * 14
            assert complete(url, "tiny", warmup + ENDINGS[0], max_tokens=2, timeout=TIMEOUT_S).ok
            time.sleep(EVENTS_SETTLE_S)
            if prefill_of(router, warmup + ENDINGS[1]) == pod:
                pending.discard((router, pod, url))
        return not pending

    wait_for(one_more_shown, SUBSCRIBE_TIMEOUT_S, what="the routers to read every prefill's events")


def pod_urls(core: client.CoreV1Api, ns: str, name: str, role: str) -> list[tuple[str, str]]:
    """(name, engine URL) of the role's pods, by name."""
    pods = core.list_namespaced_pod(
        ns, label_selector=f"pdd.dev/deployment={name},pdd.dev/role={role}"
    ).items
    return sorted((p.metadata.name, f"http://{p.status.pod_ip}:8000") for p in pods)


def run_disruptions(
    api: client.ApiClient,
    ns: str,
    name: str,
    runtime: PodRuntime,
    engine: str,
    url: Callable[[], str],
) -> dict[str, list[Outcome]]:
    """Each step under steady traffic; `url` picks a ready router before every request, as the
    router Service would."""
    core = client.CoreV1Api(api)
    results: dict[str, list[Outcome]] = {}
    with steady_traffic(url, "tiny", workers=2, timeout=TIMEOUT_S) as traffic:
        settle(2)
        core.delete_namespaced_pod(f"{name}-prefill-0", ns)
        wait_for(lambda: not serving(api, ns, name), 30, what="the deletion to be seen")
        wait_serving(api, ns, name, runtime)
        settle(8)
    results["delete prefill pod"] = traffic.outcomes

    with steady_traffic(url, "tiny", workers=2, timeout=TIMEOUT_S) as traffic:
        settle(2)
        patch_spec(api, ns, name, {"engine": {"image": refengine_image(engine, build="b2")}})
        wait_serving(api, ns, name, runtime)
        settle(5)
    results["roll the engine image"] = traffic.outcomes

    with steady_traffic(url, "tiny", workers=2, timeout=TIMEOUT_S) as traffic:
        settle(2)
        patch_spec(api, ns, name, {"decode": {"replicas": 3}})
        wait_serving(api, ns, name, runtime)
        settle(3)
        patch_spec(api, ns, name, {"decode": {"replicas": 2}})
        wait_serving(api, ns, name, runtime)
        settle(5)
    results["scale decode 2 -> 3 -> 2"] = traffic.outcomes
    return results
