"""What an engine adapter answers: how the engine is launched, what it listens on, how its
readiness shows, which router it pairs with and how it lays out its KV cache.

An adapter is pure: a function of the PDDeploymentSpec (and the role), rendering nothing of
its own beyond the engine's command line and environment. Rendering puts its answers into the
container, the Services, the NetworkPolicy and the sidecar's environment, so an engine's port
is declared once and opened everywhere it must be.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pdd_contract.env import KvOperation
from pdd_contract.ports import RankPorts
from pdd_operator.api.v1alpha1 import LoraAdapter, PDDeploymentSpec, RoleSpec, RouterSpec
from pdd_operator.engines import cel_rules
from pdd_operator.engines.version import (
    ResolvedVersion,
    SupportedVersions,
    Version,
    resolve_version,
)

EnvEntry = dict[str, Any]  # one container env entry, as the Pod API spells it


@dataclass(frozen=True)
class EngineLaunch:
    """The engine's own command line and environment for one role, before the user's
    ``args``, ``command`` and ``env`` from the spec are added."""

    command: tuple[str, ...]
    args: tuple[str, ...] = ()
    env: tuple[EnvEntry, ...] = ()


@dataclass(frozen=True)
class EnginePort:
    """A TCP port the engine listens on besides its HTTP port. Each one becomes a container
    port, a port of the role's headless Service, and a NetworkPolicy port open to the
    deployment's own pods only (they carry NIXL metadata, which holds memory keys), and to
    its router pods where the adapter's ``router_ports`` names it."""

    name: str
    port: int


@dataclass(frozen=True)
class SideChannel:
    """The engine's own NIXL metadata channel, which the sidecar checks peers can reach.

    ``name`` is what the sidecar reports the channel as (env PDD_SIDE_CHANNEL); ``served_by``
    are the roles whose pods listen on ``ports``, so a pod checks the peers of those roles
    other than its own. ``rank_ports`` names the roles whose pods do not all listen on
    ``ports``, with what each rank of an instance does (pdd_contract.ports.RankPorts).
    """

    name: str
    ports: tuple[int, ...]
    served_by: tuple[str, ...]
    rank_ports: Mapping[str, RankPorts] = field(default_factory=dict)


# The kubelet's probe timeout where a probe sets none: enough for an endpoint that answers
# from a flag, too little for one that does work before it answers.
KUBELET_PROBE_TIMEOUT_S = 1


@dataclass(frozen=True)
class HealthCheck:
    """The engine's HTTP health endpoint, for the readiness and startup probes."""

    path: str = "/health"
    period_s: int = 10
    # How long a healthy engine may take to answer (the probes' timeoutSeconds); an adapter
    # whose endpoint works before it answers sets its own.
    timeout_s: int = KUBELET_PROBE_TIMEOUT_S
    failure_threshold: int = 3
    # How many periods the startup probe waits. None: as long as the model's source needs
    # (rendering.model.startup_budget_seconds); an adapter sets it only for an engine whose
    # start does not depend on the model's size.
    startup_failure_threshold: int | None = None


@dataclass(frozen=True)
class RouterDiscovery:
    """Where the router finds the engine pods it pairs: Kubernetes service discovery in the
    deployment's namespace, by label selectors that include the engine revision, at the
    engine's HTTP port. Rendering builds it; the adapter spells it as its router's flags."""

    namespace: str
    prefill_selector: tuple[tuple[str, str], ...]
    decode_selector: tuple[tuple[str, str], ...]
    engine_port: int


@dataclass(frozen=True)
class RouterLaunch:
    """The upstream router an engine pairs with: its command line and the HTTP paths of its
    probes. ``spec.router.args`` follow ``args``; ``spec.router.command`` replaces all of it."""

    command: tuple[str, ...]
    args: tuple[str, ...] = ()
    readiness_path: str = "/readiness"
    liveness_path: str = "/liveness"


@dataclass(frozen=True)
class KvLayout:
    """How the engine lays out its paged KV cache for NIXL (planning.kv_layout's inputs)."""

    # Tokens per KV block when spec.engine.kvBlockSize is unset: the engine's own default.
    default_block_tokens: int
    # True: one descriptor holds a block's K and V together; False: K and V move as two.
    packed: bool


