"""Each rank of a multi-node instance pins UCX to the NICs of its own GPUs.

All ranks of an instance share one pod template, so nothing rank-specific can be rendered: the
NIC choice must come from the preflight that runs in each rank pod, from the GPUs the device
plugin gave that pod on that node. This renders an instance, checks the template fixes no NIC,
and runs the preflight of that template for two ranks holding different GPUs."""

from __future__ import annotations

from typing import Any

from helpers.factories import make_pdd
from helpers.topology import scan_fixture
from pdd_contract.env import UCX_NET_DEVICES
from pdd_node.preflight import ContainerFacts, PreflightConfig, run_preflight
from pdd_operator.rendering.children import render_children
from pdd_operator.rendering.context import RenderContext

HALF_NODE = {"replicas": 1, "gpusPerInstance": 4, "nodesPerInstance": 2}
GOOD = ContainerFacts(1 << 40, 1 << 40, ("uverbs0",), 16 << 30)


def instance_template() -> dict[str, Any]:
    pdd = make_pdd(
        {
            "engine": {"type": "vllm", "image": "vllm/vllm-openai:v0.11.0"},
            "prefill": dict(HALF_NODE),
            "decode": dict(HALF_NODE),
        }
    )
    sts = next(
        c
        for c in render_children(pdd, RenderContext())
        if c["kind"] == "StatefulSet" and c["metadata"]["name"] == "llama-prefill-0"
    )
    assert sts["spec"]["replicas"] == 2  # both ranks are pods of this one template
    template: dict[str, Any] = sts["spec"]["template"]["spec"]
    return template


def preflight_env(template: dict[str, Any]) -> dict[str, str]:
    init = next(c for c in template["initContainers"] if c["name"] == "preflight")
    return {e["name"]: e["value"] for e in init["env"] if "value" in e}


def test_the_shared_template_fixes_no_nic_or_gpu() -> None:
    template = instance_template()
    for container in [*template["initContainers"], *template["containers"]]:
        fixed = {e["name"] for e in container.get("env", [])}
        assert not fixed & {UCX_NET_DEVICES, "NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"}


def test_each_rank_pins_the_nics_nearest_its_own_gpus() -> None:
    env = preflight_env(instance_template())
    topology = scan_fixture("h100-hgx")  # every GPU i has its own NIC mlx5_i
    pinned = {}
    # What the device plugin gives each rank pod on its node: rank 0 GPUs 0-3, rank 1 GPUs 4-7.
    for rank, gpus in ((0, "0,1,2,3"), (1, "4,5,6,7")):
        config = PreflightConfig.from_env({**env, "NVIDIA_VISIBLE_DEVICES": gpus})
        report = run_preflight(topology, config, GOOD)
        assert report.failures == []
        pinned[rank] = report.ucx_net_devices
    assert pinned == {
        0: "mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1",
        1: "mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1",
    }
