"""SGLang (``sglang serve``; ``python3 -m sglang.launch_server`` before 0.5.5) in its
disaggregation mode with NIXL.

The role is ``--disaggregation-mode``; the decode side fetches the prefill side's NIXL
metadata from the bootstrap server that only prefill pods run (``--disaggregation-bootstrap-
port``). K and V move as separate descriptors; ``--page-size`` is planning.kv_layout's
choice (``block_flags``).

The router is smg 1.13.0 (PyPI ``smg``, the current name of sglang-router) as ``smg launch``
in PD mode: it gives both legs of a request the prefill pod's address, bootstrap port and a
bootstrap room. It learns the bootstrap port of a discovered prefill pod from the pod's
``sglang.ai/bootstrap-port`` annotation, and connects to that port once when it registers
the pod (``router_ports``). Its flags are checked against
tests/fixtures/routers/smg-1.13.0.launch.help.txt.
"""

from __future__ import annotations

from pdd_contract.ports import SGLANG_SIDE_CHANNEL, SIDE_CHANNEL_SERVED_BY
from pdd_operator.api.v1alpha1 import LoraAdapter, PDDeploymentSpec
from pdd_operator.engines import cel_rules
from pdd_operator.engines.base import (
    DISK_CAP_SHARE,
    DISK_TIER_MOUNT,
    MAX_CHOSEN_BLOCK_TOKENS,
    CpuTier,
    DiskTier,
    EngineAdapter,
    EngineLaunch,
    EnginePort,
    HealthCheck,
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
    env_value,
    model_flags,
    model_location,
    pd_router_args,
    role_spec,
)
from pdd_operator.engines.version import SupportedVersions, Version

BOOTSTRAP_PORT_NAME = "bootstrap"
BOOTSTRAP_PORT_ANNOTATION = "sglang.ai/bootstrap-port"

# SGLang's /health is the handler of /health_generate (sglang/srt/entrypoints/http_server.py,
# `health_generate`, in 0.5.4 and 0.5.23 alike; 0.5.23 skips the generation only where
# SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION is turned off, sglang/srt/environ.py): it queues a
# one-token generation and sleeps 1 s before it first looks for the scheduler's output, so a
# healthy engine answers after 1 s at the earliest, and later while a long batch runs. Up to
# 0.5.19 it is the one endpoint that answers from the engine's state: there is no /ready, and
# /ping, /get_model_info and /v1/models answer from the HTTP server alone.
HEALTH_PATH = "/health"
# What smg, SGLang's router, gives the same endpoint (its --health-check-timeout-secs default,
# tests/fixtures/routers/smg-1.13.0.launch.help.txt): the kubelet calls an engine unready no
# sooner than the router in front of it calls it unhealthy. SGLang itself answers 503 only
# after SGLANG_HEALTH_CHECK_TIMEOUT (20 s) without output. /ready keeps it: a flag, but
# answered by an event loop that also tokenizes.
HEALTH_TIMEOUT_S = 5
# From 0.5.20 `/ready` answers from the engine's state without generating (http_server.py,
# `ready`: 200 once warm-up is done, 503 while starting, paused or shutting down).
READY_PATH = "/ready"
READY_ENDPOINT = Version(0, 5, 20)