# The largest KV block the operator picks by itself (planning.kv_layout): a request's last
# block is on average half empty, and without vLLM 0.33's --prefix-match-unit (SGLang, vLLM
# 0.11) prefix-cache hits land on block boundaries, so a model whose TP share of the heads is
# small (TP 8) keeps smaller descriptors rather than ever larger blocks.
MAX_CHOSEN_BLOCK_TOKENS = 256
# Where a prefill pod's disk tier of the KV cache (spec.kvCache.offload.disk) is mounted.
DISK_TIER_MOUNT = "/var/cache/pdd-kv-offload"
# The share of the disk tier's volume the engines' own caps may fill: the rest is for what
# they do not count (the filesystem's blocks, a file a crash left half written), without which
# an emptyDir would pass its sizeLimit and get the pod evicted.
DISK_CAP_SHARE = 0.9
# The descriptor the block choice aims at unless the adapter says otherwise: where SGLang
# 0.5.23's WRITE, as the operator configures it, moved 225-248 GB/s between two pods that
# share a PID namespace (one H200, one request in flight, docs/benchmarks.md "Each engine's
# own pattern"), against 126-135 at 256 KiB. SGLang 0.5.4's WRITE (no NIXL threads) is not
# measured in its own pattern.
TRANSFER_DESCRIPTOR_BYTES = 512 << 10


@dataclass(frozen=True)
class KvPattern:
    """How the engine's connector moves one request's KV with NIXL, which the KV-path check
    repeats: the direction, NIXL's UCX thread pool (``num_threads``; 0: none) and each
    thread's share of a request (``split_batch_size``; 0: NIXL's default, which neither engine
    changes)."""

    operation: KvOperation
    nixl_threads: int = 0
    split_batch: int = 0


@dataclass(frozen=True)
class CpuTier:
    """spec.kvCache.offload.cpu on one prefill pod, divided by planning.kv_offload."""

    pod_bytes: int  # host memory the pod gives the tier
    ranks: int  # GPU ranks on the pod
    block_tokens: int  # tokens per KV block the engine runs with
    # KV bytes of one token over all the ranks of one engine; None: the model's shape unknown
    engine_bytes_per_token: int | None

    @property
    def rank_bytes(self) -> int:
        return self.pod_bytes // max(1, self.ranks)


@dataclass(frozen=True)
class DiskTier:
    """spec.kvCache.offload.disk on one prefill pod."""

    pod_bytes: int  # disk the pod gives the tier
    ranks: int  # GPU ranks on the pod (each keeps its own share of the files)
    storage_class: str | None  # a generic ephemeral volume of this class; None: an emptyDir
    with_cpu_tier: bool  # spec.kvCache.offload.cpu is rendered too
    latent: bool = False  # the model's KV is a latent (MLA), the same on every rank
    # Every KV block region of a rank is a whole number of 4 KiB pages (the model's shape is
    # known), so the engine may write it with O_DIRECT, past the page cache.
    page_aligned: bool = False

    @property
    def rank_bytes(self) -> int:
        return self.pod_bytes // max(1, self.ranks)


@dataclass(frozen=True)
class TierVerdict:
    """Whether the adapter renders the tier, and in words how (or why not and what to set)."""

    rendered: bool
    message: str
    # The engine keeps the tier in /dev/shm (the pod's memory emptyDir grows by its size).
    in_shared_memory: bool = False


@dataclass(frozen=True)
class Layout:
    """A role's parallelism with the engine's defaults filled in (spec.<role>.parallelism
    unset): what the adapter renders as the engine's parallelism flags."""

    tensor: int
    pipeline: int = 1
    data: int = 1
    expert: int = 1


@dataclass(frozen=True)
class Rendezvous:
    """Where the ranks of one instance over several nodes meet: the leader's (rank 0's)
    stable DNS name through the instance's headless Service, and the port it listens on."""

    nodes: int
    leader_host: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.leader_host}:{self.port}"


@dataclass(frozen=True)
class RankFlag:
    """A flag whose value is the pod's rank times ``per_rank``, computed in the pod at start
    (every rank shares one pod template; the rank is its StatefulSet ordinal)."""

    flag: str
    per_rank: int = 1
    workers_only: bool = False  # rendered on ranks > 0 only


