"""A coordinated rollout walked step by step on the real control plane, invariants checked at
every observation: the roles move in lockstep, decode first, one pod at a time."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

from kubernetes import client, watch

from helpers.factories import small_pdd_body
from helpers.operator_proc import OperatorProcess
from helpers.waits import wait_for

GROUP, VERSION, PLURAL = "pdd.dev", "v1alpha1", "pddeployments"
PREFILL, DECODE = 2, 3


def status(api: client.ApiClient, ns: str) -> dict[str, Any]:
    obj = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, "roll"
    )
    return obj


def ready_at(api: client.ApiClient, ns: str, image: str) -> bool:
    obj = status(api, ns)
    conds = {c["type"]: c for c in obj.get("status", {}).get("conditions", [])}
    return (
        obj["spec"]["engine"]["image"] == image
        and obj.get("status", {}).get("observedGeneration") == obj["metadata"]["generation"]
        and conds.get("Ready", {}).get("status") == "True"
    )


def observe(core: client.CoreV1Api, ns: str) -> list[tuple[str, str, bool]]:
    pods = core.list_namespaced_pod(ns, label_selector="pdd.dev/deployment=roll").items
    return [
        (
            p.metadata.labels["pdd.dev/role"],
            p.metadata.labels["pdd.dev/revision"],
            any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or []),
        )
        for p in pods
        if not p.metadata.deletion_timestamp
    ]


class PodCreations:
    """The role and revision of each pod in the order the API server created them (a watch
    delivers one collection's events in order), so "decode first" does not depend on a
    poll catching a short moment."""

    def __init__(self, api_client: client.ApiClient, namespace: str) -> None:
        self.core = client.CoreV1Api(api_client)
        self.namespace = namespace
        self.created: list[tuple[str, str]] = []
        self._watch = watch.Watch()
        version = self.core.list_namespaced_pod(namespace).metadata.resource_version
        self._thread = threading.Thread(target=self._follow, args=(version,), daemon=True)
        self._thread.start()

    def _follow(self, version: str) -> None:
        # The stream breaks when the control plane stops after the test: nothing is lost then.
        with contextlib.suppress(Exception):
            self._read(version)

    def _read(self, version: str) -> None:
        for event in self._watch.stream(
            self.core.list_namespaced_pod,
            self.namespace,
            label_selector="pdd.dev/deployment=roll",
            resource_version=version,
            timeout_seconds=240,
        ):
            if event["type"] == "ADDED":
                labels = event["object"].metadata.labels
                self.created.append((labels["pdd.dev/role"], labels["pdd.dev/revision"]))

    def stop(self) -> None:
        self._watch.stop()


def test_engine_upgrade_rolls_prefill_and_decode_in_lockstep(
    operator: OperatorProcess, api_client: client.ApiClient, namespace: str
) -> None:
    objects = client.CustomObjectsApi(api_client)
    body = small_pdd_body(
        "roll",
        namespace,
        engine={"image": "vllm/vllm-openai:v0.11.0"},
        prefill={"replicas": PREFILL},
        decode={"replicas": DECODE},
    )
    objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    wait_for(
        lambda: ready_at(api_client, namespace, "vllm/vllm-openai:v0.11.0"), 90, what="v1 Ready"
    )
    old = status(api_client, namespace)["status"]["prefill"]["revision"]
    pdbs = client.PolicyV1Api(api_client).list_namespaced_pod_disruption_budget(namespace).items
    assert {p.metadata.name for p in pdbs} == {"roll-prefill", "roll-decode"}
    assert all(p.spec.max_unavailable == 1 for p in pdbs)

    new_image = "vllm/vllm-openai:v0.12.0"
    creations = PodCreations(api_client, namespace)
    objects.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "roll", {"spec": {"engine": {"image": new_image}}}
    )
    core = client.CoreV1Api(api_client)
    progressing_messages: set[str] = set()
    new_counts: list[tuple[int, int]] = []
    deadline = time.time() + 180
    while not ready_at(api_client, namespace, new_image):
        assert time.time() < deadline, f"rollout did not finish; saw {new_counts}"
        pods = observe(core, namespace)
        revisions = {rev for _, rev, _ in pods}
        assert len(revisions) <= 2, f"more than two revisions at once: {revisions}"
        new = revisions - {old}
        if new:
            (rev,) = new
            new_prefill_ready = sum(1 for r, v, ok in pods if r == "prefill" and v == rev and ok)
            new_decode_ready = sum(1 for r, v, ok in pods if r == "decode" and v == rev and ok)
            new_prefill = sum(1 for r, v, _ in pods if r == "prefill" and v == rev)
            new_decode = sum(1 for r, v, _ in pods if r == "decode" and v == rev)
            # A new prefill pod always has a new decode pod to hand its KV blocks to.
            assert not new_prefill_ready or new_decode_ready, pods
            # Lockstep: the shares of updated pods stay within one pod of each other.
            assert abs(new_prefill / PREFILL - new_decode / DECODE) <= 1 / PREFILL + 1e-9, pods
            if not new_counts or new_counts[-1] != (new_prefill, new_decode):
                new_counts.append((new_prefill, new_decode))
        for role in ("prefill", "decode"):
            unready = sum(1 for r, _, ok in pods if r == role and not ok)
            total = PREFILL if role == "prefill" else DECODE
            missing = total - sum(1 for r, _, _ in pods if r == role)
            assert unready + missing <= 1, f"{role}: more than one instance out of service: {pods}"
        conds = {
            c["type"]: c
            for c in status(api_client, namespace).get("status", {}).get("conditions", [])
        }
        if conds.get("Progressing", {}).get("reason") == "RollingOut":
            progressing_messages.add(conds["Progressing"]["message"])
        time.sleep(0.1)

    final = observe(core, namespace)
    assert len({rev for _, rev, _ in final}) == 1 and final[0][1] != old
    assert len(final) == PREFILL + DECODE
    creations.stop()
    first_new = next(role for role, rev in creations.created if rev != old)
    assert first_new == "decode", f"decode must lead: {creations.created} (polled: {new_counts})"
    assert any("updated" in m for m in progressing_messages), progressing_messages