# `sglang serve`, the console script (sglang/cli/serve.py), from 0.5.5; from 0.5.10
# `python -m sglang.launch_server` warns that `sglang serve` is the recommended entrypoint.
SERVE_CLI = Version(0, 5, 5)
# Decode with data-parallel attention asserts `--prefill-round-robin-balance` from 0.5.2 to
# 0.5.7 (server_args.py, "Prefill round robin balance is required when dp size > 1"; the
# prefill's --load-balance-method defaults to round_robin there); 0.5.8 deprecates it as a
# no-op and 0.5.20 refuses it.
ROUND_ROBIN_ASSERTED = (Version(0, 5, 2), Version(0, 5, 8))
# `--attn-dp-size N` replaces `--dp-size N --enable-dp-attention` from 0.5.22
# (srt/arg_groups/fields/parallel.py), where --dp-size came to mean full model replicas and
# --enable-dp-attention is deprecated for removal after 2026-12-31.
ATTN_DP_SIZE = Version(0, 5, 22)
# NIXL's UCX thread pool on the WRITEing (prefill) side: 0.5.4 creates its agent with NIXL's
# defaults (disaggregation/nixl/conn.py L135, no threads), 0.5.23 with num_threads 8 on the
# prefill (conn.py L552), passed to the UCX backend; neither sets split_batch_size.
NIXL_THREADS = {Version(0, 5, 4): 0, Version(0, 5, 23): 8}
# 0.5.23 hands SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS to NIXL's UCX backend (conn.py
# L553-615; 0.5.4 has no such variable). With each descriptor its own share of a request
# (split_batch_size 1) its 8-thread WRITE moved 225-248 GB/s at 512 KiB, against 85-125 at
# NIXL's default split (docs/benchmarks.md), so the operator sets it unless the user's env does.
NIXL_BACKEND_PARAMS = "SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS"
BACKEND_PARAMS_SINCE = Version(0, 5, 23)
SPLIT_EACH_DESCRIPTOR = '{"split_batch_size":"1"}'


# The CPU tier (spec.kvCache.offload.cpu) is SGLang's hierarchical cache on the prefill
# servers: each GPU rank's scheduler pins a host pool of --hicache-size decimal gigabytes
# (mem_cache/memory_pool_host.py in 0.5.4, pool_host/base.py in 0.5.23: host_size * 1e9).
# Decode servers refuse it (0.5.4; 0.5.23 only with an experimental radix cache on decode).
HICACHE_FLAGS = ("--enable-hierarchical-cache", "--hicache-size")
GIGABYTE = 10**9
METRICS_FLAG = "--enable-metrics"
# The disk tier (spec.kvCache.offload.disk) is the hierarchical cache's file storage backend:
# pages under SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR, each TP rank's own files capped at
# SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE bytes (mem_cache/storage/file/lru_file_evictor.py,
# 0.5.23: its least recently used files are deleted). 0.5.4 has no cap: its files would grow
# until the volume is full (an emptyDir over its sizeLimit gets the pod evicted). Not
# bisected: the releases between are taken to have none.
STORAGE_BACKEND_FLAGS = ("--hicache-storage-backend", "file")
STORAGE_DIR_ENV = "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"
STORAGE_CAP_ENV = "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE"
STORAGE_CAPPED = Version(0, 5, 23)
# From here a host pool smaller than the GPU's KV pool is a warning (0.5.23 pool_host/base.py);
# 0.5.4 asserts it is larger. Not bisected: the first release read that allows it.
HOST_POOL_MAY_BE_SMALLER = Version(0, 5, 23)