@dataclass(frozen=True)
class MultiNodeLaunch:
    """The engine's multi-node flags, after its own launch and the user's arguments."""

    args: tuple[str, ...] = ()  # on every rank
    rank_flags: tuple[RankFlag, ...] = ()
    worker_args: tuple[str, ...] = ()  # on ranks > 0 only (e.g. vLLM's --headless)


class EngineAdapter(ABC):
    """One engine. A subclass sets ``type`` (its value of ``spec.engine.type``) and
    ``kv_layout``, implements ``launch``, and overrides the rest where the engine has them."""

    type: ClassVar[str]
    kv_layout: ClassVar[KvLayout]
    # Which way the engine's connector moves the KV with NIXL: "WRITE" (prefill pushes into
    # decode) or "READ" (decode pulls from prefill). The KV-path check moves it the same way.
    kv_operation: ClassVar[KvOperation] = "WRITE"
    # Where a model from a volume (pvc, hostPath, image) is mounted: the engine loads it from
    # this directory. HF_HOME is where a Hugging Face download is cached.
    model_dir: ClassVar[str] = "/models/model"
    hf_home: ClassVar[str] = "/models/hf-cache"
    # Where a LoRA adapter from a volume is mounted: <adapters_dir>/<its name>.
    adapters_dir: ClassVar[str] = "/models/adapters"
    # The flag that lists the LoRA adapters as name=path ("": the engine takes none from the
    # operator), after --enable-lora.
    lora_flag: ClassVar[str] = ""
    # Flags the adapter renders from spec fields, with the field to set instead: the CRD
    # refuses them in the user's args (cel_rules.reserved_flags_rule).
    reserved_flags: ClassVar[Mapping[str, str]] = {}
    # The policies of the engine's router that run with what the operator renders (the
    # router's own `--policy` names), checked on spec.router's policy fields.
    router_policies: ClassVar[tuple[str, ...]] = ()
    # Switches the adapter always renders that a user may give too: a flag without a value
    # means the same however often it is given, so the CRD does not refuse a copy in args.
    rendered_switches: ClassVar[tuple[str, ...]] = ()
    # The releases whose flags, ports and probes the adapter renders, each checked against
    # that release's parser (tests/fixtures/engines); None: the adapter renders the same for
    # every release (a custom engine's command is the user's).
    versions: ClassVar[SupportedVersions | None] = None
    display_name: ClassVar[str] = ""  # as users spell the engine: "vLLM", "SGLang"

    def spec_rules(self) -> list[tuple[str, str]]:
        """The CEL rules (rule, message) this engine's deployments must pass, each guarded by
        `self.engine.type` (the registry puts them in the CRD): the reserved flags, the LoRA
        flags while spec.model.adapters lists any, the router's policies, and the adapter's
        own (``own_spec_rules``)."""
        rules: list[tuple[str, str]] = []
        if self.reserved_flags:
            rules.append(cel_rules.reserved_flags_rule(self.type, self.reserved_flags))
        if self.lora_flag:
            rules.append(
                cel_rules.flags_refused_while(
                    self.type,
                    cel_rules.ADAPTERS_LISTED,
                    ("--enable-lora", self.lora_flag),
                    f"spec.model.adapters renders the {self.type} engine's LoRA flags",
                )
            )
        if self.router_policies:
            rules += cel_rules.router_policy_rules(self.type, self.router_policies)
        return rules + self.own_spec_rules()

    def own_spec_rules(self) -> list[tuple[str, str]]:
        """Rules of the engine's own (its layout, its flags for other fields)."""
        return []

    @abstractmethod
    def launch(self, spec: PDDeploymentSpec, role: str) -> EngineLaunch:
        """Command, arguments and environment that tell the engine its role and KV wiring."""

    def kv_pattern(self, spec: PDDeploymentSpec) -> KvPattern:
        """How this deployment's connector moves the KV (the default: ``kv_operation``, NIXL's
        own threading)."""
        del spec
        return KvPattern(self.kv_operation)

    def block_flags(self, spec: PDDeploymentSpec, tokens: int) -> tuple[str, ...]:
        """The flags that give the engine KV blocks of ``tokens`` tokens (planning.kv_layout
        chooses them; the default engine takes none)."""
        del spec, tokens
        return ()

    def max_block_tokens(self, spec: PDDeploymentSpec) -> int:
        """The largest block the operator may choose for this release (0: it chooses none,
        the engine keeps its own)."""
        del spec
        return 0

    def transfer_descriptor_bytes(self, spec: PDDeploymentSpec) -> int:
        """The descriptor size the operator's block choice aims at (planning.kv_layout)."""
        del spec
        return TRANSFER_DESCRIPTOR_BYTES

    def version(self, spec: PDDeploymentSpec) -> ResolvedVersion | None:
        """The release the deployment runs and the one whose wiring is rendered."""
        if self.versions is None:
            return None
        return resolve_version(spec.engine.version, spec.engine.image, self.versions)

    def wiring(self, spec: PDDeploymentSpec) -> Version:
        """The release whose wiring is rendered (the adapter's versions must be set)."""
        resolved = self.version(spec)
        assert resolved is not None, f"{self.type} renders one wiring for every release"
        return resolved.wiring

    def layout(self, spec: PDDeploymentSpec, role: str) -> Layout:
        """The role's parallelism; unset: tensor parallelism over all the instance's GPUs."""
        rspec = role_spec(spec, role)
        return declared_layout(rspec) or Layout(rspec.gpusPerInstance * rspec.nodesPerInstance)

    def multinode(self, spec: PDDeploymentSpec, role: str, meet: Rendezvous) -> MultiNodeLaunch:
        """Flags that join one instance's ranks (nodesPerInstance > 1). The default adds none:
        a custom engine reads PDD_NODE_RANK, PDD_NNODES and PDD_LEADER_ADDRESS."""
        del spec, role, meet
        return MultiNodeLaunch()

    def ports(self, spec: PDDeploymentSpec) -> tuple[EnginePort, ...]:
        """Ports besides HTTP that peers of the same deployment connect to."""
        del spec
        return ()

    def router_ports(self, spec: PDDeploymentSpec) -> tuple[EnginePort, ...]:
        """Of ``ports``, those the engine's router connects to besides HTTP: the NetworkPolicy
        opens them to the deployment's router pods too. The default: none."""
        del spec
        return ()

    def side_channel(self, spec: PDDeploymentSpec) -> SideChannel | None:
        """The engine's own metadata channel, or None where it has none."""
        del spec
        return None

    def health_check(self, spec: PDDeploymentSpec) -> HealthCheck:
        del spec
        return HealthCheck()

    def router(self, spec: PDDeploymentSpec, discovery: RouterDiscovery) -> RouterLaunch | None:
        """The router this engine pairs with, or None where it has none (the user's
        ``spec.router.command`` or the image's entrypoint then runs)."""
        del spec, discovery
        return None

    def pod_annotations(self, spec: PDDeploymentSpec, role: str) -> dict[str, str]:
        """Annotations on the role's pods that the router reads when it discovers them."""
        del spec, role
        return {}

    def lora_flags(self, spec: PDDeploymentSpec) -> tuple[str, ...]:
        """--enable-lora and the adapters as name=path (vLLM's --lora-modules, SGLang's
        --lora-paths spell them alike); none without adapters. A path is the adapter's mount,
        or its repo id for a Hub download (both engines download a name that is no directory
        into HF_HOME, with HF_TOKEN)."""
        if not spec.model.adapters or not self.lora_flag:
            return ()
        entries = [f"{a.name}={self.adapter_location(a)}" for a in spec.model.adapters]
        return ("--enable-lora", self.lora_flag, *entries)

    def adapter_request_fields(
        self, spec: PDDeploymentSpec, adapter: LoraAdapter
    ) -> dict[str, str]:
        """The request body fields that select ``adapter`` (vLLM: its name as the `model`)."""
        del spec
        return {"model": adapter.name}

    def adapter_location(self, adapter: LoraAdapter) -> str:
        hub = adapter.source.huggingFace
        return hub.repo if hub is not None else f"{self.adapters_dir}/{adapter.name}"

    def cpu_tier_verdict(self, spec: PDDeploymentSpec, tier: CpuTier) -> TierVerdict:
        """Whether and how the prefill engine gets ``tier`` (the CRD's rules keep the field
        to the engines whose adapters render it)."""
        del spec, tier
        return TierVerdict(False, f"{self.display_name or self.type} renders no CPU tier")

    def cpu_tier_launch(
        self, launch: EngineLaunch, spec: PDDeploymentSpec, tier: CpuTier
    ) -> EngineLaunch:
        """The prefill launch with ``tier`` (called where the verdict renders it)."""
        del spec, tier
        return launch

    def kv_events_verdict(self, spec: PDDeploymentSpec) -> TierVerdict | None:
        """Where the router routes prefill by the engines' KV events: whether the prefill
        engines publish them (None: the spec routes otherwise)."""
        del spec
        return None

    def disk_tier_verdict(self, spec: PDDeploymentSpec, tier: DiskTier) -> TierVerdict:
        """Whether and how the prefill engine gets a disk tier (at DISK_TIER_MOUNT)."""
        del spec, tier
        return TierVerdict(False, f"{self.display_name or self.type} renders no disk tier")

    def disk_tier_launch(
        self, launch: EngineLaunch, spec: PDDeploymentSpec, tier: DiskTier
    ) -> EngineLaunch:
        """The prefill launch with the disk ``tier`` (called where the verdict renders it)."""
        del spec, tier
        return launch


