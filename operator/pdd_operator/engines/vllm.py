"""vLLM (``vllm serve``) with its NixlConnector.

The connector learns its peers over a ZMQ side channel that listens in every prefill and
decode pod from VLLM_NIXL_SIDE_CHANNEL_PORT on and must bind the pod IP, so
VLLM_NIXL_SIDE_CHANNEL_HOST comes from the downward API. Which ports, per release: up to 0.11.0
one listener per GPU worker (base + dp_rank x tp + tp_rank, nixl_connector.py L267-270 and
L622), from 0.11.1 one per data-parallel engine serving all its TP ranks (base + DP index;
0.33.0 nixl/base_scheduler.py L77-80). K and V of one block are one
NIXL descriptor (one region per layer, K and V in the content dimension: the connector's
nixl/base_worker.py); blocks are 16 tokens unless ``--block-size`` says otherwise.

The router is vllm-router 0.1.17 (PyPI ``vllm-router``) in its vLLM PD mode with the NIXL
connector: it sends each request to a prefill pod with ``kv_transfer_params`` asking for a
remote decode and hands the prefill's answer to a decode pod. Its flags are checked against
tests/fixtures/routers/vllm-router-0.1.17.help.txt.
"""

from __future__ import annotations

import json

from pdd_contract.env import VLLM_NIXL_SIDE_CHANNEL_HOST, VLLM_NIXL_SIDE_CHANNEL_PORT
from pdd_contract.ports import SIDE_CHANNEL_SERVED_BY, VLLM_SIDE_CHANNEL
from pdd_operator.api.v1alpha1 import PDDeploymentSpec
from pdd_operator.engines.base import (
    EngineAdapter,
    EngineLaunch,
    EnginePort,
    KvLayout,
    Layout,
    MultiNodeLaunch,
    RankFlag,
    Rendezvous,
    RouterDiscovery,
    RouterLaunch,
    SideChannel,
    declared_layout,
    env_pod_ip,
    env_value,
    model_flags,
    model_location,
    pd_router_args,
    role_spec,
)
from pdd_operator.engines.version import SupportedVersions, Version

SIDE_CHANNEL_PORT_NAME = "side-channel"
# The first release with one side-channel listener per data-parallel engine.
ONE_LISTENER_PER_ENGINE = Version(0, 11, 1)
# NixlConnector reads the role from kv_role (kv_both is deprecated from 0.23.0,
# nixl/connector.py L97-103 in 0.33.0; 0.11.0's connector reads no role, so these are taken
# and change nothing there).
KV_ROLE = {"prefill": "kv_producer", "decode": "kv_consumer"}
# vllm-router's --kv-connector value for each spec.kvTransfer.connector.
ROUTER_KV_CONNECTOR = {"NixlConnector": "nixl"}
# smg reads a vLLM pod's connector from this annotation in discovery mode (with it, smg sends
# the prefill leg `kv_transfer_params` as vllm-router does), so smg as a custom router
# (spec.router.command) pairs these pods too. vllm-router needs no annotation for NIXL.
SMG_KV_CONNECTOR_ANNOTATION = "smg.ai/kv-connector"