# Flags rendered from spec fields (EngineAdapter.reserved_flags), each with the field to set
# instead.
RESERVED_FLAGS = {
    "--tp-size": "spec.<role>.parallelism.tensor",
    "--tp": "spec.<role>.parallelism.tensor",
    "--tensor-parallel-size": "spec.<role>.parallelism.tensor",
    "--pp-size": "spec.<role>.parallelism.pipeline",
    "--pipeline-parallel-size": "spec.<role>.parallelism.pipeline",
    "--dp-size": "spec.<role>.parallelism.data",
    "--dp": "spec.<role>.parallelism.data",
    "--data-parallel-size": "spec.<role>.parallelism.data",
    "--enable-dp-attention": "spec.<role>.parallelism.data",
    "--attn-dp-size": "spec.<role>.parallelism.data",
    "--attention-data-parallel-size": "spec.<role>.parallelism.data",
    "--prefill-round-robin-balance": "spec.<role>.parallelism.data",
    "--ep-size": "spec.<role>.parallelism.expert",
    "--ep": "spec.<role>.parallelism.expert",
    "--nnodes": "spec.<role>.nodesPerInstance",
    "--node-rank": "the pod's rank (nodesPerInstance)",
    "--dist-init-addr": "the instance's leader (nodesPerInstance)",
    "--disaggregation-mode": "the role",
    "--disaggregation-transfer-backend": "spec.kvTransfer.backend",
    "--disaggregation-bootstrap-port": "spec.kvTransfer.bootstrapPort",
    "--host": "0.0.0.0",
    "--port": "spec.engine.port",
    "--served-model-name": "spec.model.servedName",
    "--page-size": "spec.engine.kvBlockSize",
    "--model-path": "spec.model.name",
    "--model": "spec.model.name",
}
# smg 1.13.0's policies that run with what the operator renders (its own --policy names,
# tests/fixtures/routers). Left out: passthrough, manual and (prefill only) bucket, which need
# request headers or a bucket configuration of their own.
ROUTER_POLICIES = (
    "cache_aware",
    "round_robin",
    "random",
    "power_of_two",
    "least_load",
    "consistent_hashing",
    "prefix_hash",
)
# The hierarchical-cache flags spec.kvCache.offload renders: refused in the args while it is
# set (a user's own, without it, stay theirs).
OFFLOAD_FLAGS = (
    "--enable-hierarchical-cache",
    "--enable-hicache",
    "--hicache-size",
    "--hicache-ratio",
)
DISK_FLAGS = ("--hicache-storage-backend", "--hicache-storage-backend-extra-config")