def model_location(spec: PDDeploymentSpec, model_dir: str) -> str:
    """What the engine loads: the repo id for a Hugging Face download, else the directory
    the model's volume is mounted at."""
    if spec.model.source_or_default.huggingFace is not None:
        return spec.model.name
    return model_dir


def model_flags(spec: PDDeploymentSpec) -> tuple[str, ...]:
    """``--revision`` and ``--served-model-name``, spelled alike by vLLM and SGLang. Loaded
    from a directory, the engine would serve the model under the directory's path: clients
    keep the name they know (`servedName`, else `name`)."""
    source = spec.model.source_or_default
    flags: list[str] = []
    if source.huggingFace is not None and source.huggingFace.revision:
        flags += ["--revision", source.huggingFace.revision]
    served = spec.model.servedName or (spec.model.name if source.huggingFace is None else None)
    if served:
        flags += ["--served-model-name", served]
    return tuple(flags)


def role_spec(spec: PDDeploymentSpec, role: str) -> RoleSpec:
    return spec.prefill if role == "prefill" else spec.decode


def declared_layout(rspec: RoleSpec) -> Layout | None:
    p = rspec.parallelism
    return None if p is None else Layout(p.tensor, p.pipeline, p.data, p.expert)


def env_value(name: str, value: str) -> EnvEntry:
    return {"name": name, "value": value}


