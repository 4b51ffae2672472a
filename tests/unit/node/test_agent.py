"""The node topology agent: the patch it builds and when it writes."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import pytest

from helpers.topology import scan_fixture
from pdd_node.agent import NodeMetadata, metadata_patch, run_loop, sync_once
from pdd_node.kube import FIELD_MANAGER, KubernetesNodeClient
from pdd_node.topology.annotation import node_labels
from pdd_node.topology.model import NodeTopology

H100 = scan_fixture("h100-hgx")
PORT_DOWN = scan_fixture("port-down")
OTHER = {"kubernetes.io/hostname": "gpu-1", "pdd.dev/unrelated": "x"}


def current_of(topology: NodeTopology) -> tuple[dict[str, str], dict[str, str]]:
    return dict(OTHER), {**node_labels(topology), **OTHER}


def test_a_bare_node_gets_all_labels_and_no_annotation() -> None:
    patch = metadata_patch(OTHER, OTHER, H100)
    assert patch == {
        "metadata": {
            "labels": {
                "pdd.dev/gpudirect": "dmabuf",
                "pdd.dev/rdma-nics": "8",
                "pdd.dev/topology-version": "v1",
            },
        }
    }


def test_an_up_to_date_node_gets_no_patch() -> None:
    assert metadata_patch(*current_of(H100), H100) is None


def test_only_changed_keys_are_patched() -> None:
    # A port went down: the NIC count changes, nothing else.
    patch = metadata_patch(*current_of(H100), PORT_DOWN)
    assert patch == {"metadata": {"labels": {"pdd.dev/rdma-nics": "7"}}}


def test_the_annotation_of_earlier_agents_is_removed() -> None:
    annotations, labels = current_of(H100)
    annotations["pdd.dev/topology"] = '{"version":"v1"}'
    assert metadata_patch(annotations, labels, H100) == {
        "metadata": {"annotations": {"pdd.dev/topology": None}}
    }


def test_a_label_changed_by_hand_is_restored_alone() -> None:
    annotations, labels = current_of(H100)
    labels["pdd.dev/gpudirect"] = "none"
    assert metadata_patch(annotations, labels, H100) == {
        "metadata": {"labels": {"pdd.dev/gpudirect": "dmabuf"}}
    }


class FakeNodes:
    """Records calls; holds one Node's metadata and applies merge patches to it."""

    def __init__(self, annotations: dict[str, str], labels: dict[str, str]) -> None:
        self.annotations, self.labels = annotations, labels
        self.reads = 0
        self.patches: list[Mapping[str, Any]] = []
        self.fail_reads = 0

    def read_node_metadata(self, name: str) -> NodeMetadata:
        assert name == "gpu-1"
        self.reads += 1
        if self.fail_reads:
            self.fail_reads -= 1
            raise ConnectionError("API server unavailable")
        return dict(self.annotations), dict(self.labels)

    def patch_node_metadata(self, name: str, patch: Mapping[str, Any]) -> None:
        self.patches.append(patch)
        for key, value in patch["metadata"].get("annotations", {}).items():
            if value is None:  # a merge patch's null deletes the key
                self.annotations.pop(key, None)
            else:
                self.annotations[key] = value
        self.labels.update(patch["metadata"].get("labels", {}))


def test_sync_once_writes_then_stays_quiet() -> None:
    nodes = FakeNodes({}, dict(OTHER))
    assert sync_once(nodes, "gpu-1", H100) is True
    assert sync_once(nodes, "gpu-1", H100) is False
    assert len(nodes.patches) == 1
    assert nodes.labels["kubernetes.io/hostname"] == "gpu-1"  # other keys untouched


def test_an_upgraded_agent_removes_the_old_annotation_once() -> None:
    nodes = FakeNodes({"pdd.dev/topology": "{}", **OTHER}, {**node_labels(H100), **OTHER})
    assert sync_once(nodes, "gpu-1", H100) is True
    assert sync_once(nodes, "gpu-1", H100) is False
    assert nodes.annotations == OTHER


def test_run_loop_retries_after_api_errors_and_stops_on_request() -> None:
    nodes = FakeNodes({}, {})
    nodes.fail_reads = 2
    stop = threading.Event()
    waits: list[float] = []
    scans = 0

    def scan_node() -> NodeTopology:
        nonlocal scans
        scans += 1
        return H100

    original_wait = stop.wait

    def record_wait(timeout: float | None = None) -> bool:
        waits.append(timeout or 0.0)
        if len(waits) == 4:
            stop.set()
        return original_wait(0)

    stop.wait = record_wait  # type: ignore[method-assign]
    run_loop(nodes, "gpu-1", scan_node, interval_s=60.0, stop=stop)

    assert waits == [5.0, 10.0, 60.0, 60.0]  # backoff after failures, then the interval
    assert scans == 4
    assert len(nodes.patches) == 1  # written once, then nothing changed


class FakeCoreV1:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def read_node(self, name: str) -> Any:
        from kubernetes.client import V1Node, V1ObjectMeta

        self.calls.append(("read_node", (name,), {}))
        return V1Node(metadata=V1ObjectMeta(name=name, labels={"a": "b"}))

    def patch_node(self, name: str, body: dict[str, Any], **kwargs: Any) -> None:
        self.calls.append(("patch_node", (name, body), kwargs))


def test_kubernetes_client_adapter_uses_a_merge_patch_under_its_field_manager() -> None:
    core = FakeCoreV1()
    client = KubernetesNodeClient(core)
    assert client.read_node_metadata("gpu-1") == ({}, {"a": "b"})
    client.patch_node_metadata("gpu-1", {"metadata": {"labels": {"x": "y"}}})
    assert core.calls[-1] == (
        "patch_node",
        ("gpu-1", {"metadata": {"labels": {"x": "y"}}}),
        {"field_manager": FIELD_MANAGER, "_content_type": "application/merge-patch+json"},
    )


@pytest.mark.parametrize("fixture", ["no-rdma", "single-gpu-vm"])
def test_label_values_are_valid_kubernetes_label_values(fixture: str) -> None:
    for value in node_labels(scan_fixture(fixture)).values():
        assert len(value) <= 63 and value.replace("-", "").replace(".", "").isalnum()