class SglangAdapter(EngineAdapter):
    type = "sglang"
    display_name = "SGLang"
    reserved_flags = RESERVED_FLAGS
    router_policies = ROUTER_POLICIES
    rendered_switches = (METRICS_FLAG,)
    versions = SupportedVersions(Version(0, 5, 4), Version(0, 5, 23))
    lora_flag = "--lora-paths"
    kv_layout = KvLayout(default_block_tokens=1, packed=False)
    # The NIXL backend's prefill side WRITEs into the decode's pages (disaggregation/nixl).
    kv_operation = "WRITE"

    def own_spec_rules(self) -> list[tuple[str, str]]:
        return [
            cel_rules.flags_refused_while(
                "sglang",
                "has(self.kvCache.offload.cpu)",
                OFFLOAD_FLAGS,
                "spec.kvCache.offload.cpu renders SGLang's hierarchical cache",
            ),
            cel_rules.flags_refused_while(
                "sglang",
                "has(self.kvCache.offload.disk)",
                DISK_FLAGS,
                "spec.kvCache.offload.disk renders SGLang's hierarchical cache storage",
            ),
            cel_rules.env_refused_while(
                "sglang",
                "has(self.kvCache.offload.disk)",
                (STORAGE_DIR_ENV, STORAGE_CAP_ENV),
                "spec.kvCache.offload.disk sets where SGLang's storage tier is and its size",
            ),
            *_layout_rules("prefill"),
            *_layout_rules("decode"),
            _experts_rule("prefill"),
            _experts_rule("decode"),
        ]

    def adapter_request_fields(
        self, spec: PDDeploymentSpec, adapter: LoraAdapter
    ) -> dict[str, str]:
        """The served model and the adapter in `lora_path`: SGLang reads an adapter from
        `model` only as `<served name>:<adapter>` (a bare adapter name there runs the base
        model), else from `lora_path` (entrypoints/openai/serving_base.py,
        `_resolve_lora_path`, 0.5.4 and 0.5.23); smg 1.13.0 picks workers by the exact
        `model`, so only the served name reaches them through the router."""
        return {"model": spec.model.served_name, "lora_path": adapter.name}

    def cpu_tier_verdict(self, spec: PDDeploymentSpec, tier: CpuTier) -> TierVerdict:
        gigabytes = tier.rank_bytes // GIGABYTE
        if gigabytes < 1:
            return TierVerdict(
                False,
                f"spec.kvCache.offload.cpu over the prefill pod's {tier.ranks} GPUs is under "
                "the 1 GB per GPU SGLang sizes its host tier in: the prefill pods run without "
                f"the tier; give at least {tier.ranks}G",
            )
        # 0.5.4 asserts the host pool is larger than the GPU's KV pool (memory_pool_host.py),
        # which only the engine knows.
        larger = (
            "; SGLang 0.5.4 refuses to start unless that exceeds each GPU's KV cache"
            if self.wiring(spec) < HOST_POOL_MAY_BE_SMALLER
            else ""
        )
        return TierVerdict(
            True,
            f"each prefill GPU rank keeps a hierarchical cache of {gigabytes} GB in host "
            f"memory (--hicache-size){larger}",
        )

    def cpu_tier_launch(
        self, launch: EngineLaunch, spec: PDDeploymentSpec, tier: CpuTier
    ) -> EngineLaunch:
        del spec
        flags = (HICACHE_FLAGS[0], HICACHE_FLAGS[1], str(tier.rank_bytes // GIGABYTE))
        return EngineLaunch(launch.command, (*launch.args, *flags), launch.env)

    def disk_tier_verdict(self, spec: PDDeploymentSpec, tier: DiskTier) -> TierVerdict:
        release = self.wiring(spec)
        if release < STORAGE_CAPPED:
            return TierVerdict(
                False,
                f"SGLang {release}'s file storage backend has no size cap as far as the "
                f"operator knows ({STORAGE_CAPPED} has one: {STORAGE_CAP_ENV}): its files would "
                "outgrow the volume. The prefill pods run without the disk tier; use SGLang "
                "0.5.23 or later",
            )
        if not tier.with_cpu_tier:
            return TierVerdict(
                False,
                "SGLang's storage tier sits behind its host tier: set spec.kvCache.offload.cpu "
                "as well. The prefill pods run without the disk tier",
            )
        if spec.prefill.nodesPerInstance > 1:
            # Each rank looks its pages up in its own pod's files; a latent (MLA) model's
            # pages are written by one rank only, so the other pods' ranks would never hit.
            return TierVerdict(
                False,
                "the file storage backend keeps each pod's pages on that pod: with prefill "
                "instances over several nodes (spec.prefill.nodesPerInstance) the disk tier "
                "is not rendered",
            )
        who = (
            "rank 0 of each prefill pod keeps (the latent cache is the same on every rank, "
            "and one rank writes it)"
            if tier.latent
            else "each prefill GPU rank keeps"
        )
        return TierVerdict(
            True,
            f"{who} up to {self._storage_cap(spec, tier)} bytes of KV pages in files under "
            f"{DISK_TIER_MOUNT} (--hicache-storage-backend file, {STORAGE_CAP_ENV}: "
            f"{DISK_CAP_SHARE:.0%} of the volume's share)",
        )

    def disk_tier_launch(
        self, launch: EngineLaunch, spec: PDDeploymentSpec, tier: DiskTier
    ) -> EngineLaunch:
        env = (
            env_value(STORAGE_DIR_ENV, DISK_TIER_MOUNT),
            env_value(STORAGE_CAP_ENV, str(self._storage_cap(spec, tier))),
        )
        return EngineLaunch(
            launch.command, (*launch.args, *STORAGE_BACKEND_FLAGS), (*launch.env, *env)
        )

    @staticmethod
    def _storage_cap(spec: PDDeploymentSpec, tier: DiskTier) -> int:
        """Each rank's cap, which its own files are held under (storage/file/
        lru_file_evictor.py): the pod's disk over its ranks, or all of it where only one rank
        writes (a latent model: hicache_storage.py shares one file per page)."""
        del spec
        share = tier.pod_bytes if tier.latent else tier.rank_bytes
        return int(share * DISK_CAP_SHARE)

    def launch(self, spec: PDDeploymentSpec, role: str) -> EngineLaunch:
        release = self.wiring(spec)
        layout = self.layout(spec, role)
        command, entry = (
            (("sglang",), ["serve"])
            if release >= SERVE_CLI
            else (("python3",), ["-m", "sglang.launch_server"])
        )
        args = [
            *entry,
            "--model-path",
            model_location(spec, self.model_dir),
            *model_flags(spec),
            "--host",
            "0.0.0.0",
            "--port",
            str(spec.engine.port),
            *_layout_flags(layout, release),
            "--disaggregation-mode",
            role,
            "--disaggregation-transfer-backend",
            "nixl",
            "--disaggregation-bootstrap-port",
            str(spec.kvTransfer.bootstrapPort),
            # SGLang serves its sglang:* metrics on /metrics only with this (off by default in
            # 0.5.4 and 0.5.23): the chart's PodMonitors and dashboard read them.
            METRICS_FLAG,
        ]
        oldest, fixed = ROUND_ROBIN_ASSERTED
        if role == "decode" and layout.data > 1 and oldest <= release < fixed:
            args.append("--prefill-round-robin-balance")
        split = self._splits(spec, role)
        env = (env_value(NIXL_BACKEND_PARAMS, SPLIT_EACH_DESCRIPTOR),) if split else ()
        return EngineLaunch(command, tuple(args), env)

    def kv_pattern(self, spec: PDDeploymentSpec) -> KvPattern:
        """The prefill WRITEs, with its release's threads and the split the operator sets."""
        split = 1 if self._splits(spec, "prefill") else 0
        return KvPattern("WRITE", NIXL_THREADS.get(self.wiring(spec), 0), split)

    def _splits(self, spec: PDDeploymentSpec, role: str) -> bool:
        """Whether the operator sets NIXL's split for this role: the release reads the
        variable and neither spec.engine.env nor the role's env sets it."""
        if self.wiring(spec) < BACKEND_PARAMS_SINCE:
            return False
        users = (*spec.engine.env, *role_spec(spec, role).env)
        return all(var.name != NIXL_BACKEND_PARAMS for var in users)

    def block_flags(self, spec: PDDeploymentSpec, tokens: int) -> tuple[str, ...]:
        del spec
        return ("--page-size", str(tokens))

    def max_block_tokens(self, spec: PDDeploymentSpec) -> int:
        del spec
        return MAX_CHOSEN_BLOCK_TOKENS

    def multinode(self, spec: PDDeploymentSpec, role: str, meet: Rendezvous) -> MultiNodeLaunch:
        """SGLang's own multi-node launch: the same command on every node with --nnodes,
        --node-rank and --dist-init-addr (rank 0's torch.distributed store)."""
        del spec, role
        return MultiNodeLaunch(
            args=("--nnodes", str(meet.nodes), "--dist-init-addr", meet.address),
            rank_flags=(RankFlag("--node-rank"),),
        )

    def ports(self, spec: PDDeploymentSpec) -> tuple[EnginePort, ...]:
        return (_bootstrap_port(spec),)

    def router_ports(self, spec: PDDeploymentSpec) -> tuple[EnginePort, ...]:
        # smg 1.13.0 connects to each prefill's bootstrap port when it registers the pod
        # (model_gateway/src/worker/bootstrap_probe.rs, in its wheel's smg_rs.abi3.so: "Bootstrap
        # port did not accept a connection at registration: ... its disaggregated partners
        # cannot rendezvous there"). Closed, every registration logs that as a failure.
        return (_bootstrap_port(spec),)

    def health_check(self, spec: PDDeploymentSpec) -> HealthCheck:
        path = READY_PATH if self.wiring(spec) >= READY_ENDPOINT else HEALTH_PATH
        return HealthCheck(path=path, timeout_s=HEALTH_TIMEOUT_S)

    def side_channel(self, spec: PDDeploymentSpec) -> SideChannel:
        """The prefill's bootstrap server, which only an instance's rank-0 pod runs: the
        tokenizer manager starts it (0.5.23 managers/tokenizer_manager.py L806), and nodes of
        rank 1 and up run none (entrypoints/engine.py L1234: "Non-zero-rank nodes do not run
        tokenizer processes")."""
        port = (spec.kvTransfer.bootstrapPort,)
        ranks = spec.prefill.nodesPerInstance
        by_rank = {"prefill": (port, *((),) * (ranks - 1))} if ranks > 1 else {}
        return SideChannel(
            SGLANG_SIDE_CHANNEL, port, SIDE_CHANNEL_SERVED_BY[SGLANG_SIDE_CHANNEL], by_rank
        )

    def router(self, spec: PDDeploymentSpec, discovery: RouterDiscovery) -> RouterLaunch:
        args = (
            "launch",
            *pd_router_args(spec.router, discovery, ("--pd-disaggregation",)),
            # Routing needs no tokenizer; autoload would fetch one from the Hugging Face Hub
            # for the model the workers report, from every router pod.
            "--disable-tokenizer-autoload",
        )
        return RouterLaunch(("smg",), args)

    def pod_annotations(self, spec: PDDeploymentSpec, role: str) -> dict[str, str]:
        # Only prefill pods run the bootstrap server; smg reads the port from the prefill.
        if role != "prefill":
            return {}
        return {BOOTSTRAP_PORT_ANNOTATION: str(spec.kvTransfer.bootstrapPort)}


def _bootstrap_port(spec: PDDeploymentSpec) -> EnginePort:
    """The bootstrap server's port; only prefill pods run the server."""
    return EnginePort(BOOTSTRAP_PORT_NAME, spec.kvTransfer.bootstrapPort)


def _layout_flags(layout: Layout, release: Version) -> tuple[str, ...]:
    # In full: `--tp` reaches --tp-size only by argparse's prefix matching, which the next
    # `--tp-...` flag of a release would break.
    flags = ["--tp-size", str(layout.tensor)]
    if layout.pipeline > 1:
        flags += ["--pp-size", str(layout.pipeline)]
    if layout.data > 1:  # data-parallel attention inside the TP group (DeepSeek-style)
        if release >= ATTN_DP_SIZE:
            flags += ["--attn-dp-size", str(layout.data)]
        else:
            flags += ["--dp-size", str(layout.data), "--enable-dp-attention"]
    if layout.expert > 1:
        flags += ["--ep-size", str(layout.expert)]
    return tuple(flags)


ADAPTER = SglangAdapter()


def _layout_rules(role: str) -> list[tuple[str, str]]:
    """The role's parallelism must cover the instance's GPUs as SGLang lays them out: one TP
    group over all of them, split by DP attention and expert parallelism."""
    r = f"self.{role}"
    p = f"{r}.parallelism"
    gpus = f"{r}.gpusPerInstance * {r}.nodesPerInstance"
    field = f"spec.{role}.parallelism"
    return [
        (
            f"self.engine.type != 'sglang' || !has({p}) || {p}.tensor * {p}.pipeline == {gpus}",
            f"{field}: for SGLang tensor x pipeline must equal the instance's GPUs "
            f"(spec.{role}.gpusPerInstance x spec.{role}.nodesPerInstance); data (DP "
            "attention) and expert split the tensor group",
        ),
        (
            f"self.engine.type != 'sglang' || !has({p}) || "
            f"({p}.tensor % {p}.data == 0 && {p}.tensor % {p}.expert == 0)",
            f"{field}: for SGLang data (DP attention) and expert must each divide tensor",
        ),
    ]


def _experts_rule(role: str) -> tuple[str, str]:
    """SGLang places an equal share of the routed experts on each expert-parallel rank
    (layers/moe/fused_moe_triton/layer.py, 0.5.23), where spec.model.kvCache gives them
    (planning/parallelism_fit.py checks a shape from the operator's table)."""
    kv, p = "self.model.kvCache", f"self.{role}.parallelism"
    return (
        f"self.engine.type != 'sglang' || !has({kv}) || !has({kv}.experts) || "
        f"{kv}.experts == 0 || !has({p}) || {p}.expert < 1 || {kv}.experts % {p}.expert == 0",
        f"spec.{role}.parallelism.expert must divide spec.model.kvCache.experts for SGLang: it "
        "places an equal share of the routed experts on each expert-parallel rank and fails "
        "at start otherwise",
    )