def env_pod_ip(name: str) -> EnvEntry:
    """``name`` set to the pod's IP by the downward API."""
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


def pd_router_args(
    router: RouterSpec, discovery: RouterDiscovery, mode: tuple[str, ...]
) -> tuple[str, ...]:
    """The flags vllm-router 0.1.17 and smg 1.13.0 spell alike, around the router's own PD
    ``mode`` flags. Both binds are given: vllm-router's default to 127.0.0.1, unreachable from
    the Service and from Prometheus."""
    return (
        "--host",
        "0.0.0.0",
        "--port",
        str(router.port),
        *mode,
        *policy_args(router),
        *service_discovery_args(discovery),
        "--prometheus-host",
        "0.0.0.0",
        "--prometheus-port",
        str(router.metricsPort),
        "--request-timeout-secs",
        str(router.requestTimeoutSeconds),
    )


def policy_args(router: RouterSpec) -> tuple[str, ...]:
    """spec.router's routing policies, spelled alike by vllm-router 0.1.17 and smg 1.13.0
    (none set: the router's default, cache_aware, for both roles)."""
    chosen = (
        ("--policy", router.policy),
        ("--prefill-policy", router.prefillPolicy),
        ("--decode-policy", router.decodePolicy),
    )
    return tuple(arg for flag, value in chosen if value for arg in (flag, value))


def service_discovery_args(discovery: RouterDiscovery) -> tuple[str, ...]:
    """Kubernetes service-discovery flags, spelled alike by vllm-router 0.1.17 and smg 1.13.0.

    The namespace is always given: without it both routers watch pods cluster-wide (and need
    a ClusterRole for it), even in-cluster (tests/fixtures/routers/README.md).
    """
    return (
        "--service-discovery",
        "--service-discovery-namespace",
        discovery.namespace,
        "--service-discovery-port",
        str(discovery.engine_port),
        "--prefill-selector",
        *(f"{key}={value}" for key, value in discovery.prefill_selector),
        "--decode-selector",
        *(f"{key}={value}" for key, value in discovery.decode_selector),
    )
