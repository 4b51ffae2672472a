"""Instances larger than one node (spec.<role>.nodesPerInstance > 1): one StatefulSet and one
headless Service per instance, ranks by ordinal, the engine's multi-node flags per rank, the
router on leaders only, and the gang scheduler's objects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from helpers.factories import make_pdd
from helpers.multinode import TWO_NODES, children, engine_container, flag, launched_argv, multinode
from pdd_contract.env import PDD_LEADER_ADDRESS, PDD_NNODES, PDD_NODE_RANK
from pdd_operator.planning.placement import Placement, PlacementResult
from pdd_operator.planning.reservations import reservation_for
from pdd_operator.rendering.children import render_children
from pdd_operator.rendering.context import RenderContext
from pdd_operator.rendering.router import router_discovery
from pdd_operator.status.compute import WorkloadState, instances_state


def test_each_instance_is_a_statefulset_of_ranks_with_a_headless_service() -> None:
    objs = children(multinode())
    assert ("StatefulSet", "llama-prefill") not in objs
    for index in (0, 1):
        name = f"llama-prefill-{index}"
        sts = objs[("StatefulSet", name)]
        assert sts["spec"]["replicas"] == 2
        assert sts["spec"]["serviceName"] == name
        assert sts["spec"]["podManagementPolicy"] == "Parallel"
        labels = sts["spec"]["template"]["metadata"]["labels"]
        assert labels["pdd.dev/instance"] == str(index)
        assert sts["spec"]["selector"]["matchLabels"]["pdd.dev/instance"] == str(index)
        service = objs[("Service", name)]
        assert service["spec"]["clusterIP"] == "None"
        assert service["spec"]["publishNotReadyAddresses"] is True
        assert service["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
    assert ("StatefulSet", "llama-decode-0") in objs
    assert ("StatefulSet", "llama-decode-1") not in objs
    # The role's Service (peers, DNS) still selects every rank of the role.
    assert "pdd.dev/instance" not in objs[("Service", "llama-prefill")]["spec"]["selector"]


def test_ranks_of_an_instance_go_to_distinct_nodes() -> None:
    sts = children(multinode())[("StatefulSet", "llama-prefill-1")]
    (term,) = sts["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"]["pdd.dev/instance"] == "1"


def test_with_a_planned_domain_the_ranks_of_an_instance_share_it() -> None:
    placed = Placement("preferred", "nvidia.com/gpu.clique", "clique-b")
    objs = {
        (c["kind"], c["metadata"]["name"]): c
        for c in render_children(multinode(), RenderContext(placement=placed))
    }
    affinity = objs[("StatefulSet", "llama-decode-0")]["spec"]["template"]["spec"]["affinity"]
    (term,) = affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "nvidia.com/gpu.clique"
    assert term["labelSelector"]["matchLabels"]["pdd.dev/instance"] == "0"
    assert "nodeAffinity" in affinity  # the slice's domain, as before
    unplanned = children(multinode())[("StatefulSet", "llama-decode-0")]
    assert "podAffinity" not in unplanned["spec"]["template"]["spec"]["affinity"]


def test_every_rank_gets_its_rank_the_node_count_and_the_leader_address() -> None:
    sts = children(multinode())[("StatefulSet", "llama-prefill-1")]
    env = {e["name"]: e for e in engine_container(sts)["env"]}
    assert env[PDD_NODE_RANK]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.labels['apps.kubernetes.io/pod-index']"
    )
    assert env[PDD_NNODES]["value"] == "2"
    assert env[PDD_LEADER_ADDRESS]["value"] == (
        "llama-prefill-1-0.llama-prefill-1.team-a.svc:29550"
    )


def test_vllm_ranks_run_multi_node_data_parallel(tmp_path: Path) -> None:
    container = engine_container(children(multinode())[("StatefulSet", "llama-prefill-0")])
    leader = launched_argv(container, 0, tmp_path)
    worker = launched_argv(container, 1, tmp_path)
    leader_host = "llama-prefill-0-0.llama-prefill-0.team-a.svc"
    for argv in (leader, worker):
        assert flag(argv, "--tensor-parallel-size") == "8"
        assert flag(argv, "--data-parallel-size") == "2"
        assert flag(argv, "--data-parallel-size-local") == "1"
        assert flag(argv, "--data-parallel-address") == leader_host
        assert flag(argv, "--data-parallel-rpc-port") == "29550"
    assert "--headless" not in leader and flag(leader, "--data-parallel-start-rank") is None
    assert "--headless" in worker and flag(worker, "--data-parallel-start-rank") == "1"


def test_vllm_rank_start_is_rank_times_local_data_parallel_ranks(tmp_path: Path) -> None:
    layout = {**TWO_NODES, "nodesPerInstance": 4, "parallelism": {"tensor": 2, "data": 16}}
    container = engine_container(
        children(multinode(prefill=layout))[("StatefulSet", "llama-prefill-0")]
    )
    argv = launched_argv(container, 3, tmp_path)
    assert flag(argv, "--data-parallel-size-local") == "4"
    assert flag(argv, "--data-parallel-start-rank") == "12"
    assert flag(argv, "--tensor-parallel-size") == "2"


@pytest.mark.parametrize(
    ("release", "dp_attention"),
    [
        ("0.5.4", ["--dp-size", "8", "--enable-dp-attention"]),
        ("0.5.23", ["--attn-dp-size", "8"]),  # --enable-dp-attention deprecated from 0.5.22
    ],
)
def test_sglang_ranks_get_nnodes_node_rank_and_dist_init_addr(
    tmp_path: Path, release: str, dp_attention: list[str]
) -> None:
    layout = {**TWO_NODES, "parallelism": {"tensor": 16, "data": 8, "expert": 16}}
    engine = {"type": "sglang", "image": f"lmsysorg/sglang:v{release}"}
    pdd = multinode("sglang", prefill=layout, decode=layout, engine=engine)
    container = engine_container(children(pdd)[("StatefulSet", "llama-decode-1")])
    for rank in (0, 1):
        argv = launched_argv(container, rank, tmp_path)
        assert flag(argv, "--nnodes") == "2"
        assert flag(argv, "--node-rank") == str(rank)
        assert flag(argv, "--dist-init-addr") == (
            "llama-decode-1-0.llama-decode-1.team-a.svc:29550"
        )
        assert flag(argv, "--tp-size") == "16"
        assert _subsequence(dp_attention, argv), argv
        assert ("--dp-size" in argv) == (release == "0.5.4")
        # 0.5.4 asserts it on decode with DP attention; 0.5.20 refuses the flag.
        assert ("--prefill-round-robin-balance" in argv) == (release == "0.5.4")
        assert flag(argv, "--ep-size") == "16"
        assert "--headless" not in argv


def test_user_args_stay_before_the_rank_flags(tmp_path: Path) -> None:
    pdd = multinode(engine={"type": "vllm", "image": "x/y:1", "args": ["--max-model-len", "9"]})
    argv = launched_argv(
        engine_container(children(pdd)[("StatefulSet", "llama-prefill-0")]), 1, tmp_path
    )
    assert argv.index("--max-model-len") < argv.index("--headless")


def test_only_the_leader_is_probed_over_http() -> None:
    container = engine_container(children(multinode())[("StatefulSet", "llama-prefill-0")])
    for probe in ("readinessProbe", "startupProbe"):
        script = container[probe]["exec"]["command"][2]
        assert f'"${{{PDD_NODE_RANK}:-0}}" != 0' in script
        assert "http://127.0.0.1:8000/health" in script


@pytest.mark.parametrize(
    ("nodes", "expected"), [(1, None), (2, "0")], ids=["single-node", "multi-node"]
)
def test_the_router_selects_leaders_only_where_instances_span_nodes(
    nodes: int, expected: str | None
) -> None:
    pdd = make_pdd({"prefill": {"nodesPerInstance": nodes, "gpusPerInstance": 8}})
    discovery = router_discovery(pdd)
    assert dict(discovery.prefill_selector).get("apps.kubernetes.io/pod-index") == expected
    assert "apps.kubernetes.io/pod-index" not in dict(discovery.decode_selector)


def test_native_gang_is_one_workload_per_role_gang_per_instance() -> None:
    objs = children(multinode())
    workload = objs[("Workload", "llama-prefill")]
    assert workload["apiVersion"] == "scheduling.k8s.io/v1alpha1"
    assert workload["spec"]["podGroups"] == [
        {"name": "instance", "policy": {"gang": {"minCount": 2}}}
    ]
    assert workload["spec"]["controllerRef"] == {
        "apiGroup": "pdd.dev",
        "kind": "PDDeployment",
        "name": "llama",
    }
    ref = objs[("StatefulSet", "llama-prefill-1")]["spec"]["template"]["spec"]["workloadRef"]
    assert ref == {"name": "llama-prefill", "podGroup": "instance", "podGroupReplicaKey": "1"}


def test_single_node_roles_are_no_gangs() -> None:
    objs = children(make_pdd({"decode": {"nodesPerInstance": 2, "gpusPerInstance": 8}}))
    assert ("Workload", "llama-decode") in objs
    assert ("Workload", "llama-prefill") not in objs
    assert "workloadRef" not in objs[("StatefulSet", "llama-prefill")]["spec"]["template"]["spec"]


def test_kueue_gang_labels_each_instance_as_a_pod_group() -> None:
    objs = children(multinode(scheduling={"gang": "kueue", "queueName": "gpu"}))
    template = objs[("StatefulSet", "llama-prefill-1")]["spec"]["template"]
    assert template["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu"
    assert template["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] == "llama-prefill-1"
    assert template["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "2"
    assert not [k for k in objs if k[0] in ("Workload", "PodGroup")]


def test_volcano_gang_is_a_pod_group_per_instance() -> None:
    objs = children(multinode(scheduling={"gang": "volcano", "queueName": "inference"}))
    group = objs[("PodGroup", "llama-prefill-1")]
    assert group["spec"] == {"minMember": 2, "queue": "inference"}
    template = objs[("StatefulSet", "llama-prefill-1")]["spec"]["template"]
    assert template["spec"]["schedulerName"] == "volcano"
    assert template["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "llama-prefill-1"


def test_gang_none_renders_no_gang() -> None:
    objs = children(multinode(scheduling={"gang": "none"}))
    template = objs[("StatefulSet", "llama-prefill-0")]["spec"]["template"]
    assert "workloadRef" not in template["spec"]
    assert not [k for k in objs if k[0] in ("Workload", "PodGroup")]


def test_a_role_of_instances_counts_whole_instances() -> None:
    whole = WorkloadState(exists=True, desired=2, ready=2, updated=2, pods=2)
    half = WorkloadState(exists=True, desired=2, ready=1, updated=2, pods=2)
    state = instances_state([whole, half])
    assert (state.desired, state.ready, state.updated) == (2, 1, 2)
    assert not state.settled
    assert instances_state([whole, whole]).settled


def test_a_reservation_counts_every_rank() -> None:
    placed = PlacementResult(True, Placement("required", "rack", "r1"), "Placed", "")
    reservation = reservation_for(multinode().spec, placed)
    assert reservation is not None and reservation.needed == (2 * 2 + 1 * 2) * 8


def sidecar_env(sts: dict[str, Any]) -> dict[str, Any]:
    containers = sts["spec"]["template"]["spec"]["containers"]
    sidecar = next(c for c in containers if c["name"] == "nixl-sidecar")
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in sidecar["env"]}


def test_every_prefill_rank_answers_probe_requests_on_itself_only() -> None:
    objs = children(multinode())
    # Each prefill rank's sidecar answers requests on its own pod (all ranks share a
    # template, so its own name comes from the downward API); decode pods never do.
    for name in ("llama-prefill-0", "llama-prefill-1"):
        prober = sidecar_env(objs[("StatefulSet", name)])["PDD_PROBER_POD"]
        assert prober == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert sidecar_env(objs[("StatefulSet", "llama-decode-0")])["PDD_PROBER_POD"] == (
        "llama-prefill-0-0"
    )
    # The Role lets exactly the asked ranks patch (their results on) themselves.
    role = objs[("Role", "llama-sidecar")]
    patch = next(r for r in role["rules"] if r["verbs"] == ["patch"])
    assert patch["resourceNames"] == [
        "llama-prefill-0-0", "llama-prefill-0-1", "llama-prefill-1-0", "llama-prefill-1-1"
    ]  # fmt: skip


def test_without_a_decode_instance_the_role_still_names_one_pod() -> None:
    # An empty resourceNames would let the sidecar patch every pod of the namespace.
    objs = children(multinode(decode={"replicas": 0, "gpusPerInstance": 8, "nodesPerInstance": 2}))
    patch = next(r for r in objs[("Role", "llama-sidecar")]["rules"] if r["verbs"] == ["patch"])
    assert patch["resourceNames"] == ["llama-prefill-0-0"]


def _subsequence(flags: list[str], argv: list[str]) -> bool:
    start = argv.index(flags[0]) if flags[0] in argv else -1
    return start >= 0 and argv[start : start + len(flags)] == flags
