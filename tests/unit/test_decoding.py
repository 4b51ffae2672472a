"""Pods decoded with only the fields the operator reads (kube.decoding.PODS) must read the same
as the whole object to everything that reads a pod: a field a reader needs and the decoding
leaves out changes one of these summaries."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from helpers.factories import make_pdd
from pdd_operator.api import names
from pdd_operator.informers.owned import _pod_deployment
from pdd_operator.kube.client import WatchExpired, _json_lines, _watch_error
from pdd_operator.kube.decoding import PODS, WHOLE
from pdd_operator.planning.compact import compact_pod
from pdd_operator.rendering.children import render_children
from pdd_operator.rendering.context import RenderContext
from pdd_operator.status.observe import controller_uid, summarize_pod

GPU = "nvidia.com/gpu"


def rendered_pod_template() -> dict[str, Any]:
    """The prefill StatefulSet's pod template as the operator renders it: real containers,
    env, mounts and resources, the bulk of a pod's bytes."""
    children = render_children(make_pdd(), RenderContext())
    sts = next(c for c in children if c["kind"] == "StatefulSet")
    return copy.deepcopy(sts["spec"]["template"])


def running_pod(**status: Any) -> dict[str, Any]:
    template = rendered_pod_template()
    meta = template["metadata"]
    meta["annotations"] = {
        **meta.get("annotations", {}),
        names.ANNOTATION_OWNER_NAME: "kv",
        names.ANNOTATION_PROBE_REQUEST: "req-7",
        names.ANNOTATION_PROBE_RESULT: '{"id": "req-7", "gbps": 41.5}',
    }
    meta["labels"] = {
        **meta.get("labels", {}),
        "controller-revision-hash": "kv-prefill-5d8f",
        names.LABEL_SLICE: "2",
        names.LABEL_INSTANCE: "kv-prefill-0",
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            **meta,
            "name": "kv-prefill-0",
            "namespace": "team-a",
            "uid": "pod-uid-1",
            "resourceVersion": "4711",
            "generateName": "kv-prefill-",
            "creationTimestamp": "2026-12-02T10:00:00Z",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "cm-uid"},
                {
                    "apiVersion": "apps/v1",
                    "kind": "StatefulSet",
                    "name": "kv-prefill",
                    "uid": "sts-uid",
                    "controller": True,
                    "blockOwnerDeletion": True,
                },
            ],
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:labels": {".": {}}}, "f:spec": {}},
                }
            ],
        },
        "spec": {
            **template["spec"],
            "nodeName": "gpu-node-3",
            "schedulerName": "default-scheduler",
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists"}],
        },
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.5",
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-02T10:01:00Z"},
            ],
            "containerStatuses": [
                {"name": "engine", "ready": True, "restartCount": 2, "state": {"running": {}}},
                {"name": "sidecar", "ready": True, "restartCount": 0, "state": {"running": {}}},
            ],
            **status,
        },
    }


def crash_looping() -> dict[str, Any]:
    return running_pod(
        conditions=[{"type": "Ready", "status": "False", "reason": "ContainersNotReady"}],
        containerStatuses=[
            {
                "name": "engine",
                "ready": False,
                "restartCount": 6,
                "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m"}},
                "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
            }
        ],
    )


def unschedulable() -> dict[str, Any]:
    pod = running_pod(
        phase="Pending",
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
            }
        ],
        containerStatuses=[],
    )
    del pod["spec"]["nodeName"]
    return pod


def image_pull_failing_init() -> dict[str, Any]:
    return running_pod(
        phase="Pending",
        initContainerStatuses=[
            {
                "name": "model",
                "state": {"waiting": {"reason": "ErrImagePull", "message": "not found"}},
            }
        ],
    )


def terminating_failed() -> dict[str, Any]:
    pod = running_pod(phase="Failed", reason="Evicted", message="The node was low on memory.")
    pod["metadata"]["deletionTimestamp"] = "2026-12-02T10:05:00Z"
    return pod


