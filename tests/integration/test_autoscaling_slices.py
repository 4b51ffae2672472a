"""Slices on the real control plane (issue 17 item 5): an autoscaled deployment that outgrows
its topology domain opens a slice in the next best domain, driven through /scale exactly as
the HPA controller writes it.

What must hold: every pod of a slice runs in the slice's domain; each slice's router selects
only its slice's prefill and decode pods (the API server evaluates the selectors the routers
are started with), so every P->D pair stays inside one slice; scaling down empties the newest
slice first and deletes it; no running pod is replaced or restarted by any step, and the
engine revision, the spec and its generation stay as they were.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from helpers.factories import pdd_body
from helpers.operator_proc import OperatorProcess
from helpers.pdd_objects import get_pdd
from helpers.waits import wait_for
from pdd_localcluster import NodeSimulator, SimNode
from pdd_localcluster.nodes import gpu_node_capacity, gpu_node_labels

GROUP, VERSION, PLURAL, SCALERS = "pdd.dev", "v1alpha1", "pddeployments", "pddrolescalers"
# Two domains of this module's own under a level no other node carries, tainted so that no
# other test's pod lands there: `near` (one 8-GPU node: the best fit for the first slice) and
# `far` (two 8-GPU nodes).
LEVEL = "pdd.test/slices-domain"
TAINT = {"key": "pdd.test/slices", "value": "true", "effect": "NoSchedule"}
TOLERATION = {**TAINT, "operator": "Equal"}
DOMAINS = {"near": 1, "far": 2}
AUTOSCALING = {
    "decode": {"minReplicas": 1, "maxReplicas": 8},
    "prefill": {"minReplicas": 1, "maxReplicas": 4},
    "follower": "prefill",
    "ratio": {"prefill": 1, "decode": 2},
}


@pytest.fixture(scope="module")
def domain_nodes(node_sim: NodeSimulator) -> Iterator[dict[str, str]]:
    """node name -> its domain; deleted after the module."""
    nodes = [
        SimNode(
            f"slices-{domain}-{i}",
            labels={**gpu_node_labels(8, f"clique-slices-{domain}"), LEVEL: domain},
            capacity=gpu_node_capacity(8),
            taints=(TAINT,),
        )
        for domain, count in DOMAINS.items()
        for i in range(count)
    ]
    with node_sim.nodes_for_a_while(nodes):
        yield {n.name: n.labels[LEVEL] for n in nodes}


def custom(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def scale(api: client.ApiClient, ns: str, replicas: int) -> None:
    custom(api).patch_namespaced_custom_object_scale(
        GROUP, VERSION, ns, SCALERS, "llama-decode", {"spec": {"replicas": replicas}}
    )


def engine_pods(api: client.ApiClient, ns: str) -> dict[str, client.V1Pod]:
    pods = client.CoreV1Api(api).list_namespaced_pod(ns, label_selector="pdd.dev/role")
    return {
        p.metadata.name: p
        for p in pods.items
        if p.metadata.labels.get("pdd.dev/role") in ("prefill", "decode")
        and p.metadata.deletion_timestamp is None
    }


def ready(pod: client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def settled(
    api: client.ApiClient, ns: str, slices: list[tuple[str, int, int]]
) -> dict[str, Any] | None:
    """The PDDeployment once status.slices says `slices` (domain, prefill, decode), Ready,
    with exactly that many engine pods, all ready."""
    body = get_pdd(api, ns, "llama")
    status = body.get("status", {})
    shown = [(s["domain"], s["prefill"], s["decode"]) for s in status.get("slices", [])]
    if shown != slices:
        return None
    ready_condition = [c for c in status.get("conditions", []) if c["type"] == "Ready"]
    if not ready_condition or ready_condition[0]["status"] != "True":
        return None
    pods = engine_pods(api, ns)
    if len(pods) != sum(p + d for _, p, d in slices) or not all(map(ready, pods.values())):
        return None
    return body


def probe_peer(api: client.ApiClient, ns: str, pod: str) -> str | None:
    """The decode pod the operator asked `pod` to probe against (pdd.dev/probe-peer)."""
    annotations = client.CoreV1Api(api).read_namespaced_pod(pod, ns).metadata.annotations
    return (annotations or {}).get("pdd.dev/probe-peer")


def prober_pods(api: client.ApiClient, ns: str) -> list[str]:
    """The pods the sidecar Role lets patch themselves (their probe answers), once it lists
    more than the home's."""
    role = client.RbacAuthorizationV1Api(api).read_namespaced_role("llama-sidecar", ns)
    names = next(r.resource_names for r in role.rules if r.verbs == ["patch"])
    return names if len(names) > 1 else []


def router_selectors(api: client.ApiClient, ns: str, name: str) -> dict[str, str]:
    """The router Deployment's --prefill-selector and --decode-selector as selector strings."""
    deployment = client.AppsV1Api(api).read_namespaced_deployment(name, ns)
    args = deployment.spec.template.spec.containers[0].args
    out: dict[str, list[str]] = {}
    current = ""
    for arg in args:
        if arg.startswith("--"):
            current = arg if arg in ("--prefill-selector", "--decode-selector") else ""
            if current:
                out[current] = []
        elif current:
            out[current].append(arg)
    return {flag.split("-")[2]: ",".join(values) for flag, values in out.items()}


def selected_domains(
    api: client.ApiClient, ns: str, selector: str, domains: dict[str, str]
) -> dict[str, str]:
    """The pods the API server selects with `selector`: name -> the domain of their node."""
    pods = client.CoreV1Api(api).list_namespaced_pod(ns, label_selector=selector).items
    return {
        p.metadata.name: domains.get(p.spec.node_name, "?")
        for p in pods
        if p.metadata.deletion_timestamp is None
    }