class VllmAdapter(EngineAdapter):
    type = "vllm"
    display_name = "vLLM"
    versions = SupportedVersions(Version(0, 11, 0), Version(0, 33, 0))
    kv_layout = KvLayout(default_block_tokens=16, packed=True)
    # The base health check (/health, the kubelet's 1 s timeout) serves: vLLM's /health
    # answers from a flag (vllm/entrypoints/openai/api_server.py, `health`: the engine
    # client's check_health raises once the engine core is dead).
    # NixlConnector: the decode worker READs the prefill's blocks (nixl_connector.py,
    # _read_blocks), in v0.11.0 and 0.33.0 alike.
    kv_operation = "READ"

    def launch(self, spec: PDDeploymentSpec, role: str) -> EngineLaunch:
        kv_config = {"kv_connector": spec.kvTransfer.connector, "kv_role": KV_ROLE[role]}
        args = [
            model_location(spec, self.model_dir),
            *model_flags(spec),
            "--host",
            "0.0.0.0",
            "--port",
            str(spec.engine.port),
            *_layout_flags(self.layout(spec, role)),
            "--kv-transfer-config",
            json.dumps(kv_config, separators=(",", ":")),
        ]
        if spec.engine.kvBlockSize:
            args += ["--block-size", str(spec.engine.kvBlockSize)]
        env = (
            env_pod_ip(VLLM_NIXL_SIDE_CHANNEL_HOST),
            env_value(VLLM_NIXL_SIDE_CHANNEL_PORT, str(spec.kvTransfer.sideChannelPort)),
        )
        return EngineLaunch(("vllm", "serve"), tuple(args), env)

    def layout(self, spec: PDDeploymentSpec, role: str) -> Layout:
        """Unset: TP over one node's GPUs and one data-parallel rank per node (vLLM's
        multi-node data parallelism, docs/multinode.md)."""
        rspec = role_spec(spec, role)
        return declared_layout(rspec) or Layout(rspec.gpusPerInstance, data=rspec.nodesPerInstance)

    def multinode(self, spec: PDDeploymentSpec, role: str, meet: Rendezvous) -> MultiNodeLaunch:
        """vLLM's multi-node data parallelism without Ray (v0.11.0 `vllm serve`): every node
        runs its share of the DP ranks; rank 0 serves the API and coordinates over
        --data-parallel-address/--data-parallel-rpc-port, the others run --headless from
        their first DP rank (--data-parallel-start-rank)."""
        layout = self.layout(spec, role)
        local = layout.data // meet.nodes  # DP ranks per node (the layout rules make it whole)
        return MultiNodeLaunch(
            args=(
                "--data-parallel-size-local",
                str(local),
                "--data-parallel-address",
                meet.leader_host,
                "--data-parallel-rpc-port",
                str(meet.port),
            ),
            rank_flags=(RankFlag("--data-parallel-start-rank", local, workers_only=True),),
            worker_args=("--headless",),
        )

    def ports(self, spec: PDDeploymentSpec) -> tuple[EnginePort, ...]:
        return tuple(
            EnginePort(_port_name(i), port) for i, port in enumerate(self._side_ports(spec))
        )

    def side_channel(self, spec: PDDeploymentSpec) -> SideChannel:
        return SideChannel(
            VLLM_SIDE_CHANNEL, self._side_ports(spec), SIDE_CHANNEL_SERVED_BY[VLLM_SIDE_CHANNEL]
        )

    def _side_ports(self, spec: PDDeploymentSpec) -> tuple[int, ...]:
        """The side-channel ports a role's first (rank 0) pod listens on, for both roles."""
        per_pod = max(self._listeners_per_pod(spec, role) for role in ("prefill", "decode"))
        base = spec.kvTransfer.sideChannelPort
        return tuple(range(base, base + per_pod))

    def _listeners_per_pod(self, spec: PDDeploymentSpec, role: str) -> int:
        layout = self.layout(spec, role)
        local_engines = max(1, layout.data // role_spec(spec, role).nodesPerInstance)
        if self.wiring(spec) >= ONE_LISTENER_PER_ENGINE:
            return local_engines
        return local_engines * layout.tensor  # one per GPU worker

    def router(self, spec: PDDeploymentSpec, discovery: RouterDiscovery) -> RouterLaunch:
        connector = ROUTER_KV_CONNECTOR[spec.kvTransfer.connector]
        mode = ("--vllm-pd-disaggregation", "--kv-connector", connector)
        args = pd_router_args(spec.router, discovery, mode)
        return RouterLaunch(("vllm-router",), args)

    def pod_annotations(self, spec: PDDeploymentSpec, role: str) -> dict[str, str]:
        del role
        return {SMG_KV_CONNECTOR_ANNOTATION: spec.kvTransfer.connector}


def _port_name(index: int) -> str:
    """`side-channel`, `side-channel-1`, ...: container port names (15 characters at most)."""
    return SIDE_CHANNEL_PORT_NAME if index == 0 else f"{SIDE_CHANNEL_PORT_NAME}-{index}"


def _layout_flags(layout: Layout) -> tuple[str, ...]:
    flags = ["--tensor-parallel-size", str(layout.tensor)]
    if layout.pipeline > 1:
        flags += ["--pipeline-parallel-size", str(layout.pipeline)]
    if layout.data > 1:
        flags += ["--data-parallel-size", str(layout.data)]
    if layout.expert > 1:
        flags.append("--enable-expert-parallel")  # its size is TP x DP (the layout rules)
    return tuple(flags)


ADAPTER = VllmAdapter()