def with_sidecars_and_overhead() -> dict[str, Any]:
    """GPUs in an init container, a sidecar (restartPolicy Always) and the pod overhead: the
    effective request is counted from all three."""
    pod = running_pod()
    pod["spec"]["initContainers"] = [
        {"name": "warm", "image": "x", "resources": {"limits": {GPU: "1"}}},
        {
            "name": "side",
            "image": "y",
            "restartPolicy": "Always",
            "resources": {"requests": {GPU: "2"}, "limits": {GPU: "2"}},
        },
    ]
    pod["spec"]["overhead"] = {GPU: "1", "cpu": "250m"}
    return pod


def foreign_gpu_pod() -> dict[str, Any]:
    """Someone else's: no owner of ours, only a GPU request and a node."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "train-0",
            "namespace": "ml",
            "uid": "u-9",
            "resourceVersion": "12",
            "labels": {"a": "b"},
        },
        "spec": {
            "nodeName": "gpu-node-1",
            "containers": [{"name": "t", "resources": {"limits": {GPU: 4}}}],
        },
        "status": {"phase": "Running"},
    }


PODS_READ = {
    "running with a probe result": running_pod,
    "crash-looping engine": crash_looping,
    "unschedulable": unschedulable,
    "init image pull failing": image_pull_failing_init,
    "terminating, failed": terminating_failed,
    "sidecars and overhead": with_sidecars_and_overhead,
    "someone else's GPU pod": foreign_gpu_pod,
}


def readings(pod: dict[str, Any]) -> tuple[Any, ...]:
    """What every reader of a pod takes from it: its identity and version (the stores, the
    echo check, the watch's next version), and each summary."""
    meta = pod["metadata"]
    identity = tuple(meta.get(k) for k in ("name", "namespace", "uid", "resourceVersion"))
    summary = summarize_pod(pod) if meta.get("ownerReferences") else None
    return identity, summary, compact_pod(pod), controller_uid(pod), _pod_deployment(pod)


@pytest.mark.parametrize("make", PODS_READ.values(), ids=PODS_READ.keys())
def test_a_pod_decoded_with_only_the_read_fields_reads_as_the_whole_one(make: Any) -> None:
    pod = make()
    line = orjson.dumps({"type": "MODIFIED", "object": pod})
    pruned = PODS.event(line)
    assert pruned["type"] == "MODIFIED"
    assert readings(pruned["object"]) == readings(WHOLE.event(line)["object"])


def test_the_pruned_pod_leaves_out_what_no_reader_reads() -> None:
    pod = PODS.event(orjson.dumps({"type": "ADDED", "object": running_pod()}))["object"]
    assert "managedFields" not in pod["metadata"]
    assert all(set(c) <= {"name", "resources", "restartPolicy"} for c in pod["spec"]["containers"])
    assert len(orjson.dumps(pod)) < len(orjson.dumps(running_pod())) / 2


def test_a_list_page_of_pods_keeps_its_version_continue_token_and_items() -> None:
    pods = [make() for make in PODS_READ.values()]
    page = {
        "apiVersion": "v1",
        "kind": "PodList",
        "metadata": {"resourceVersion": "900", "continue": "next-page"},
        "items": pods,
    }
    pruned = PODS.page(orjson.dumps(page))
    assert pruned["metadata"] == {"resourceVersion": "900", "continue": "next-page"}
    assert [readings(item) for item in pruned["items"]] == [readings(p) for p in pods]


def test_a_watch_error_event_still_says_the_version_expired() -> None:
    line = orjson.dumps(
        {
            "type": "ERROR",
            "object": {"kind": "Status", "status": "Failure", "code": 410, "reason": "Expired"},
        }
    )
    (event,) = _json_lines([line], PODS.event)
    with pytest.raises(WatchExpired):
        raise _watch_error("/api/v1/pods", event["object"])
    other = PODS.event(line.replace(b"410", b"500").replace(b"Expired", b"Boom"))
    assert isinstance(_watch_error("/api/v1/pods", other["object"]), RuntimeError)


def test_a_bookmark_keeps_its_version() -> None:
    line = b'{"type":"BOOKMARK","object":{"kind":"Pod","metadata":{"resourceVersion":"77"}}}'
    assert PODS.event(line)["object"]["metadata"] == {"resourceVersion": "77"}