def identities(pods: dict[str, client.V1Pod]) -> dict[str, tuple[str, str, int]]:
    """name -> (uid, node, restarts): what a replaced or restarted pod changes."""
    return {
        name: (
            p.metadata.uid,
            p.spec.node_name,
            sum(s.restart_count for s in p.status.container_statuses or []),
        )
        for name, p in pods.items()
    }


def test_growth_beyond_the_domain_opens_a_slice_and_shrinking_empties_the_newest_first(
    operator: OperatorProcess,
    api_client: client.ApiClient,
    namespace: str,
    domain_nodes: dict[str, str],
) -> None:
    ns, apps = namespace, client.AppsV1Api(api_client)
    role = {"gpusPerInstance": 2, "tolerations": [TOLERATION]}
    body = pdd_body(
        "llama",
        ns,
        prefill={"replicas": 1, **role},
        decode={"replicas": 2, **role},
        autoscaling=AUTOSCALING,
        topology={"placement": "required", "levels": [LEVEL]},
    )
    custom(api_client).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
    first = wait_for(lambda: settled(api_client, ns, [("near", 1, 2)]), 120, what="1P/2D")
    assert first["status"]["placement"]["domain"] == "near"  # the best fit: fewest free GPUs
    spec, generation = first["spec"], first["metadata"]["generation"]
    revision = first["status"]["decode"]["revision"]
    home = identities(engine_pods(api_client, ns))
    home_router = apps.read_namespaced_deployment("llama-router", ns).metadata.uid

    # Decode 2 -> 6: near (8 GPUs) holds 2 decode + 1 prefill (6 GPUs) and no more; the other
    # 4 decodes and their 2 prefills (12 GPUs) open slice 1 in far.
    scale(api_client, ns, 6)
    up = wait_for(
        lambda: settled(api_client, ns, [("near", 1, 2), ("far", 2, 4)]), 120, what="slice 1"
    )
    assert [s["index"] for s in up["status"]["slices"]] == [0, 1]
    assert up["status"]["decodeReplicas"] == "6/6"
    assert up["status"]["prefillReplicas"] == "3/3"
    pods = engine_pods(api_client, ns)
    for name, identity in home.items():  # the home pods are the same pods, never restarted
        assert identities({name: pods[name]})[name] == identity, name
    slice_of = {name: p.metadata.labels.get("pdd.dev/slice", "0") for name, p in pods.items()}
    for name, pod in pods.items():  # every pod inside its slice's domain
        assert domain_nodes[pod.spec.node_name] == ("near" if slice_of[name] == "0" else "far")
    # Pairing inside each slice: each router's selectors select exactly its slice's pods.
    for router, domain in (("llama-router", "near"), ("llama-router-s1", "far")):
        selectors = router_selectors(api_client, ns, router)
        for role_name, selector in selectors.items():
            chosen = selected_domains(api_client, ns, selector, domain_nodes)
            want = {
                n
                for n, p in pods.items()
                if p.metadata.labels["pdd.dev/role"] == role_name
                and domain_nodes[p.spec.node_name] == domain
            }
            assert set(chosen) == want, (router, role_name, selector)
    # Each slice's KV path is measured inside it: slice 1's first prefill pod is asked to
    # probe slice 1's first decode pod, and the sidecar Role lets it write its answer.
    asked = wait_for(
        lambda: probe_peer(api_client, ns, "llama-prefill-s1-0"), 60, what="slice 1 asked"
    )
    assert asked == "llama-decode-s1-0"
    assert probe_peer(api_client, ns, "llama-prefill-0") == "llama-decode-0"
    writers = wait_for(lambda: prober_pods(api_client, ns) or None, 30, what="sidecar Role")
    assert writers == ["llama-prefill-0", "llama-prefill-s1-0"]
    assert up["status"]["decode"]["revision"] == revision
    assert (up["spec"], up["metadata"]["generation"]) == (spec, generation)
    grown = identities(pods)

    # Decode 6 -> 3: the newest slice shrinks first (far 4 -> 1 decode, 2 -> 1 prefill).
    scale(api_client, ns, 3)
    wait_for(lambda: settled(api_client, ns, [("near", 1, 2), ("far", 1, 1)]), 120, what="shrunk")
    pods = engine_pods(api_client, ns)
    assert set(pods) <= set(grown)
    assert {n: identities(pods)[n] for n in pods} == {n: grown[n] for n in pods}

    # Decode 3 -> 2: slice 1 is emptied and deleted (its StatefulSets and router) before the
    # home slice would shrink.
    scale(api_client, ns, 2)
    wait_for(lambda: settled(api_client, ns, [("near", 1, 2)]), 120, what="slice 1 removed")
    gone = wait_for(
        lambda: (
            not [
                s.metadata.name
                for s in apps.list_namespaced_stateful_set(ns).items
                if s.metadata.name.endswith("-s1")
            ]
            and not [
                d.metadata.name
                for d in apps.list_namespaced_deployment(ns).items
                if d.metadata.name.endswith("-s1")
            ]
        ),
        60,
        what="slice 1's workloads deleted",
    )
    assert gone
    assert identities(engine_pods(api_client, ns)) == home
    assert apps.read_namespaced_deployment("llama-router", ns).metadata.uid == home_router
    final = get_pdd(api_client, ns, "llama")
    assert final["status"]["decode"]["revision"] == revision
    assert (final["spec"], final["metadata"]["generation"]) == (spec, generation)
