"""The operator as shipped starts on a cluster with more Nodes than kopf's old worker limit.

When kopf watched Nodes it ran one worker per Node; with `worker_limit` 64 (our old default)
every worker indexed its Node and then waited for all Nodes to be indexed while holding its
slot, so on a cluster of more than 64 Nodes the operator never reconciled anything (found by
`make bench`). Nodes now come from the operator's own informer; this keeps the shipped
settings honest on a cluster of that size.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from helpers.factories import pdd_body
from helpers.operator_proc import OPERATOR_USER, OperatorProcess, install_crd
from helpers.waits import wait_for
from pdd_localcluster import NodeSimulator, SimNode

OLD_WORKER_LIMIT = 64
GROUP, VERSION, PLURAL = "pdd.dev", "v1alpha1", "pddeployments"


@pytest.fixture(scope="module")
def crowded_cluster(node_sim: NodeSimulator) -> Iterator[int]:
    """CPU-only Nodes (no GPUs: the planner ignores them) until the cluster has more Nodes
    than the old limit; removed again afterwards."""
    missing = max(OLD_WORKER_LIMIT + 6 - len(node_sim.node_names), 1)
    cpu_only = {"cpu": "64", "memory": "256Gi", "pods": "110"}
    extra = [SimNode(f"cpu-{i:03d}", labels={}, capacity=cpu_only) for i in range(missing)]
    with node_sim.nodes_for_a_while(extra):
        yield len(node_sim.node_names)


def test_operator_with_default_settings_reconciles_on_more_than_64_nodes(
    crowded_cluster: int,
    control_plane: Any,
    api_client: client.ApiClient,
    namespace: str,
    tmp_path: Path,
) -> None:
    assert crowded_cluster > OLD_WORKER_LIMIT
    install_crd(api_client)
    identity = control_plane.kubeconfig_for(OPERATOR_USER)
    # No PDD_WORKER_LIMIT or other tuning: the settings a chart install gets.
    proc = OperatorProcess(identity, tmp_path / "operator.log").start()
    try:
        body = pdd_body(
            "crowded",
            namespace,
            prefill={"replicas": 1, "gpusPerInstance": 1},
            decode={"replicas": 1, "gpusPerInstance": 1},
            router={"enabled": False},
        )
        client.CustomObjectsApi(api_client).create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, body
        )
        apps = client.AppsV1Api(api_client)
        try:
            wait_for(
                lambda: len(apps.list_namespaced_stateful_set(namespace).items) == 2,
                timeout=60,
                what=f"the operator to create the StatefulSets on {crowded_cluster} nodes",
            )
        except AssertionError as err:
            raise AssertionError(f"{err}\noperator log:\n{proc.tail(3000)}") from None
    finally:
        proc.kill()
