"""vLLM (``vllm serve``) with its NixlConnector.

The connector learns its peers over a ZMQ side channel that listens in every prefill and
decode pod from VLLM_NIXL_SIDE_CHANNEL_PORT on and must bind the pod IP, so
VLLM_NIXL_SIDE_CHANNEL_HOST comes from the downward API. Which ports, per release: up to 0.11.0
one listener per GPU worker (base + dp_rank x tp + tp_rank, nixl_connector.py L267-270 and
L622), from 0.11.1 one per data-parallel engine serving all its TP ranks (base + DP index;
0.33.0 nixl/base_scheduler.py L77-80). K and V of one block are one
NIXL descriptor (one region per layer, K and V in the content dimension: the connector's
nixl/base_worker.py); ``--block-size`` is planning.kv_layout's choice (``block_flags``).

The router is vllm-router 0.1.17 (PyPI ``vllm-router``) in its vLLM PD mode with the NIXL
connector: it sends each request to a prefill pod with ``kv_transfer_params`` asking for a
remote decode and hands the prefill's answer to a decode pod. Its flags are checked against
tests/fixtures/routers/vllm-router-0.1.17.help.txt.
"""

from __future__ import annotations

import json
from typing import Any

from pdd_contract.env import (
    VLLM_NIXL_SIDE_CHANNEL_HOST,
    VLLM_NIXL_SIDE_CHANNEL_PORT,
    KvOperation,
)
from pdd_contract.ports import SIDE_CHANNEL_SERVED_BY, VLLM_SIDE_CHANNEL, RankPorts
from pdd_operator.api.pod_namespaces import shares_pid_namespace
from pdd_operator.api.v1alpha1 import PDDeploymentSpec
from pdd_operator.engines import cel_rules, vllm_disk_tier, vllm_kv_events
from pdd_operator.engines.base import (
    MAX_CHOSEN_BLOCK_TOKENS,
    CpuTier,
    DiskTier,
    EngineAdapter,
    EngineLaunch,
    EnginePort,
    EnvEntry,
    KvLayout,
    KvPattern,
    Layout,
    MultiNodeLaunch,
    RankFlag,
    Rendezvous,
    RouterDiscovery,
    RouterLaunch,
    SideChannel,
    TierVerdict,
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
KV_TRANSFER_CONFIG = "--kv-transfer-config"
# The first release with one side-channel listener per data-parallel engine.
ONE_LISTENER_PER_ENGINE = Version(0, 11, 1)
# NixlConnector reads the role from kv_role (kv_both is deprecated from 0.23.0,
# nixl/connector.py L97-103 in 0.33.0; 0.11.0's connector reads no role, so these are taken
# and change nothing there).
KV_ROLE = {"prefill": "kv_producer", "decode": "kv_consumer"}
PULL_CONNECTOR, PUSH_CONNECTOR = "NixlConnector", "NixlPushConnector"
# The first release with NixlPushConnector (prefill WRITEs into the decode's blocks).
PUSH_CONNECTOR_SINCE = Version(0, 24, 0)
# NIXL's UCX thread pool each release's connector asks for: 0.11.0 nixl_agent_config(
# num_threads=8) (nixl_connector.py L481), 0.33.0 kv_connector_extra_config "num_threads",
# default 4 (nixl/base_worker.py L730); neither sets split_batch_size.
NIXL_THREADS = {Version(0, 11, 0): 8, Version(0, 33, 0): 4}
# The first release with --prefix-match-unit (prefix-cache hits finer than a KV block).
PREFIX_MATCH_UNIT_SINCE = Version(0, 33, 0)
# The largest --block-size the operator picks: 0.11.0's parser offers 1 to 128
# (tests/fixtures/engines/vllm-0.11.0.json); 0.33.0 takes any size, 256 is the planner's cap.
MAX_BLOCK_TOKENS = {Version(0, 11, 0): 128}
# The descriptor the block choice aims at: vLLM cannot set NIXL's split_batch_size, and at
# NIXL's default split its 4-thread pattern (one request) moved 87-135 GB/s at 512 KiB and
# 195-271 at 1 MiB pushing, 94-110 at 1 MiB pulling (docs/benchmarks.md).
TRANSFER_DESCRIPTOR_BYTES = 1 << 20
# vllm-router's --kv-connector value for each connector: its `nixl` mode reads the prefill's
# transfer_mode (pull or push) from the answer.
ROUTER_KV_CONNECTOR = {PULL_CONNECTOR: "nixl", PUSH_CONNECTOR: "nixl"}
# smg reads a vLLM pod's connector from this annotation in discovery mode (with it, smg sends
# the prefill leg `kv_transfer_params` as vllm-router does), so smg as a custom router
# (spec.router.command) pairs these pods too. vllm-router needs no annotation for NIXL.
SMG_KV_CONNECTOR_ANNOTATION = "smg.ai/kv-connector"
# The CPU tier (spec.kvCache.offload.cpu) is vLLM's OffloadingConnector beside the NIXL one in
# a MultiConnector, which saves to every child and loads from the first that has the tokens
# (v1/multi_connector.py); the offloading child returns no kv_transfer_params, so the NIXL
# child's still reach the router. Not `--kv-offloading-size`: in 0.33.0 that flag replaces
# the configured connector with the offloading one (config/vllm.py,
# _post_init_kv_transfer_config), and P/D would move no KV.
MULTI_CONNECTOR, OFFLOADING_CONNECTOR = "MultiConnector", "OffloadingConnector"
# The first release whose OffloadingConnector takes its size in bytes per engine
# (`cpu_bytes_to_use`: 0.14.0 v1/kv_offload/cpu.py L25, 0.33.0 cpu/spec.py L100); up to 0.13.0
# in CPU blocks of the engine's block size (`num_cpu_blocks`, required), which needs the
# model's shape. Neither release reads the other key (the fixtures' kv_transfer_config).
OFFLOAD_BYTES_SINCE = Version(0, 14, 0)


# Flags rendered from spec fields (EngineAdapter.reserved_flags), each with the field to set
# instead: the layout is the role's parallelism over gpusPerInstance x nodesPerInstance GPUs,
# and the multi-node flags differ per rank, which only the operator knows.
RESERVED_FLAGS = {
    "--tensor-parallel-size": "spec.<role>.parallelism.tensor",
    "-tp": "spec.<role>.parallelism.tensor",
    "--pipeline-parallel-size": "spec.<role>.parallelism.pipeline",
    "-pp": "spec.<role>.parallelism.pipeline",
    "--data-parallel-size": "spec.<role>.parallelism.data",
    "-dp": "spec.<role>.parallelism.data",
    "--data-parallel-size-local": "spec.<role>.parallelism and gpusPerInstance",
    "--data-parallel-address": "the instance's leader (nodesPerInstance)",
    "--data-parallel-rpc-port": "the instance's leader (nodesPerInstance)",
    "--data-parallel-start-rank": "the pod's rank (nodesPerInstance)",
    "--headless": "the pod's rank (nodesPerInstance)",
    "--enable-expert-parallel": "spec.<role>.parallelism.expert",
    "--kv-transfer-config": "spec.kvTransfer",
    # vLLM 0.33's offload flags replace the NIXL connector with the offloading one
    # (config/vllm.py, _post_init_kv_transfer_config): P/D would stop moving any KV.
    "--kv-offloading-size": "spec.kvCache.offload.cpu",
    "--kv-offloading-backend": "spec.kvCache.offload.cpu",
    "--host": "0.0.0.0",
    "--port": "spec.engine.port",
    "--served-model-name": "spec.model.servedName",
    "--block-size": "spec.engine.kvBlockSize",
    "--model": "spec.model.name",
}
# vllm-router 0.1.17's policies that run with what the operator renders (its own --policy
# names, tests/fixtures/routers). kv_aware routes prefill by the KV events the prefill
# engines publish (vllm_kv_events), so the CRD takes it as spec.router.prefillPolicy only.
ROUTER_POLICIES = (
    "cache_aware",
    vllm_kv_events.KV_AWARE,
    "round_robin",
    "random",
    "power_of_two",
    "consistent_hash",
    "sticky_least_loaded",
)


class VllmAdapter(EngineAdapter):
    type = "vllm"
    display_name = "vLLM"
    reserved_flags = RESERVED_FLAGS
    router_policies = ROUTER_POLICIES
    versions = SupportedVersions(Version(0, 11, 0), Version(0, 33, 0))
    lora_flag = "--lora-modules"
    kv_layout = KvLayout(default_block_tokens=16, packed=True)
    # The base health check (/health, the kubelet's 1 s timeout) serves: vLLM's /health
    # answers from a flag (vllm/entrypoints/openai/api_server.py, `health`: the engine
    # client's check_health raises once the engine core is dead).
    # NixlConnector: the decode worker READs the prefill's blocks (nixl_connector.py,
    # _read_blocks), in v0.11.0 and 0.33.0 alike; NixlPushConnector WRITEs (kv_pattern).
    kv_operation = "READ"

    def own_spec_rules(self) -> list[tuple[str, str]]:
        tp = cel_rules.tensor_size
        return [
            (
                # NixlConnector (v0.11.0, nixl_connector.py add_remote_agent): tp_ratio =
                # divide(decode TP, prefill TP), asserted > 0 ("Decode TP cannot be smaller
                # than prefill TP"); divide() asserts that it divides.
                f"self.engine.type != 'vllm' || {tp('decode')} % {tp('prefill')} == 0",
                "spec.prefill and spec.decode TP sizes (parallelism.tensor, else "
                "gpusPerInstance): vLLM's NIXL connector needs the decode TP to be a multiple "
                "of the prefill TP (each decode rank reads from one prefill rank): e.g. 2 and 4 "
                "or 4 and 4, not 4 and 2, not 3 and 4",
            ),
            *_layout_rules("prefill"),
            *_layout_rules("decode"),
            *_kv_aware_rules(),
            *_disk_tier_rules(),
        ]

    def launch(self, spec: PDDeploymentSpec, role: str) -> EngineLaunch:
        kv_config = self.kv_transfer_config(spec, role)
        args = [
            model_location(spec, self.model_dir),
            *model_flags(spec),
            "--host",
            "0.0.0.0",
            "--port",
            str(spec.engine.port),
            *_layout_flags(self.layout(spec, role)),
            KV_TRANSFER_CONFIG,
            _json(kv_config),
        ]
        env: tuple[EnvEntry, ...] = (
            env_pod_ip(VLLM_NIXL_SIDE_CHANNEL_HOST),
            env_value(VLLM_NIXL_SIDE_CHANNEL_PORT, str(spec.kvTransfer.sideChannelPort)),
        )
        if role == "prefill" and self._publishes_kv_events(spec):
            args += vllm_kv_events.launch_args()
            env += vllm_kv_events.launch_env()
        return EngineLaunch(("vllm", "serve"), tuple(args), env)

    def kv_events_verdict(self, spec: PDDeploymentSpec) -> TierVerdict | None:
        if not vllm_kv_events.chosen(spec):
            return None
        return vllm_kv_events.verdict(spec, self.wiring(spec))

    def _publishes_kv_events(self, spec: PDDeploymentSpec) -> bool:
        verdict = self.kv_events_verdict(spec)
        return verdict is not None and verdict.rendered

    def kv_transfer_config(self, spec: PDDeploymentSpec, role: str) -> dict[str, Any]:
        return {"kv_connector": self.connector(spec), "kv_role": KV_ROLE[role]}

    def cpu_tier_verdict(self, spec: PDDeploymentSpec, tier: CpuTier) -> TierVerdict:
        sized = self._offload_size(spec, tier)
        if sized is not None and sized[1] < 1:
            return TierVerdict(
                False,
                f"{sized[1]} KV blocks of {spec.model.name} fit in each engine's share of the "
                "figure: the prefill pods run without the tier; give more host memory",
            )
        if sized is None:
            return TierVerdict(
                False,
                f"vLLM {self.wiring(spec)} sizes its CPU tier in KV blocks, and the shape of "
                f"{spec.model.name} is not known to the operator: the prefill pods run without "
                "the tier; set spec.model.kvCache, or run vLLM "
                f"{OFFLOAD_BYTES_SINCE} or later (sized in bytes)",
            )
        key, value = sized
        engines = self._engines_per_pod(spec)
        each = f"each of its {engines} engines" if engines > 1 else "its engine"
        return TierVerdict(
            True,
            f"each prefill pod gives {each} an {OFFLOADING_CONNECTOR} beside the "
            f"{self.connector(spec)} ({key} {value})",
            # 0.33.0 maps the tier from a file in /dev/shm (cpu/shared_offload_region.py)
            # and refuses to start where /dev/shm has less room; 0.11.0 pins process memory.
            # Between them the releases are not read: every release sized in bytes gets the
            # room (a sizeLimit allocates nothing; the memory request already holds it).
            in_shared_memory=key == "cpu_bytes_to_use",
        )

    def cpu_tier_launch(
        self, launch: EngineLaunch, spec: PDDeploymentSpec, tier: CpuTier
    ) -> EngineLaunch:
        sized = self._offload_size(spec, tier)
        assert sized is not None, "rendered only where the verdict says so"
        key, value = sized
        offload = {
            "kv_connector": OFFLOADING_CONNECTOR,
            "kv_role": "kv_both",  # it reads no role, but vLLM refuses a connector without one
            "kv_connector_extra_config": {key: value},
        }
        return _with_connector_child(launch, offload)

    def disk_tier_verdict(self, spec: PDDeploymentSpec, tier: DiskTier) -> TierVerdict:
        return vllm_disk_tier.verdict(tier, self.wiring(spec), self._engines_per_pod(spec))

    def disk_tier_launch(
        self, launch: EngineLaunch, spec: PDDeploymentSpec, tier: DiskTier
    ) -> EngineLaunch:
        del spec
        return _with_connector_child(launch, vllm_disk_tier.connector_child(tier))

    def _offload_size(self, spec: PDDeploymentSpec, tier: CpuTier) -> tuple[str, int] | None:
        """The OffloadingConnector's size key and value for one engine of a prefill pod, or
        None where the release counts blocks and the model's shape is unknown."""
        engine_bytes = tier.pod_bytes // self._engines_per_pod(spec)
        if self.wiring(spec) >= OFFLOAD_BYTES_SINCE:
            return "cpu_bytes_to_use", engine_bytes
        if tier.engine_bytes_per_token is None:
            return None
        return "num_cpu_blocks", engine_bytes // (tier.block_tokens * tier.engine_bytes_per_token)

    def _engines_per_pod(self, spec: PDDeploymentSpec) -> int:
        """The data-parallel engines one prefill pod runs (each sizes its own tier)."""
        return max(1, self.layout(spec, "prefill").data // spec.prefill.nodesPerInstance)

    def connector(self, spec: PDDeploymentSpec) -> str:
        """spec.kvTransfer.connector, or for `auto` the push connector where prefill and
        decode share a PID namespace (UCX's cuda_ipc lane) and the release has it: there a
        WRITE in vLLM's pattern (4 NIXL threads, one request) moved 127 GB/s at 512 KiB
        descriptors against READ's 50 (docs/benchmarks.md, "Each engine's own pattern").
        Elsewhere the KV goes over RDMA or TCP, where the pull connector is the measured
        and long-standing default."""
        chosen = spec.kvTransfer.connector
        if chosen != "auto":
            return chosen
        push = shares_pid_namespace(spec) and self.wiring(spec) >= PUSH_CONNECTOR_SINCE
        return PUSH_CONNECTOR if push else PULL_CONNECTOR

    def kv_pattern(self, spec: PDDeploymentSpec) -> KvPattern:
        """The pull connector's decode READs, the push connector's prefill WRITEs; both with
        the thread pool the release's connector asks NIXL for."""
        operation: KvOperation = "WRITE" if self.connector(spec) == PUSH_CONNECTOR else "READ"
        return KvPattern(operation, NIXL_THREADS.get(self.wiring(spec), 4))

    def block_flags(self, spec: PDDeploymentSpec, tokens: int) -> tuple[str, ...]:
        """``--block-size``, and from 0.33 prefix-cache hits kept at vLLM's default 16-token
        granularity (``--prefix-match-unit``) however large the block."""
        flags: tuple[str, ...] = ("--block-size", str(tokens))
        default = self.kv_layout.default_block_tokens
        finer = tokens > default and tokens % default == 0
        if finer and self.wiring(spec) >= PREFIX_MATCH_UNIT_SINCE:
            flags += ("--prefix-match-unit", str(default))
        return flags

    def max_block_tokens(self, spec: PDDeploymentSpec) -> int:
        return MAX_BLOCK_TOKENS.get(self.wiring(spec), MAX_CHOSEN_BLOCK_TOKENS)

    def transfer_descriptor_bytes(self, spec: PDDeploymentSpec) -> int:
        del spec
        return TRANSFER_DESCRIPTOR_BYTES

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
        side = (EnginePort(_port_name(i), port) for i, port in enumerate(self._side_ports(spec)))
        return (*side, *self.router_ports(spec))

    def router_ports(self, spec: PDDeploymentSpec) -> tuple[EnginePort, ...]:
        """The prefill engines' KV event publishers, where the router subscribes to them."""
        if not self._publishes_kv_events(spec):
            return ()
        return vllm_kv_events.ports(self._engines_per_pod(spec))

    def side_channel(self, spec: PDDeploymentSpec) -> SideChannel:
        served_by = SIDE_CHANNEL_SERVED_BY[VLLM_SIDE_CHANNEL]
        common = self._side_ports(spec)
        by_rank = {role: self._rank_ports(spec, role) for role in served_by}
        differing = {role: ports for role, ports in by_rank.items() if ports != (common,)}
        return SideChannel(VLLM_SIDE_CHANNEL, common, served_by, differing)

    def _side_ports(self, spec: PDDeploymentSpec) -> tuple[int, ...]:
        """The side-channel ports a role's first (rank 0) pod listens on, for both roles."""
        per_pod = max(self._listeners_per_pod(spec, role) for role in ("prefill", "decode"))
        base = spec.kvTransfer.sideChannelPort
        return tuple(range(base, base + per_pod))

    def _rank_ports(self, spec: PDDeploymentSpec, role: str) -> RankPorts:
        """Each rank's own listeners: the ports count global data-parallel ranks (and, up to
        0.11.0, TP workers within them), and rank r's pod runs the r-th share of them."""
        per_pod = self._listeners_per_pod(spec, role)
        first = spec.kvTransfer.sideChannelPort
        ranks = range(role_spec(spec, role).nodesPerInstance)
        return tuple(tuple(range(first + r * per_pod, first + (r + 1) * per_pod)) for r in ranks)

    def _listeners_per_pod(self, spec: PDDeploymentSpec, role: str) -> int:
        layout = self.layout(spec, role)
        local_engines = max(1, layout.data // role_spec(spec, role).nodesPerInstance)
        if self.wiring(spec) >= ONE_LISTENER_PER_ENGINE:
            return local_engines
        return local_engines * layout.tensor  # one per GPU worker

    def router(self, spec: PDDeploymentSpec, discovery: RouterDiscovery) -> RouterLaunch:
        connector = ROUTER_KV_CONNECTOR[self.connector(spec)]
        mode = ("--vllm-pd-disaggregation", "--kv-connector", connector)
        args = pd_router_args(spec.router, discovery, mode)
        return RouterLaunch(("vllm-router",), args)

    def pod_annotations(self, spec: PDDeploymentSpec, role: str) -> dict[str, str]:
        del role
        return {SMG_KV_CONNECTOR_ANNOTATION: self.connector(spec)}


def _with_connector_child(launch: EngineLaunch, child: dict[str, Any]) -> EngineLaunch:
    """``launch`` with ``child`` after the connectors of its --kv-transfer-config: the
    MultiConnector's list grows, or a MultiConnector of the NIXL connector and ``child`` takes
    the NIXL connector's place (the top-level role stays the NIXL connector's)."""
    args = list(launch.args)
    at = args.index(KV_TRANSFER_CONFIG) + 1
    config = json.loads(args[at])
    if config["kv_connector"] == MULTI_CONNECTOR:
        config["kv_connector_extra_config"]["connectors"].append(child)
    else:
        config = {
            "kv_connector": MULTI_CONNECTOR,
            "kv_role": config["kv_role"],
            "kv_connector_extra_config": {"connectors": [config, child]},
        }
    args[at] = _json(config)
    return EngineLaunch(launch.command, tuple(args), launch.env)


def _disk_tier_rules() -> list[tuple[str, str]]:
    """The disk tier's connector turns itself off without the prefix cache."""
    return [
        cel_rules.flags_refused_while(
            "vllm",
            "has(self.kvCache.offload.disk)",
            (vllm_disk_tier.NO_PREFIX_CACHING,),
            "spec.kvCache.offload.disk: vLLM's disk tier keeps the prefix cache's blocks, and "
            "turns itself off without it",
        )
    ]


def _kv_aware_rules() -> list[tuple[str, str]]:
    """kv_aware for prefill alone: decode pods publish no KV events to route by."""
    kv_aware = vllm_kv_events.KV_AWARE
    chosen = f"(has(self.router.prefillPolicy) && self.router.prefillPolicy == '{kv_aware}')"
    own_config = cel_rules.flags_refused_while(
        "vllm",
        chosen,
        (vllm_kv_events.KV_EVENTS_CONFIG,),
        f"spec.router.prefillPolicy {kv_aware} renders the prefill engines' KV event publishers",
    )
    prefill_only = [
        (
            f"self.engine.type != 'vllm' || !has(self.router.{name}) || "
            f"self.router.{name} != '{kv_aware}'",
            f"spec.router.{name}: {kv_aware} routes the prefill pods by the KV events they "
            f"publish; set it as spec.router.prefillPolicy (decode pods publish none)",
        )
        for name in ("policy", "decodePolicy")
    ]
    return [own_config, *prefill_only]


def _layout_rules(role: str) -> list[tuple[str, str]]:
    """The role's parallelism must cover the instance's GPUs as vLLM lays them out: whole
    data-parallel ranks of tensor x pipeline GPUs, each on one node."""
    r = f"self.{role}"
    p = f"{r}.parallelism"
    gpus = f"{r}.gpusPerInstance * {r}.nodesPerInstance"
    field = f"spec.{role}.parallelism"
    return [
        (
            f"self.engine.type != 'vllm' || !has({p}) || "
            f"{p}.tensor * {p}.pipeline * {p}.data == {gpus}",
            f"{field}: for vLLM tensor x pipeline x data must equal the instance's GPUs "
            f"(spec.{role}.gpusPerInstance x spec.{role}.nodesPerInstance)",
        ),
        (
            f"self.engine.type != 'vllm' || !has({p}) || "
            f"{r}.gpusPerInstance % ({p}.tensor * {p}.pipeline) == 0",
            f"{field}: for vLLM one data-parallel rank (tensor x pipeline GPUs) must fit on "
            f"one node, whole: tensor x pipeline must divide spec.{role}.gpusPerInstance",
        ),
        (
            f"self.engine.type != 'vllm' || !has({p}) || {p}.expert == 1 || "
            f"{p}.expert == {p}.tensor * {p}.data",
            f"{field}.expert: vLLM's expert-parallel size is tensor x data; set expert to "
            "that product (or 1: off)",
        ),
    ]


def _json(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"))


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
