"""The model's claim, checked before any engine pod starts, on the real API server: a
PDDeployment naming a missing one says what to create (ModelReady=False, an event) and gets no
engine pods; once it exists, the pods come without anyone touching the PDDeployment. A missing
claim may still be created (a provisioner): it is awaited (Reconciling, not Stalled) for a grace
period; a claim of the wrong modes is Stalled at once.

The model's token Secret is never read: the engines are not held for it, their pods take it by
reference (secretKeyRef), and a missing one is what those pods report
(tests/integration/test_secrets_unread.py, on running pods).

And the model's shape: a tensor-parallel size a known model cannot be split by (the engine
would fail at start on a real cluster) is Stalled with the sizes that fit, without engine pods,
and the deployment becomes Ready once it is one of them. A CPU tier of the KV cache that the
release counts in blocks of the model's KV waits for the shape without holding anything: the
pods serve without the tier until it is known."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from helpers.factories import pdd_body, sample_spec
from helpers.operator_proc import OperatorProcess, install_crd
from helpers.pdd_objects import ready_body
from helpers.waits import wait_for
from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.kube.client import KubeApi
from pdd_operator.rendering.children import render_children
from pdd_operator.rendering.context import RenderContext
from pdd_operator.status.drift import live_fingerprint, rendered_fingerprint

GROUP, VERSION, PLURAL = "pdd.dev", "v1alpha1", "pddeployments"
ENGINE_ROLES = ("prefill", "decode")


def create_pdd(api_client: client.ApiClient, namespace: str, source: dict[str, Any]) -> None:
    body = pdd_body(
        "llama",
        namespace,
        model={"name": "meta-llama/Llama-3.3-70B-Instruct", "source": source},
        prefill={"replicas": 1, "gpusPerInstance": 1},
        decode={"replicas": 1, "gpusPerInstance": 1},
        topology={"placement": "none"},
    )
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body
    )


def read_status(api_client: client.ApiClient, namespace: str) -> dict[str, Any]:
    body = client.CustomObjectsApi(api_client).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "llama"
    )
    return dict(body.get("status", {}))


def conditions(api_client: client.ApiClient, namespace: str) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in read_status(api_client, namespace).get("conditions", [])}


def model_ready(api_client: client.ApiClient, namespace: str) -> dict[str, Any]:
    return conditions(api_client, namespace).get("ModelReady", {})


def assert_awaited(api_client: client.ApiClient, namespace: str, awaited: str) -> None:
    """Reconciling (not Stalled) with what is awaited, since when recorded in status."""
    found = conditions(api_client, namespace)
    assert (found["Stalled"]["status"], found["Reconciling"]["status"]) == ("False", "True")
    assert found["Reconciling"]["reason"] == found["ModelReady"]["reason"]
    assert found["Reconciling"]["message"].startswith(f"waiting for {awaited} (missing since ")
    assert read_status(api_client, namespace)["waitingSince"]


def engine_pods(api_client: client.ApiClient, namespace: str) -> list[str]:
    pods = client.CoreV1Api(api_client).list_namespaced_pod(namespace).items
    return [
        p.metadata.name
        for p in pods
        if (p.metadata.labels or {}).get("app.kubernetes.io/component") in ENGINE_ROLES
    ]


def statefulsets(api_client: client.ApiClient, namespace: str) -> list[str]:
    return [
        s.metadata.name
        for s in client.AppsV1Api(api_client).list_namespaced_stateful_set(namespace).items
    ]


def warning_events(api_client: client.ApiClient, namespace: str, reason: str) -> list[str]:
    events = client.CoreV1Api(api_client).list_namespaced_event(namespace).items
    return [e.message for e in events if e.reason == reason and e.type == "Warning"]


def wait_held(api_client: client.ApiClient, namespace: str, reason: str) -> str:
    """Until ModelReady says `reason`; then the engines must not exist."""
    cond = wait_for(
        lambda: (c := model_ready(api_client, namespace)).get("reason") == reason and c,
        timeout=60,
        what=f"ModelReady {reason}",
    )
    assert cond["status"] == "False"
    message: str = cond["message"]
    # The router exists (the rest of the deployment is applied), the engines do not.
    wait_for(lambda: exists_deployment(api_client, namespace, "llama-router"), 30, what="router")
    assert statefulsets(api_client, namespace) == []
    assert engine_pods(api_client, namespace) == []
    wait_for(lambda: message in warning_events(api_client, namespace, reason), 30, what="the event")
    return message


def exists_deployment(api_client: client.ApiClient, namespace: str, name: str) -> bool:
    try:
        client.AppsV1Api(api_client).read_namespaced_deployment(name, namespace)
        return True
    except ApiException as err:
        if err.status == 404:
            return False
        raise


def wait_engines_started(api_client: client.ApiClient, namespace: str) -> None:
    wait_for(
        lambda: len(engine_pods(api_client, namespace)) == 2,
        timeout=90,
        what="a prefill and a decode pod",
    )
    assert model_ready(api_client, namespace)["status"] == "True"


def test_the_engines_take_the_model_token_by_reference_and_are_not_held_for_it(
    operator: OperatorProcess, api_client: client.ApiClient, namespace: str
) -> None:
    create_pdd(api_client, namespace, {"huggingFace": {"tokenSecretRef": {"name": "hf-token"}}})
    wait_engines_started(api_client, namespace)  # no Secret yet: the pods would report it
    sts = client.AppsV1Api(api_client).read_namespaced_stateful_set("llama-decode", namespace)
    engine = next(c for c in sts.spec.template.spec.containers if c.name == "engine")
    token = next(e for e in engine.env if e.name == "HF_TOKEN")
    assert token.value is None
    assert token.value_from.secret_key_ref.to_dict() == {
        "name": "hf-token",
        "key": "HF_TOKEN",
        "optional": None,
    }


def test_a_missing_or_unshareable_claim_holds_the_engines_until_fixed(
    operator: OperatorProcess, api_client: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api_client)
    # Two pods on possibly two nodes cannot share a ReadWriteOnce claim.
    core.create_namespaced_persistent_volume_claim(namespace, claim("llama-rwo", "ReadWriteOnce"))
    create_pdd(api_client, namespace, {"pvc": {"claimName": "llama-rwo"}})
    message = wait_held(api_client, namespace, "ModelPVCAccessMode")
    assert "allows only ReadWriteOnce" in message and "ReadOnlyMany" in message
    # The claim exists and will not change its modes by itself: Stalled at once.
    stalled = conditions(api_client, namespace)["Stalled"]
    assert (stalled["status"], stalled["reason"]) == ("True", "ModelPVCAccessMode")

    client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        "llama",
        {"spec": {"model": {"source": {"pvc": {"claimName": "llama-70b"}}}}},
    )
    message = wait_held(api_client, namespace, "ModelPVCMissing")
    assert "PersistentVolumeClaim llama-70b" in message and "ReadOnlyMany" in message
    assert_awaited(api_client, namespace, "PersistentVolumeClaim llama-70b")

    # Pending (no volume binder runs here) is accepted: a WaitForFirstConsumer claim binds
    # only once its first pod is scheduled.
    core.create_namespaced_persistent_volume_claim(namespace, claim("llama-70b", "ReadOnlyMany"))
    wait_engines_started(api_client, namespace)


def claim(name: str, mode: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "accessModes": [mode],
            "storageClassName": "",
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }


SOURCES = {
    "huggingFace": {"huggingFace": {"tokenSecretRef": {"name": "t"}, "revision": "main"}},
    "huggingFace cache": {"huggingFace": {"cache": {"claimName": "hf-cache"}}},
    "pvc": {"pvc": {"claimName": "llama", "subPath": "Llama-3.3-70B-Instruct"}},
    "hostPath": {"hostPath": {"path": "/mnt/models/llama"}},
    "image": {"image": {"reference": "registry.example.com/m:v1", "pullPolicy": "IfNotPresent"}},
    "image subPath": {"image": {"reference": "registry.example.com/m:v1", "subPath": "models"}},
}


@pytest.mark.parametrize("source", SOURCES.values(), ids=SOURCES.keys())
def test_each_source_renders_a_pod_the_api_server_takes_as_rendered(
    api_client: client.ApiClient, namespace: str, source: dict[str, Any]
) -> None:
    """Server-side dry-run of the engine StatefulSets (image volumes need the ImageVolume
    gate, on by default in 1.35), read back with the owned-fields digest of the render."""
    install_crd(api_client)
    spec = sample_spec({"model": {"name": "m", "source": source}})
    body = {
        "apiVersion": "pdd.dev/v1alpha1",
        "kind": "PDDeployment",
        "metadata": {"name": "llama", "namespace": namespace, "uid": "u", "generation": 1},
        "spec": spec,
    }
    pdd = PDDeployment.from_body(body)
    kube = KubeApi(api_client)
    for child in render_children(pdd, RenderContext()):
        if child["kind"] != "StatefulSet":
            continue
        live = kube.apply(child, dry_run=True)
        volumes = {v["name"]: v for v in live["spec"]["template"]["spec"]["volumes"]}
        for kind, fields in _volume(child).items():  # the server may add defaults
            assert fields.items() <= volumes["model"][kind].items(), volumes["model"]
        assert live_fingerprint(live, kube.field_manager) == rendered_fingerprint(child)


def _volume(sts: dict[str, Any]) -> dict[str, Any]:
    rendered = next(v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "model")
    return {k: v for k, v in rendered.items() if k != "name"}


def create_llama_70b(api_client: client.ApiClient, namespace: str, gpus: int) -> None:
    body = pdd_body(
        "llama",
        namespace,
        model={"name": "meta-llama/Llama-3.1-70B-Instruct"},  # 64 attention heads, 8 KV heads
        prefill={"replicas": 1, "gpusPerInstance": gpus},
        decode={"replicas": 1, "gpusPerInstance": gpus},
        topology={"placement": "none"},
    )
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body
    )


def test_a_tp_the_model_cannot_use_is_stalled_with_the_sizes_that_fit_until_it_is_one(
    operator: OperatorProcess, api_client: client.ApiClient, namespace: str
) -> None:
    create_llama_70b(api_client, namespace, gpus=3)
    cond = wait_for(
        lambda: (
            (c := conditions(api_client, namespace).get("ParallelismSupported", {})).get("status")
            == "False"
            and c
        ),
        timeout=60,
        what="ParallelismSupported=False",
    )
    reason, message = cond["reason"], cond["message"]
    assert reason == "AttentionHeadsNotDivisible"
    assert message.startswith(
        "spec.prefill: tensor-parallel size 3 (spec.prefill.gpusPerInstance) does not divide "
        "the 64 attention heads of meta-llama/Llama-3.1-70B-Instruct"
    )
    assert "use a tensor-parallel size of 1, 2, 4 or 8" in message
    found = conditions(api_client, namespace)
    assert (found["Ready"]["status"], found["Ready"]["reason"]) == ("False", reason)
    assert (found["Stalled"]["status"], found["Stalled"]["message"]) == ("True", message)
    # The router exists (the rest of the deployment is applied), the engines do not.
    wait_for(lambda: exists_deployment(api_client, namespace, "llama-router"), 30, what="router")
    assert statefulsets(api_client, namespace) == []
    assert engine_pods(api_client, namespace) == []
    wait_for(lambda: message in warning_events(api_client, namespace, reason), 30, what="event")

    client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        "llama",
        {"spec": {"prefill": {"gpusPerInstance": 8}, "decode": {"gpusPerInstance": 8}}},
    )
    body = wait_for(lambda: ready_body(api_client, namespace, "llama"), 120, what="Ready at TP 8")
    fits = next(c for c in body["status"]["conditions"] if c["type"] == "ParallelismSupported")
    assert (fits["status"], fits["reason"]) == ("True", "FitsModel")
    assert len(engine_pods(api_client, namespace)) == 2


def offload_condition(api_client: client.ApiClient, namespace: str) -> dict[str, Any]:
    return conditions(api_client, namespace).get("KVCacheOffloaded", {})


def engine_memory(api_client: client.ApiClient, namespace: str, role: str) -> dict[str, Any]:
    sts = client.AppsV1Api(api_client).read_namespaced_stateful_set(f"llama-{role}", namespace)
    pod = sts.to_dict()["spec"]["template"]["spec"]
    engine = next(c for c in pod["containers"] if c["name"] == "engine")
    shm = next(v for v in pod["volumes"] if (v.get("empty_dir") or {}).get("medium") == "Memory")
    return {
        "request": (engine["resources"].get("requests") or {}).get("memory"),
        "shm": shm["empty_dir"]["size_limit"],
    }


def test_a_cpu_tier_the_release_sizes_by_the_models_shape_waits_for_the_shape_and_serves(
    operator: OperatorProcess, api_client: client.ApiClient, namespace: str
) -> None:
    """vLLM 0.11 counts its CPU tier in KV blocks: with a model whose shape the operator does
    not know, the prefill pods serve without the tier and KVCacheOffloaded=False (a Warning)
    says what to set; with the shape, they get the tier and the memory to hold it."""
    body = pdd_body(
        "llama",
        namespace,
        model={"name": "example/in-house-model"},
        engine={**sample_spec()["engine"], "version": "0.11.0"},
        prefill={"replicas": 1, "gpusPerInstance": 1},
        decode={"replicas": 1, "gpusPerInstance": 1},
        kvCache={"offload": {"cpu": "64Gi"}},
        topology={"placement": "none"},
    )
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body
    )
    cond = wait_for(
        lambda: (c := offload_condition(api_client, namespace)).get("status") == "False" and c,
        timeout=60,
        what="KVCacheOffloaded=False",
    )
    assert cond["reason"] == "OffloadNotRendered"
    assert "set spec.model.kvCache, or run vLLM 0.14.0 or later" in cond["message"]
    wait_for(
        lambda: cond["message"] in warning_events(api_client, namespace, cond["reason"]),
        30,
        what="the Warning event",
    )
    wait_for(lambda: ready_body(api_client, namespace, "llama"), 120, what="Ready without the tier")
    assert engine_memory(api_client, namespace, "prefill") == {"request": None, "shm": "16Gi"}

    shape = {"layers": 32, "kvHeads": 8, "headDim": 128}
    client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "llama", {"spec": {"model": {"kvCache": shape}}}
    )
    cond = wait_for(
        lambda: (c := offload_condition(api_client, namespace)).get("status") == "True" and c,
        timeout=60,
        what="KVCacheOffloaded=True",
    )
    assert cond["reason"] == "OffloadRendered" and "num_cpu_blocks" in cond["message"]
    wait_for(lambda: ready_body(api_client, namespace, "llama"), 120, what="Ready with the tier")
    assert engine_memory(api_client, namespace, "prefill") == {"request": "64Gi", "shm": "16Gi"}
    assert engine_memory(api_client, namespace, "decode") == {"request": None, "shm": "16Gi"}
