"""PDDeployment `pdd.dev/v1alpha1`: the one source of truth for the CRD.

Every field lives here once. `pdd_operator.api.crd` turns these models into the CRD's OpenAPI
schema (defaults, CEL rules, printer columns); the operator parses objects with the same models.
CEL rules are attached with `cel(...)` and each message names the field and the fix, because
the API server prints it verbatim to the user who ran `kubectl apply`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pdd_contract import env as contract_env
from pdd_contract.env import GpuDirectRequest, NicSelectionMode
from pdd_contract.ports import SGLANG_BOOTSTRAP_PORT, SIDECAR_PORT, VLLM_SIDE_CHANNEL_BASE_PORT
from pdd_operator.api import condition_types
from pdd_operator.api.schema import cel, free_form, quantity, quantity_at_least

GROUP = "pdd.dev"
VERSION = "v1alpha1"
KIND = "PDDeployment"
PLURAL = "pddeployments"
SINGULAR = "pddeployment"
SHORT_NAMES = ["pdd"]
# `kubectl get pdd-all` lists both kinds. Not "pdd": kubectl expands a category before it tries
# a short name, so a category "pdd" made `kubectl get pdd NAME` ask for two kinds and fail.
CATEGORY = "pdd-all"
API_VERSION = f"{GROUP}/{VERSION}"

# UCX transport names accepted in spec.kvTransfer.ucx.transports (UCX_TLS tokens); the RDMA
# ones are those that can carry GPUDirect RDMA ("all" lets UCX pick them).
RDMA_TRANSPORTS = (
    "rc_x", "rc", "rc_v", "rc_mlx5", "dc_x", "dc", "dc_mlx5",
    "ud_x", "ud", "ud_v", "ud_mlx5", "ib", "all",
)  # fmt: skip
UCX_TRANSPORTS = (
    *RDMA_TRANSPORTS,
    "cuda_copy", "cuda_ipc", "gdr_copy", "tcp", "sm", "shm", "self", "posix", "sysv",
    "cma", "knem", "xpmem", "rocm_copy", "rocm_ipc", "rocm_gdr", "cuda", "rocm", "mm",
)  # fmt: skip

# Transports that move GPU memory (UCX_TLS needs one for a KV cache on the GPU), and those
# that only copy memory and carry no messages (UCX needs a message transport for wire-up).
GPU_MEMORY_TRANSPORTS = (
    "all", "cuda", "cuda_copy", "cuda_ipc", "gdr_copy", "rocm", "rocm_copy", "rocm_ipc", "rocm_gdr",
)  # fmt: skip
COPY_ONLY_TRANSPORTS = (
    "cuda", "cuda_copy", "cuda_ipc", "gdr_copy", "rocm", "rocm_copy", "rocm_ipc", "rocm_gdr",
    "cma", "knem", "xpmem",
)  # fmt: skip

IMAGE_PATTERN = (
    r"^([a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?/)?[a-z0-9]+([._-][a-z0-9]+)*"
    r"(/[a-z0-9]+([._-][a-z0-9]+)*)*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$"
)
LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
NIC_PORT_PATTERN = r"^[A-Za-z0-9_.-]+:[0-9]+$"
# An object name (Secret, PersistentVolumeClaim): a DNS subdomain, as the API server checks it.
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
SECRET_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
# A path segment '..' anywhere (character classes: no backslashes to escape through CEL).
PARENT_SEGMENT = "(^|/)[.][.](/|$)"
# A Multus network selection element: [namespace/]name[@interface] (DNS names, Linux ifname).
NETWORK_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?/)?[a-z0-9]([-a-z0-9.]*[a-z0-9])?(@[A-Za-z0-9_.-]{1,15})?$"
)
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]*$"


# The router image the Dockerfile's `router` target builds (vllm-router and smg, pinned in
# pyproject.toml); the tag follows the operator's, like the operator and sidecar images.
DEFAULT_ROUTER_IMAGE = "ghcr.io/pdd-dev/pdd-router:0.1.0"


def cel_list(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{t}'" for t in items) + "]"


# --- Settings the operator injects: refused where a user could override them ----------------

# Environment the operator sets on the pods it renders, each with the spec field that sets it
# instead. A user's env entry of the same name came later in the list and silently won, with
# the deployment still saying Ready; so every env list refuses them, and PDD_* besides.
RESERVED_ENV: dict[str, str] = {
    contract_env.UCX_TLS: "spec.kvTransfer.ucx.transports",
    contract_env.UCX_NET_DEVICES: "spec.kvTransfer.nicSelection",
    contract_env.UCX_IB_GPU_DIRECT_RDMA: "spec.kvTransfer.gpuDirect",
    contract_env.NIXL_UCX_SGL_ENABLE: "spec.kvTransfer.ucx.scatterGather",
    contract_env.NIXL_ETCD_ENDPOINTS: "spec.kvTransfer.metadataExchange",
    contract_env.NIXL_ETCD_NAMESPACE: "spec.kvTransfer.metadataExchange",
    contract_env.VLLM_NIXL_SIDE_CHANNEL_PORT: "spec.kvTransfer.sideChannelPort",
    contract_env.VLLM_NIXL_SIDE_CHANNEL_HOST: "always the pod IP",
    contract_env.POD_IP: "the downward API",
    contract_env.POD_NAME: "the downward API",
    contract_env.POD_UID: "the downward API",
    contract_env.HF_HOME: "spec.model.source",
    contract_env.HF_TOKEN: "spec.model.source.huggingFace.tokenSecretRef",
    contract_env.HF_HUB_OFFLINE: "spec.model.source",
}
RESERVED_ENV_PREFIX = "PDD_"


def env_name_reserved(name: str) -> bool:
    return name.startswith(RESERVED_ENV_PREFIX) or name in RESERVED_ENV


def _reserved_env_rule() -> tuple[str, str]:
    """On an env entry's name: the API server's answer then shows the path and the name."""
    instead = ", ".join(f"{name} ({where})" for name, where in RESERVED_ENV.items())
    return (
        f"!self.startsWith('{RESERVED_ENV_PREFIX}') && !(self in {cel_list(tuple(RESERVED_ENV))})",
        f"the operator sets this variable and it cannot be overridden in env; remove it "
        f"(set the field named here instead, where there is one): {RESERVED_ENV_PREFIX}* "
        f"(the operator's own), {instead}",
    )


ALL_ARGS = "(self.engine.args + self.prefill.args + self.decode.args)"


# Pod template keys the operator sets and selects on: a podTemplate that sets one is refused by
# the operator (Stalled=InvalidSpec; podTemplate is free-form, beyond what CEL can walk).
RESERVED_LABEL_PREFIX = "pdd.dev/"
RESERVED_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/managed-by",
)
MULTUS_NETWORKS = "k8s.v1.cni.cncf.io/networks"
RESERVED_ANNOTATIONS = {MULTUS_NETWORKS: "spec.kvTransfer.rdma.networks"}
# Containers the operator injects into prefill/decode pods. The sidecar holds the deployment's
# token and the preflight writes the engine's UCX settings, so a podTemplate entry of the same
# name may size them (resources) and nothing else: a command, env, mount, image, security
# context, probe or lifecycle hook would run the user's code in them.
PREFLIGHT_CONTAINER = "preflight"
SIDECAR_CONTAINER = "nixl-sidecar"
INJECTED_CONTAINERS = (PREFLIGHT_CONTAINER, SIDECAR_CONTAINER)
INJECTED_CONTAINER_SETTABLE = ("name", "resources")
# Volumes the injected containers mount (rendering/roles.py and rendering/sidecar.py name
# them; a unit test keeps this list equal to a render's). A podTemplate volume of the same name
# would swap what they read: the token the sidecar checks peers with, the env file the engine
# sources, the scratch space.
# Of those, what only the sidecar may mount: its ServiceAccount token (the engine runs model
# code and gets no API credential).
SIDECAR_ONLY_VOLUMES = ("pdd-kube-api-access",)
INJECTED_VOLUMES = (
    "dshm",
    "pdd-env",
    "pdd-kube-api-access",
    "preflight-tmp",
    "sidecar-token",
    "sidecar-tmp",
)


def pod_template_problems(template: dict[str, Any] | None) -> list[str]:
    """What a podTemplate fragment sets that the operator injects: labels and annotations it
    selects or configures the pod by, and reserved env in any container."""
    if not template:
        return []
    problems = []
    meta = template.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    for key in _keys(meta.get("labels")):
        if key.startswith(RESERVED_LABEL_PREFIX) or key in RESERVED_LABELS:
            problems.append(
                f"metadata.labels[{key}] is set by the operator (it selects and pairs the "
                "pods by it); use another label key"
            )
    for key in _keys(meta.get("annotations")):
        if key.startswith(RESERVED_LABEL_PREFIX) or key in RESERVED_ANNOTATIONS:
            where = RESERVED_ANNOTATIONS.get(key, "the operator's own")
            problems.append(f"metadata.annotations[{key}] is set by the operator ({where})")
    pod = template.get("spec")
    pod = pod if isinstance(pod, dict) else {}
    for volume in _dicts(pod.get("volumes")):
        if volume.get("name") in INJECTED_VOLUMES:
            problems.append(
                f"spec.volumes[{volume['name']}] is a volume the operator injects for its own "
                "containers; give your volume another name"
            )
    for list_name in ("initContainers", "containers"):
        for container in _dicts(pod.get(list_name)):
            if container.get("name") in INJECTED_CONTAINERS:
                # Its env is refused as a whole, reserved names or not.
                problems += _injected_container_problems(list_name, container)
                continue
            for mount in _dicts(container.get("volumeMounts")):
                if mount.get("name") in SIDECAR_ONLY_VOLUMES:
                    problems.append(
                        f"spec.{list_name}[{container.get('name', '?')}].volumeMounts"
                        f"[{mount['name']}] mounts the sidecar's ServiceAccount token, which "
                        "only the sidecar holds; remove the mount"
                    )
            for env in _dicts(container.get("env")):
                name = str(env.get("name", ""))
                if env_name_reserved(name):
                    where = RESERVED_ENV.get(name, "the operator's own")
                    problems.append(
                        f"spec.{list_name}[{container.get('name', '?')}].env[{name}] is set by "
                        f"the operator ({where}) and cannot be overridden"
                    )
    return problems


def _injected_container_problems(list_name: str, container: dict[str, Any]) -> list[str]:
    name = container.get("name")
    fields = sorted(k for k in _keys(container) if k not in INJECTED_CONTAINER_SETTABLE)
    if not fields:
        return []
    return [
        f"spec.{list_name}[{name}] sets {', '.join(fields)}: the operator injects the {name} "
        "container and owns all of it but its resources; remove those fields (a container of "
        "your own needs another name)"
    ]


def _keys(value: Any) -> list[str]:
    return [str(k) for k in value] if isinstance(value, dict) else []


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _check_pod_template(template: dict[str, Any] | None) -> dict[str, Any] | None:
    problems = pod_template_problems(template)
    if problems:
        raise ValueError("; ".join(problems) + "; remove it from the podTemplate")
    return template


class Model(BaseModel):
    """Base for all API models: camelCase on the wire, unknown fields refused."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


def _image(field: str) -> Any:
    return Field(
        max_length=512,
        json_schema_extra=cel(
            f"self.matches('{IMAGE_PATTERN}')",
            f"{field} must be an image reference such as 'vllm/vllm-openai:v0.11.0' or "
            "'registry.example.com/team/engine@sha256:<64 hex>': lowercase repository, "
            "optional :tag and @sha256 digest",
        ),
    )


class EnvVar(Model):
    """One environment variable, as in a Pod (value or valueFrom)."""

    name: str = Field(
        max_length=256, pattern=ENV_NAME_PATTERN, json_schema_extra=cel([_reserved_env_rule()])
    )
    value: str | None = Field(default=None, max_length=32768)
    valueFrom: Annotated[dict[str, Any] | None, free_form()] = None


EnvList = Annotated[
    list[EnvVar],
    Field(
        max_length=128,
        json_schema_extra=cel(
            "self.all(e, !has(e.valueFrom) || !has(e.value))",
            "env: set either value or valueFrom for each variable, not both",
        ),
    ),
]
Args = Annotated[list[Annotated[str, Field(max_length=4096)]], Field(max_length=256)]


class KvCacheSpec(Model):
    """The model's shape (its config.json): the KV cache's, for the transfer check at the
    engine's own descriptor size, and the head and expert counts the engine splits over its
    parallel ranks, which the layout must divide (refused at admission otherwise)."""

    layers: int = Field(
        json_schema_extra=cel(
            "self >= 1 && self <= 1024", "spec.model.kvCache.layers must be between 1 and 1024"
        ),
        description="Decoder layers (num_hidden_layers).",
    )
    kvHeads: int = Field(
        json_schema_extra=cel(
            "self >= 1 && self <= 1024", "spec.model.kvCache.kvHeads must be between 1 and 1024"
        ),
        description="KV heads per layer (num_key_value_heads); 1 with `latent`.",
    )
    headDim: int = Field(
        json_schema_extra=cel(
            "self >= 1 && self <= 4096", "spec.model.kvCache.headDim must be between 1 and 4096"
        ),
        description="Values per head (head_dim); with `latent`, the latent vector's size "
        "(kv_lora_rank + qk_rope_head_dim, 576 for DeepSeek-V3).",
    )
    dtype: Literal["bfloat16", "float16", "float8"] = Field(
        default="bfloat16", description="KV-cache data type."
    )
    latent: bool = Field(
        default=False,
        description="Multi-head latent attention: one vector per token and layer, not split "
        "by tensor parallelism.",
    )
    attentionHeads: int | None = Field(
        default=None,
        json_schema_extra=cel(
            "self >= 1 && self <= 4096",
            "spec.model.kvCache.attentionHeads must be between 1 and 4096",
        ),
        description="Attention (query) heads per layer (num_attention_heads): each role's "
        "tensor-parallel size (SGLang with DP attention: tensor / data) must divide them. "
        "Unset: not checked.",
    )
    experts: int | None = Field(
        default=None,
        json_schema_extra=cel(
            "self >= 0 && self <= 65536", "spec.model.kvCache.experts must be between 0 and 65536"
        ),
        description="Routed experts of a mixture-of-experts model (num_local_experts, "
        "num_experts or n_routed_experts; 0: dense): SGLang's expert-parallel size must "
        "divide them. Unset: not checked.",
    )


def _object_name(field: str, what: str, description: str = "") -> Any:
    return Field(
        max_length=253,
        description=description or None,
        json_schema_extra=cel(
            f"self.matches('{DNS_SUBDOMAIN_PATTERN}')",
            f"{field} must be the name of a {what}: lowercase letters, digits, '-' and '.', "
            "starting and ending with a letter or digit",
        ),
    )


class SecretKeyRef(Model):
    """A key of a Secret in the PDDeployment's namespace. The operator checks only that the
    Secret exists (its metadata); the value goes from the Secret straight into the engine's
    environment (secretKeyRef) and never through the operator."""

    name: str = _object_name("spec.model.source.huggingFace.tokenSecretRef.name", "Secret")
    key: str = Field(
        default="HF_TOKEN",
        max_length=253,
        json_schema_extra=cel(
            f"self.matches('{SECRET_KEY_PATTERN}')",
            "spec.model.source.huggingFace.tokenSecretRef.key must be a Secret key: letters, "
            "digits, '-', '_' and '.'",
        ),
        description="The key holding the token.",
    )


class HuggingFaceCache(Model):
    """One Hugging Face cache for all pods of the deployment, instead of one per pod."""

    claimName: str = _object_name(
        "spec.model.source.huggingFace.cache.claimName",
        "PersistentVolumeClaim",
        "A PersistentVolumeClaim mounted read-write as HF_HOME in every engine pod: "
        "the first pod downloads, the others find the files (the Hub client locks per file). "
        "ReadWriteMany when the deployment has more than one engine pod.",
    )


class HuggingFaceSource(Model):
    """The engine downloads the model from the Hugging Face Hub at start."""

    tokenSecretRef: SecretKeyRef | None = Field(
        default=None,
        description="The Secret key with a Hugging Face token (gated or private models), "
        "given to the engine as HF_TOKEN.",
    )
    revision: str | None = Field(
        default=None,
        max_length=255,
        json_schema_extra=cel(
            "self.matches('^[A-Za-z0-9][A-Za-z0-9._/-]*$')",
            "spec.model.source.huggingFace.revision must be a branch, tag or commit of the "
            "model repository, such as 'main' or a 40-character commit hash",
        ),
        description="Branch, tag or commit to download (the engine's `--revision`); pin a "
        "commit so that every pod serves the same weights.",
    )
    cache: HuggingFaceCache | None = Field(
        default=None,
        description="A shared cache (a PersistentVolumeClaim as HF_HOME). Unset: each pod "
        "downloads into its own emptyDir, again after every pod replacement.",
    )


def _sub_path(field: str) -> Any:
    return Field(
        default=None,
        max_length=1024,
        json_schema_extra=cel(
            [
                (
                    f"!self.startsWith('/') && !self.matches('{PARENT_SEGMENT}')",
                    f"{field} must be a relative path without '..' segments, such as "
                    "'models/llama-3.3-70b'",
                )
            ]
        ),
        description="The model's directory inside the volume; unset: its root.",
    )


class PvcSource(Model):
    """A PersistentVolumeClaim that already holds the model, mounted read-only."""

    claimName: str = _object_name(
        "spec.model.source.pvc.claimName",
        "PersistentVolumeClaim",
        "The claim, in the PDDeployment's namespace. ReadOnlyMany (or "
        "ReadWriteMany) when the deployment has more than one engine pod.",
    )
    subPath: str | None = _sub_path("spec.model.source.pvc.subPath")


class HostPathSource(Model):
    """A directory on every GPU node that holds the model (a node-local cache filled by
    something else), mounted read-only."""

    path: str = Field(
        max_length=1024,
        json_schema_extra=cel(
            f"self.startsWith('/') && self != '/' && !self.matches('{PARENT_SEGMENT}')",
            "spec.model.source.hostPath.path must be an absolute directory other than '/', "
            "without '..' segments, such as '/mnt/models/llama-3.3-70b'",
        ),
        description="The model's directory on the node (hostPath type Directory: a node "
        "without it does not start the pod).",
    )


class ImageSource(Model):
    """An OCI image (artifact) holding the model, mounted read-only as an image volume
    (Kubernetes 1.33+ with the ImageVolume feature gate, on by default from 1.35)."""

    reference: str = Field(
        max_length=512,
        json_schema_extra=cel(
            f"self.matches('{IMAGE_PATTERN}')",
            "spec.model.source.image.reference must be an image reference such as "
            "'registry.example.com/models/llama-3.3-70b:v1': lowercase repository, optional "
            ":tag and @sha256 digest",
        ),
        description="The image; a digest keeps every node on the same weights.",
    )
    pullPolicy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        default=None, description="The volume's pull policy; unset: the kubelet's default."
    )
    subPath: str | None = _sub_path("spec.model.source.image.subPath")


MODEL_SOURCES = ("huggingFace", "pvc", "hostPath", "image")


class ModelSource(Model):
    """Where the weights come from: exactly one of the fields."""

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        frozen=True,
        json_schema_extra=cel(
            "[" + ", ".join(f"has(self.{s})" for s in MODEL_SOURCES) + "].filter(x, x).size() == 1",
            "spec.model.source: set exactly one of huggingFace, pvc, hostPath or image",
        ),
    )

    huggingFace: HuggingFaceSource | None = Field(
        default=None, description="Download from the Hugging Face Hub (`name` is the repo id)."
    )
    pvc: PvcSource | None = Field(default=None, description="A claim that holds the model.")
    hostPath: HostPathSource | None = Field(
        default=None, description="A node-local directory that holds the model."
    )
    image: ImageSource | None = Field(
        default=None, description="An OCI image that holds the model (image volume)."
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> ModelSource:
        if sum(getattr(self, s) is not None for s in MODEL_SOURCES) != 1:
            raise ValueError(
                "spec.model.source: set exactly one of huggingFace, pvc, hostPath or image"
            )
        return self

    @property
    def kind(self) -> str:
        """Which source is set: one of MODEL_SOURCES."""
        return next(s for s in MODEL_SOURCES if getattr(self, s) is not None)


DEFAULT_MODEL_SOURCE = ModelSource(huggingFace=HuggingFaceSource())


class AdapterHub(Model):
    """Downloaded from the Hugging Face Hub by the engine at start, with the model's token and
    into the model's cache (the model must come from the Hub too)."""

    repo: str = Field(
        max_length=256,
        json_schema_extra=cel(
            "self.matches('^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$')",
            "spec.model.adapters[].source.huggingFace.repo must be a Hugging Face repo id "
            "such as 'org/llama-3.1-8b-sql-lora'",
        ),
        description="The adapter's repo id.",
    )


class AdapterPvc(Model):
    """A claim that holds the adapter, mounted read-only."""

    claimName: str = _object_name(
        "spec.model.adapters[].source.pvc.claimName",
        "PersistentVolumeClaim",
        "The claim, in the PDDeployment's namespace. ReadOnlyMany (or ReadWriteMany) when "
        "the deployment has more than one engine pod.",
    )
    subPath: str | None = _sub_path("spec.model.adapters[].source.pvc.subPath")


class AdapterImage(Model):
    """An OCI image (artifact) holding the adapter, mounted read-only as an image volume."""

    reference: str = Field(
        max_length=512,
        json_schema_extra=cel(
            f"self.matches('{IMAGE_PATTERN}')",
            "spec.model.adapters[].source.image.reference must be an image reference such as "
            "'registry.example.com/adapters/sql:v1'",
        ),
        description="The image; a digest keeps every node on the same weights.",
    )
    pullPolicy: Literal["Always", "IfNotPresent", "Never"] | None = None
    subPath: str | None = _sub_path("spec.model.adapters[].source.image.subPath")


ADAPTER_SOURCES = ("huggingFace", "pvc", "image")


class AdapterSource(Model):
    """Where an adapter's weights come from: exactly one of the fields."""

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        frozen=True,
        json_schema_extra=cel(
            "[" + ", ".join(f"has(self.{s})" for s in ADAPTER_SOURCES) + "].filter(x, x).size() "
            "== 1",
            "spec.model.adapters[].source: set exactly one of huggingFace, pvc or image",
        ),
    )

    huggingFace: AdapterHub | None = None
    pvc: AdapterPvc | None = None
    image: AdapterImage | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> AdapterSource:
        if sum(getattr(self, s) is not None for s in ADAPTER_SOURCES) != 1:
            raise ValueError(
                "spec.model.adapters[].source: set exactly one of huggingFace, pvc or image"
            )
        return self


class LoraAdapter(Model):
    """A LoRA adapter every prefill and decode engine loads at start, served by its name."""

    name: str = Field(
        max_length=63,
        json_schema_extra=cel(
            "self.matches('^[A-Za-z0-9][A-Za-z0-9._-]*$')",
            "spec.model.adapters[].name must be letters, digits, '.', '_' and '-', starting "
            "with a letter or digit: it is what clients put in a request's `model`",
        ),
        description="What clients ask for in a request's `model` field.",
    )
    source: AdapterSource = Field(description="Where the adapter's weights come from.")


class ModelSpec(Model):
    """The model every prefill and decode instance serves."""

    name: str = Field(
        min_length=1,
        max_length=512,
        description="The model's name: the Hugging Face repo id the engine downloads, and "
        "the name clients use unless `servedName` is set (also with a local source).",
        json_schema_extra=cel(
            "!self.startsWith('-') && !self.matches('[[:space:][:cntrl:]]')",
            "spec.model.name must be a model id or path such as "
            "'meta-llama/Llama-3.1-8B-Instruct' or '/models/llama': not starting with '-' "
            "(the engine would read it as a flag) and without spaces or control characters",
        ),
    )
    servedName: str | None = Field(
        default=None,
        max_length=256,
        description="Name clients use; defaults to `name`.",
        json_schema_extra=cel(
            "!self.startsWith('-') && !self.matches('[[:space:][:cntrl:]]')",
            "spec.model.servedName must not start with '-' (the engine would read it as a "
            "flag) nor hold spaces or control characters",
        ),
    )
    source: ModelSource | None = Field(
        default=None,
        description="Where the weights come from (docs/model-storage.md). Unset: each pod "
        "downloads `name` from the Hugging Face Hub without a token into its own emptyDir, "
        "as `huggingFace: {}`.",
    )
    kvCache: KvCacheSpec | None = Field(
        default=None,
        description="The model's shape; known model families (Llama 3, Qwen 2.5/3, Mistral, "
        "Mixtral, DeepSeek-V3/R1) are recognised by name. Lets the transfer check measure at "
        "the engine's own descriptor size, and the parallelism be checked against the heads "
        "and experts it splits (ParallelismSupported; docs/multinode.md).",
    )

    adapters: Annotated[list[LoraAdapter], Field(max_length=16)] = Field(
        default_factory=list,
        json_schema_extra=cel(
            "self.all(a, self.exists_one(b, b.name == a.name))",
            "spec.model.adapters: each adapter needs a name of its own",
        ),
        description='LoRA adapters of the model (docs/engines.md, "LoRA adapters"): both '
        "roles' engines load each one at start (the prefill computes the prompt's KV with it, "
        "the decode continues with it), and a request whose `model` is an adapter's name is "
        "served with it. vLLM: --enable-lora --lora-modules; SGLang: --enable-lora "
        "--lora-paths.",
    )

    @property
    def source_or_default(self) -> ModelSource:
        return self.source or DEFAULT_MODEL_SOURCE

    @property
    def served_name(self) -> str:
        """What clients ask for to get the base model."""
        return self.servedName or self.name


class EngineSpec(Model):
    """The inference engine that runs in every prefill and decode pod."""

    type: Literal["vllm", "sglang", "custom"] = Field(
        default="vllm",
        description="Engine adapter: decides the KV-connector wiring (`custom`: env only). "
        "Immutable: prefill and decode of different engines cannot exchange KV blocks.",
        json_schema_extra=cel(
            "self == oldSelf",
            "spec.engine.type is immutable: the running pods' KV caches cannot move between "
            "engines; create a new PDDeployment for the other engine and delete this one",
        ),
    )
    image: str = _image("spec.engine.image")
    imagePullPolicy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    version: str | None = Field(
        default=None,
        max_length=64,
        json_schema_extra=cel(
            "self.matches('^v?[0-9]+[.][0-9]+([.][0-9]+)?([.+-][0-9A-Za-z.+-]*|rc[0-9]+)?$')",
            "spec.engine.version must be a release such as '0.33.0' or 'v0.5.23'",
        ),
        description="The engine release the image runs, e.g. `0.33.0`: the adapter renders "
        "that release's flags, ports and probes (docs/engines.md). Unset: read from the "
        "image's tag; required for an image pinned by digest alone. A release outside the "
        "supported range, or none found, gets the newest supported wiring and "
        "EngineVersionSupported=False.",
    )
    command: Args | None = Field(
        default=None,
        description="Overrides the adapter's command (required for `custom` to get the "
        "preflight env file sourced).",
    )
    args: Args = Field(default_factory=list, description="Extra engine arguments, both roles.")
    env: EnvList = Field(
        default_factory=list,
        description="Extra environment, both roles. Variables the operator sets (PDD_*, UCX_TLS, "
        "UCX_NET_DEVICES, VLLM_NIXL_SIDE_CHANNEL_*, ...: docs/security.md) are refused.",
    )
    port: int = Field(
        default=8000,
        json_schema_extra=cel(
            "self >= 1 && self <= 65535", "spec.engine.port must be between 1 and 65535"
        ),
        description="Port the engine serves HTTP on.",
    )
    kvBlockSize: int | None = Field(
        default=None,
        json_schema_extra=cel(
            "self >= 1 && self <= 1024", "spec.engine.kvBlockSize must be between 1 and 1024"
        ),
        description="Tokens per KV-cache block (vLLM `--block-size`, SGLang `--page-size`). One "
        "NIXL descriptor moves one block of one layer, so larger blocks move KV faster "
        "(docs/benchmarks.md). Unset: where the model's shape is known the operator picks the "
        "block whose descriptors reach vLLM 1 MiB, SGLang 512 KiB, at most 256 tokens "
        '(docs/engines.md, "KV blocks"), else the engine\'s default (16, SGLang 1).',
    )
    startupTimeoutSeconds: int | None = Field(
        default=None,
        json_schema_extra=cel(
            "self >= 60 && self <= 86400",
            "spec.engine.startupTimeoutSeconds must be between 60 and 86400",
        ),
        description="How long the engine may take to become healthy (download, load, "
        "compile) before its startup probe restarts it. Unset: from spec.model.source, "
        "60 min for a Hugging Face download, 30 min from a PVC, 20 min from a hostPath or "
        "image volume (docs/model-storage.md).",
    )


class Toleration(Model):
    key: str | None = Field(default=None, max_length=316)
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = Field(default=None, max_length=63)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    tolerationSeconds: int | None = None


class ResourceRequirements(Model):
    """Extra resources besides the GPUs (which come from gpusPerInstance)."""

    requests: Annotated[
        dict[str, Annotated[str, quantity("resources.requests values")]], Field(max_length=32)
    ] = Field(default_factory=dict)
    limits: Annotated[
        dict[str, Annotated[str, quantity("resources.limits values")]], Field(max_length=32)
    ] = Field(default_factory=dict)


MAX_NODES_PER_INSTANCE = 16


def _degree(field: str, description: str) -> Any:
    return Field(
        default=1,
        json_schema_extra=cel(
            "self >= 1 && self <= 1024",
            f"spec.<role>.parallelism.{field} must be between 1 and 1024",
        ),
        description=description,
    )


class Parallelism(Model):
    """How one instance's GPUs (gpusPerInstance x nodesPerInstance) are laid out, in the
    engine's own terms (docs/multinode.md has the rules per engine).

    vLLM: `tensor` x `pipeline` GPUs make one data-parallel rank and sit on one node;
    `data` ranks fill the instance (tensor x pipeline x data = all its GPUs); `expert` > 1
    turns on expert parallelism, whose size vLLM takes as tensor x data.
    SGLang: `tensor` x `pipeline` = all the instance's GPUs (TP spans nodes); `data` > 1 is
    DP attention inside the TP group (divides `tensor`); `expert` is the EP size (divides
    `tensor`).
    """

    tensor: int = Field(
        json_schema_extra=cel(
            "self >= 1 && self <= 1024",
            "spec.<role>.parallelism.tensor must be between 1 and 1024",
        ),
        description="Tensor-parallel size.",
    )
    pipeline: int = _degree("pipeline", "Pipeline-parallel size.")
    data: int = _degree(
        "data", "Data-parallel size (vLLM: DP ranks; SGLang: DP attention, --dp-size)."
    )
    expert: int = _degree("expert", "Expert-parallel size (1: off).")


class RoleSpec(Model):
    """One role (prefill or decode): a group of identical engine instances, one per pod."""

    @field_validator("podTemplate")
    @classmethod
    def _no_injected_settings(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return _check_pod_template(value)

    replicas: int = Field(
        default=1,
        json_schema_extra=cel(
            "self >= 0 && self <= 512", "replicas must be between 0 and 512 (pods of this role)"
        ),
        description="Number of engine instances (pods) of this role.",
    )
    gpusPerInstance: int = Field(
        default=1,
        json_schema_extra=cel(
            "self >= 1 && self <= 8",
            "gpusPerInstance (GPUs of one pod, on one node) must be between 1 and 8: an "
            "instance larger than a node sets nodesPerInstance as well",
        ),
        description="GPUs per pod of an instance (one node's share); without `parallelism`, "
        "also the engine's tensor-parallel size on one node.",
    )
    nodesPerInstance: int = Field(
        default=1,
        json_schema_extra=cel(
            f"self >= 1 && self <= {MAX_NODES_PER_INSTANCE}",
            f"nodesPerInstance must be between 1 and {MAX_NODES_PER_INSTANCE}: the pods (one "
            "per node, rank 0 the leader) one instance spans",
        ),
        description="Nodes one instance spans: that many pods (ranks; rank 0 leads and "
        "serves HTTP), started and scheduled together (spec.scheduling.gang); "
        "docs/multinode.md.",
    )
    parallelism: Parallelism | None = Field(
        default=None,
        description="The engine's parallelism layout over gpusPerInstance x nodesPerInstance "
        "GPUs. Unset: vLLM tensor = gpusPerInstance, data = nodesPerInstance; SGLang tensor "
        "= all the instance's GPUs.",
    )
    args: Args = Field(default_factory=list, description="Extra engine arguments for this role.")
    env: EnvList = Field(
        default_factory=list,
        description="Extra environment for this role (operator-set variables refused).",
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description="Extra resources (cpu, memory, ...); GPUs and RDMA come from the operator.",
    )
    nodeSelector: Annotated[dict[str, str], Field(max_length=64)] = Field(
        default_factory=dict,
        description="Node labels this role's pods require. The planner counts a domain's "
        "room only on nodes both this and the taints allow.",
    )
    tolerations: Annotated[list[Toleration], Field(max_length=64)] = Field(
        default_factory=list,
        description="Taints this role's pods tolerate. A node with a NoSchedule or NoExecute "
        "taint they do not tolerate is not room for them. The GPU pods always tolerate "
        "nvidia.com/gpu:NoSchedule (without DRA). Tolerations added outside the spec (a Kueue "
        "ResourceFlavor, a webhook) are not seen when a slice is placed: repeat them here.",
    )
    podTemplate: Annotated[dict[str, Any] | None, free_form()] = Field(
        default=None,
        description="A Pod template fragment merged over the rendered one (metadata, spec; "
        "containers merge by name) for anything the API does not model. What the operator "
        "sets (pdd.dev/* and app.kubernetes.io/* labels, the networks annotation, operator-set "
        "env) is refused: Stalled=InvalidSpec.",
    )


class RouterResources(ResourceRequirements):
    """The router container's resources. The defaults fit one router process (a Rust proxy)
    at moderate load; a busy one wants more CPU."""

    requests: Annotated[
        dict[str, Annotated[str, quantity("resources.requests values")]], Field(max_length=32)
    ] = Field(default_factory=lambda: {"cpu": "500m", "memory": "512Mi"})
    limits: Annotated[
        dict[str, Annotated[str, quantity("resources.limits values")]], Field(max_length=32)
    ] = Field(default_factory=lambda: {"memory": "2Gi"})


# The routing-policy fields of spec.router; each engine's adapter lists the policies its
# router offers (engines/*.py ``router_policies``).
POLICY_FIELDS = ("policy", "prefillPolicy", "decodePolicy")


def _router_policy_rules() -> list[tuple[str, str]]:
    """No policy where the operator does not run the router: a custom engine, or a router
    command of your own (each engine's adapter checks the values its router offers)."""
    given = " || ".join(f"has(self.router.{name})" for name in POLICY_FIELDS)
    return [
        (
            f"!({given}) || (self.engine.type != 'custom' && !has(self.router.command))",
            "spec.router.policy, prefillPolicy and decodePolicy choose the policy of the "
            "engine's own router: with a custom engine or spec.router.command, set your "
            "router's policy in spec.router.args instead",
        )
    ]


def _adapter_rules() -> list[tuple[str, str]]:
    """spec.model.adapters against the model (each engine's adapter refuses its own LoRA
    flags in the args, and the custom one the field)."""
    adapters = "has(self.model.adapters) && size(self.model.adapters) > 0"
    served = "(has(self.model.servedName) ? self.model.servedName : self.model.name)"
    return [
        (
            f"!({adapters}) || !has(self.model.source) || has(self.model.source.huggingFace) || "
            "self.model.adapters.all(a, !has(a.source.huggingFace))",
            "spec.model.adapters: an adapter from the Hugging Face Hub needs the model from "
            "the Hub too (a model on a volume switches the Hub off in the engine pods): put "
            "the adapter on a claim or an image",
        ),
        (
            f"!({adapters}) || self.model.adapters.all(a, a.name != {served})",
            "spec.model.adapters[].name must differ from the model's served name "
            "(spec.model.servedName, else spec.model.name): a request names one or the other",
        ),
    ]


class RouterSpec(Model):
    """The request router in front of the two roles (prefill first, then decode).

    By default the engine's upstream router runs: vllm-router for `vllm`, smg (the SGLang
    router) for `sglang`, both from `image`, finding the pods by Kubernetes service discovery
    (docs/engines.md). `command` runs a router of your own instead.
    """

    @field_validator("podTemplate")
    @classmethod
    def _no_injected_settings(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return _check_pod_template(value)

    enabled: bool = True
    image: str = Field(
        default=DEFAULT_ROUTER_IMAGE,
        max_length=512,
        json_schema_extra=cel(
            f"self.matches('{IMAGE_PATTERN}')",
            "spec.router.image must be an image reference such as "
            f"'{DEFAULT_ROUTER_IMAGE}': lowercase repository, optional :tag and @sha256 digest",
        ),
        description="Router image. The default holds vllm-router 0.1.17 and smg 1.13.0 (the "
        "Dockerfile's `router` target); the engine's adapter picks which one runs.",
    )
    imagePullPolicy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    command: Args | None = Field(
        default=None,
        description="A router of your own: replaces the engine's router command, flags, "
        "probes and metrics port; `args` follow it. Required for a `custom` engine unless "
        "`image` has its own entrypoint.",
    )
    replicas: int = Field(
        default=1,
        json_schema_extra=cel(
            "self >= 0 && self <= 64", "spec.router.replicas must be between 0 and 64"
        ),
    )
    policy: str | None = Field(
        default=None,
        max_length=32,
        description="How the router picks a pod of either role (`--policy`): the router's "
        "own policy names, per engine (docs/engines.md lists them). Unset: the router's "
        "default, cache_aware (a prefix tree of what each pod was sent).",
    )
    prefillPolicy: str | None = Field(
        default=None,
        max_length=32,
        description="The prefill pods' policy (`--prefill-policy`), over `policy`.",
    )
    decodePolicy: str | None = Field(
        default=None,
        max_length=32,
        description="The decode pods' policy (`--decode-policy`), over `policy`.",
    )
    args: Args = Field(
        default_factory=list, description="Extra router arguments, after the engine's router's."
    )
    env: EnvList = Field(
        default_factory=list, description="Extra environment (operator-set variables refused)."
    )
    port: int = Field(
        default=8000,
        json_schema_extra=cel(
            "self >= 1 && self <= 65535", "spec.router.port must be between 1 and 65535"
        ),
        description="Port the router serves HTTP (and its probes) on; the Service's `http`.",
    )
    metricsPort: int = Field(
        default=29000,
        json_schema_extra=cel(
            "self >= 1 && self <= 65535", "spec.router.metricsPort must be between 1 and 65535"
        ),
        description="Port of the router's Prometheus `/metrics` (`--prometheus-port`); the "
        "Service's `metrics`.",
    )
    requestTimeoutSeconds: int = Field(
        default=1800,
        json_schema_extra=cel(
            "self >= 1 && self <= 86400",
            "spec.router.requestTimeoutSeconds must be between 1 and 86400",
        ),
        description="How long the router waits for one request (`--request-timeout-secs`; "
        "1800 is both routers' own default).",
    )
    resources: RouterResources = Field(
        default_factory=RouterResources,
        description="The router container's resources.",
    )
    podTemplate: Annotated[dict[str, Any] | None, free_form()] = Field(
        default=None,
        description="A Pod template fragment merged over the router's (metadata, spec; "
        "containers merge by name).",
    )


class UcxVar(Model):
    name: str = Field(
        max_length=64,
        json_schema_extra=cel(
            [
                (
                    "self.matches('^UCX_[A-Z0-9_]+$')",
                    "spec.kvTransfer.ucx.extraEnv[].name must be a UCX_* variable such as "
                    "UCX_RNDV_THRESH",
                ),
                (
                    "!(self in "
                    + cel_list(tuple(n for n in RESERVED_ENV if n.startswith("UCX_")))
                    + ")",
                    "spec.kvTransfer.ucx.extraEnv[].name: UCX_TLS, UCX_NET_DEVICES and "
                    "UCX_IB_GPU_DIRECT_RDMA are set by the operator: use "
                    "spec.kvTransfer.ucx.transports, spec.kvTransfer.nicSelection and "
                    "spec.kvTransfer.gpuDirect",
                ),
            ]
        ),
    )
    value: str = Field(max_length=1024)


class UcxSpec(Model):
    transports: Annotated[
        list[Annotated[str, Field(max_length=32)]], Field(min_length=1, max_length=16)
    ] = Field(
        default_factory=lambda: ["auto"],
        json_schema_extra=cel(
            [
                (
                    "self.all(t, t == 'auto' || t in "
                    + cel_list(UCX_TRANSPORTS)
                    + " || (t.startsWith('^') && t.substring(1) in "
                    + cel_list(UCX_TRANSPORTS)
                    + "))",
                    "spec.kvTransfer.ucx.transports: unknown UCX transport; use 'auto' or "
                    "tokens of UCX_TLS: " + ", ".join(UCX_TRANSPORTS),
                ),
                (
                    "!('auto' in self) || size(self) == 1",
                    "spec.kvTransfer.ucx.transports: 'auto' stands alone; remove the other "
                    "tokens or remove 'auto'",
                ),
                (
                    "self.all(t, !t.startsWith('^')) || "
                    "(self[0].startsWith('^') && size(self.filter(t, t.startsWith('^'))) == 1)",
                    "spec.kvTransfer.ucx.transports: '^' (all but) may only start the first "
                    "token and then excludes every listed transport: ['^tcp', 'cuda_ipc'] "
                    "means all but tcp and cuda_ipc",
                ),
                (
                    "self.all(t, self.exists_one(u, u == t))",
                    "spec.kvTransfer.ucx.transports: each transport once",
                ),
                (
                    "self == ['auto'] || self[0].startsWith('^') || self.exists(t, t in "
                    + cel_list(GPU_MEMORY_TRANSPORTS)
                    + ")",
                    "spec.kvTransfer.ucx.transports has no transport for GPU memory, where the "
                    "KV cache lives: add cuda_copy (and cuda_ipc, gdr_copy), or use ['auto']",
                ),
                (
                    "self == ['auto'] || self[0].startsWith('^') || self.exists(t, !(t in "
                    + cel_list(COPY_ONLY_TRANSPORTS)
                    + "))",
                    "spec.kvTransfer.ucx.transports lists only copy transports: UCX needs one "
                    "that carries messages to connect the peers: add rc_x (RDMA), tcp or sm",
                ),
            ]
        ),
        description="UCX_TLS: `[auto]` (per path: rc_x,cuda_copy,cuda_ipc with an "
        "active-message transport for wire-up) or an explicit list of transports.",
    )
    extraEnv: Annotated[list[UcxVar], Field(max_length=32)] = Field(
        default_factory=list,
        description="More UCX_* variables, e.g. UCX_RNDV_THRESH (not the operator's own: "
        "UCX_TLS, UCX_NET_DEVICES, UCX_IB_GPU_DIRECT_RDMA).",
        json_schema_extra=cel(
            "self.all(v, self.exists_one(w, w.name == v.name))",
            "spec.kvTransfer.ucx.extraEnv: each variable once (the later one would win silently)",
        ),
    )
    scatterGather: bool = Field(
        default=True,
        description="NIXL_UCX_SGL_ENABLE: NIXL posts a transfer's many small KV descriptors "
        "as one scatter-gather copy (cuMemcpyBatchAsync) instead of one copy each; 8x faster "
        "at 64 KiB descriptors on NVLink (docs/benchmarks.md). Applies to NIXL WRITEs "
        "(SGLang, vLLM's push connector). Left off between pods without RDMA and without a "
        "shared PID namespace: there the only lane is UCX's TCP emulation, which has no "
        "protocol for it (every WRITE would fail).",
    )


class NicMapping(Model):
    gpu: int = Field(
        json_schema_extra=cel(
            "self >= 0 && self <= 63", "spec.kvTransfer.nicSelection.map[].gpu: a GPU index 0..63"
        ),
    )
    devices: str = Field(
        max_length=256,
        json_schema_extra=cel(
            "self.matches('^"
            + NIC_PORT_PATTERN.strip("^$")
            + "(,"
            + NIC_PORT_PATTERN.strip("^$")
            + ")*$')",
            "spec.kvTransfer.nicSelection.map[].devices: UCX device:port list such as "
            "'mlx5_3:1' or 'mlx5_0:1,mlx5_1:1'",
        ),
    )


class NicSelection(Model):
    mode: NicSelectionMode = Field(
        default="auto",
        description="`auto`: per GPU the nearest ACTIVE RDMA port by PCIe distance, computed "
        "by the preflight container from the node's topology; `explicit`: use `map`.",
    )
    map: Annotated[list[NicMapping], Field(max_length=64)] = Field(
        default_factory=list,
        description="Per GPU index its UCX device:port list, for mode explicit.",
        json_schema_extra=cel(
            "self.all(m, self.exists_one(n, n.gpu == m.gpu))",
            "spec.kvTransfer.nicSelection.map: a GPU index is listed twice; give each GPU "
            "one entry (several NICs go in its devices, comma-separated)",
        ),
    )


class RdmaSpec(Model):
    resourceName: str | None = Field(
        default=None,
        max_length=253,
        json_schema_extra=cel(
            "self.matches('^[a-z0-9.-]+/[A-Za-z0-9_.-]+$')",
            "spec.kvTransfer.rdma.resourceName must be an extended resource such as "
            "'rdma/rdma_shared_device_a' or 'nvidia.com/rdma_vf'",
        ),
        description="Extended resource that gives the pod its RDMA device(s). Unset: no RDMA "
        "resource is requested (same-node or TCP transfer only).",
    )
    count: int = Field(
        default=1,
        json_schema_extra=cel("self >= 1 && self <= 16", "spec.kvTransfer.rdma.count: 1..16"),
    )
    networks: Annotated[list[Annotated[str, Field(max_length=253)]], Field(max_length=16)] = Field(
        default_factory=list,
        description="Multus networks (k8s.v1.cni.cncf.io/networks) for the RDMA interfaces, "
        "each `[namespace/]name[@interface]`.",
        json_schema_extra=cel(
            [
                (
                    f"self.all(n, n.matches('{NETWORK_PATTERN}'))",
                    "spec.kvTransfer.rdma.networks[]: one NetworkAttachmentDefinition per "
                    "entry as [namespace/]name[@interface], e.g. 'rdma-net' or "
                    "'infra/rdma-net@net1' (no commas, spaces or JSON: the operator joins the "
                    "entries into the k8s.v1.cni.cncf.io/networks annotation)",
                ),
                (
                    "self.all(n, self.exists_one(m, m == n))",
                    "spec.kvTransfer.rdma.networks: each entry once",
                ),
            ]
        ),
    )
    required: bool = Field(
        default=False,
        description="Preflight stops the pod when RDMA prerequisites (device, memlock, "
        "active port) are missing, instead of warning.",
    )


class MetadataExchange(Model):
    mode: Literal["sidecar", "etcd", "engine"] = Field(
        default="sidecar",
        description="`sidecar`: the pdd sidecar publishes and serves NIXL metadata; `etcd`: "
        "NIXL's native etcd exchange; `engine`: the engine's own side channel only.",
    )
    etcdEndpoints: Annotated[list[Annotated[str, Field(max_length=253)]], Field(max_length=8)] = (
        Field(
            default_factory=list,
            json_schema_extra=cel(
                "self.all(e, e.matches('^https?://[^ ]+$'))",
                "spec.kvTransfer.metadataExchange.etcdEndpoints: use http(s)://host:port URLs",
            ),
        )
    )


class Verification(Model):
    enabled: bool = True
    intervalSeconds: int = Field(
        default=3600,
        json_schema_extra=cel(
            "self == 0 || self >= 60",
            "spec.kvTransfer.verification.intervalSeconds: 0 (only after Ready) or >= 60",
        ),
    )
    minFraction: float = Field(
        default=0.5,
        json_schema_extra=cel(
            "self > 0.0 && self <= 1.0",
            "spec.kvTransfer.verification.minFraction: a fraction of the link limit in (0, 1]",
        ),
        description="KVTransferVerified is False below this fraction of the expected link.",
    )


class KVTransferSpec(Model):
    """How KV-cache blocks travel from prefill to decode."""

    backend: Literal["nixl"] = "nixl"
    connector: Literal["auto", "NixlConnector", "NixlPushConnector"] = Field(
        default="auto",
        description="vLLM's NIXL connector: `NixlConnector` (decode pulls the KV: READ), "
        "`NixlPushConnector` (prefill pushes it: WRITE; vLLM 0.24 and later) or `auto`: the "
        "push connector where prefill and decode share a PID namespace and the release has "
        "it (WRITE moved 2.5x the bytes of READ there at the engine's descriptors, "
        "docs/benchmarks.md), else NixlConnector. SGLang always pushes; it ignores the field.",
    )
    gpuDirect: GpuDirectRequest = Field(
        default="auto",
        description="GPUDirect RDMA: `auto` = dma-buf where the node is eligible (kernel >= "
        "5.12, open kernel module, CUDA >= 11.7), else nvidia-peermem where loaded.",
    )
    ucx: UcxSpec = Field(default_factory=UcxSpec)
    nicSelection: NicSelection = Field(default_factory=NicSelection)
    rdma: RdmaSpec = Field(default_factory=RdmaSpec)
    sharedMemorySize: Annotated[str, quantity("spec.kvTransfer.sharedMemorySize")] = Field(
        default="16Gi", description="Size of /dev/shm (a memory emptyDir)."
    )
    sideChannelPort: int = Field(
        default=VLLM_SIDE_CHANNEL_BASE_PORT,
        json_schema_extra=cel(
            "self >= 1024 && self <= 65000",
            "spec.kvTransfer.sideChannelPort must be between 1024 and 65000",
        ),
        description="vLLM NIXL side-channel base port (VLLM_NIXL_SIDE_CHANNEL_PORT).",
    )
    bootstrapPort: int = Field(
        default=SGLANG_BOOTSTRAP_PORT,
        json_schema_extra=cel(
            "self >= 1024 && self <= 65535",
            "spec.kvTransfer.bootstrapPort must be between 1024 and 65535",
        ),
        description="SGLang disaggregation bootstrap port.",
    )
    metadataExchange: MetadataExchange = Field(default_factory=MetadataExchange)
    verification: Verification = Field(default_factory=Verification)


class DraSpec(Model):
    enabled: bool = False
    gpuDeviceClass: str = Field(default="gpu.nvidia.com", max_length=253)
    nicDeviceClass: str = Field(default="dranet", max_length=253)


class TopologySpec(Model):
    """Where the two roles go: one slice (all prefill + decode pods) per topology domain."""

    levels: Annotated[
        list[Annotated[str, Field(max_length=316, pattern=LABEL_KEY_PATTERN)]], Field(max_length=8)
    ] = Field(
        default_factory=lambda: [
            "nvidia.com/gpu.clique",
            "topology.kubernetes.io/rack",
            "topology.kubernetes.io/zone",
        ],
        description="Node label keys of the domain levels, best first.",
    )
    placement: Literal["required", "preferred", "none"] = Field(
        default="preferred",
        description="`required`: pods only go into the chosen domain; `preferred`: the "
        "scheduler is steered there but may go elsewhere; `none`: no placement.",
    )
    dra: DraSpec = Field(default_factory=DraSpec)


class RoleAutoscaling(Model):
    """The bounds of one role's replica count while it is autoscaled."""

    minReplicas: int = Field(
        default=1,
        json_schema_extra=cel(
            "self >= 0 && self <= 512", "minReplicas must be between 0 and 512 (pods of this role)"
        ),
        description="The fewest pods of this role. 0 allows scale to zero (both roles at 0: "
        "condition ScaledToZero, the router answers at once: vllm-router 503, smg 404).",
    )
    maxReplicas: int = Field(
        default=1,
        json_schema_extra=cel(
            "self >= 1 && self <= 512", "maxReplicas must be between 1 and 512 (pods of this role)"
        ),
        description="The most pods of this role, whatever its scale target asks for.",
    )


class ScalingRatio(Model):
    """A prefill:decode ratio, as two small integers (1:2 = one prefill per two decodes)."""

    prefill: int = Field(
        default=1,
        json_schema_extra=cel("self >= 1 && self <= 64", "ratio.prefill must be between 1 and 64"),
    )
    decode: int = Field(
        default=1,
        json_schema_extra=cel("self >= 1 && self <= 64", "ratio.decode must be between 1 and 64"),
    )


class RatioBounds(Model):
    """How far apart two independently scaled roles may drift, as prefill pods per decode pod."""

    minPrefillPerDecode: float = Field(
        default=0.0,
        json_schema_extra=cel(
            "self >= 0.0 && self <= 64.0", "ratioBounds.minPrefillPerDecode must be 0 to 64"
        ),
    )
    maxPrefillPerDecode: float = Field(
        default=64.0,
        json_schema_extra=cel(
            "self > 0.0 && self <= 64.0",
            "ratioBounds.maxPrefillPerDecode must be above 0, at most 64",
        ),
    )


class AutoscalingSpec(Model):
    """Per-role autoscaling (docs/autoscaling.md). Each role listed here and not the follower
    gets a scale target: a PDDRoleScaler named `<deployment>-<role>` with a /scale subresource
    that an HPA or KEDA drives. The scaled count lives there, never in this spec, so GitOps
    tools see no drift; `spec.<role>.replicas` is only the count the scale target starts at."""

    prefill: RoleAutoscaling | None = Field(
        default=None, description="Bounds of prefill; a scale target unless prefill follows."
    )
    decode: RoleAutoscaling | None = Field(
        default=None, description="Bounds of decode; a scale target unless decode follows."
    )
    follower: Literal["none", "prefill", "decode"] = Field(
        default="none",
        description="A role that has no scale target of its own and follows the other at "
        "`ratio` (rounded up, within its bounds; 0 while the other is at 0). `none`: every "
        "listed role scales on its own target, within `ratioBounds`.",
    )
    ratio: ScalingRatio = Field(
        default_factory=ScalingRatio,
        description="The prefill:decode ratio the follower keeps.",
    )
    ratioBounds: RatioBounds = Field(
        default_factory=RatioBounds,
        description="With no follower: after each scaling step the operator raises the role "
        "that is short (or, at its maxReplicas, lowers the other) so that prefill per decode "
        "stays within these bounds.",
    )
    kvTransferGuard: bool = Field(
        default=True,
        description="Hold decode scale-ups while the KV path is degraded "
        "(KVTransferVerified=False): decodes added behind a transfer that fell back to TCP "
        "do not lower time to first token. The decode count stays, ScalingHeld=True "
        "(reason KVPathDegraded) says why and what to fix, and scaling resumes once a probe "
        "verifies the path again. Scaling down is never held. `false`: scale regardless.",
    )


AUTOSCALING_RULES = cel(
    [
        (
            "has(self.prefill) || has(self.decode)",
            "spec.autoscaling lists no role: set spec.autoscaling.decode (and/or prefill) with "
            "minReplicas and maxReplicas, or remove spec.autoscaling",
        ),
        (
            "!has(self.prefill) || self.prefill.minReplicas <= self.prefill.maxReplicas",
            "spec.autoscaling.prefill.minReplicas is above its maxReplicas",
        ),
        (
            "!has(self.decode) || self.decode.minReplicas <= self.decode.maxReplicas",
            "spec.autoscaling.decode.minReplicas is above its maxReplicas",
        ),
        (
            "self.follower != 'prefill' || has(self.decode)",
            "spec.autoscaling.follower is prefill: set spec.autoscaling.decode, the role it "
            "follows (decode then gets the scale target)",
        ),
        (
            "self.follower != 'decode' || has(self.prefill)",
            "spec.autoscaling.follower is decode: set spec.autoscaling.prefill, the role it "
            "follows (prefill then gets the scale target)",
        ),
        (
            "!has(self.ratioBounds) || !has(self.ratioBounds.minPrefillPerDecode) || "
            "!has(self.ratioBounds.maxPrefillPerDecode) || "
            "self.ratioBounds.minPrefillPerDecode <= self.ratioBounds.maxPrefillPerDecode",
            "spec.autoscaling.ratioBounds.minPrefillPerDecode is above maxPrefillPerDecode",
        ),
    ]
)


class KvCacheOffload(Model):
    """Tiers of the KV cache beyond the GPU (docs/engines.md, "KV-cache offload")."""

    cpu: str | None = Field(
        default=None,
        max_length=64,
        json_schema_extra=quantity_at_least(
            "spec.kvCache.offload.cpu",
            "64Gi",
            "1Gi",
            "SGLang sizes its host tier in whole gigabytes per GPU",
        ),
        description="Host memory each prefill pod gives its engine for a CPU tier of the KV "
        "cache: prompts whose prefix fell out of GPU memory are loaded back from it instead "
        "of computed again. vLLM: its OffloadingConnector beside the NIXL connector (a "
        "MultiConnector); SGLang: its hierarchical cache (--enable-hierarchical-cache "
        "--hicache-size). The prefill pods' memory request (and limit, where set) is raised "
        "by this much. Decode pods get no tier: each prompt's KV reaches them from a prefill.",
    )
    disk: KvCacheDiskTier | None = Field(
        default=None,
        description="A disk tier behind the CPU tier on each prefill pod. SGLang (0.5.23 on, "
        "single-node prefill instances): its hierarchical cache's file storage backend, capped "
        "per GPU rank at 90% of the rank's share, which needs spec.kvCache.offload.cpu as "
        "well. vLLM (0.33.0 on, one engine per prefill pod): a SimpleCPUOffloadConnector "
        "with its disk backend beside the NIXL connector, one file per GPU worker made at 90% "
        "of the worker's share. Where it is not rendered, KVCacheOffloaded says why.",
    )


class KvCacheDiskTier(Model):
    """A disk tier of the prefill pods' KV cache (docs/engines.md, "KV-cache offload")."""

    size: str = Field(
        max_length=64,
        json_schema_extra=quantity_at_least("spec.kvCache.offload.disk.size", "200Gi", "1Gi"),
        description="Disk each prefill pod gives its engine for KV pages that fell out of the "
        "CPU tier; the engine evicts its least recently used pages to stay within it.",
    )
    storageClassName: str | None = Field(
        default=None,
        max_length=253,
        description="Where the disk comes from: a volume of this StorageClass per pod (a "
        "generic ephemeral volume, e.g. a local-NVMe class), created and deleted with the pod. "
        "Unset: an emptyDir of this size on the node's ephemeral storage (the pods request "
        "that much ephemeral-storage).",
    )


class KvCacheTiers(Model):
    """What the engines keep of the KV cache besides the GPU's own copy."""

    offload: KvCacheOffload = Field(
        default_factory=KvCacheOffload,
        description="Tiers beyond GPU memory (unset: none, the engines' default).",
    )


GANG_SCHEDULERS = ("native", "kueue", "volcano", "none")


class SchedulingSpec(Model):
    """How the pods of an instance that spans nodes are scheduled together (all or none)."""

    gang: Literal["native", "kueue", "volcano", "none"] = Field(
        default="native",
        description="`native`: a scheduling.k8s.io/v1alpha1 Workload with a gang pod group per "
        "instance (Kubernetes >= 1.35 with the GenericWorkload and GangScheduling feature "
        "gates); `kueue`: a Kueue pod group per instance (queueName is the LocalQueue); "
        "`volcano`: a Volcano PodGroup per instance and schedulerName volcano; `none`: no "
        "gang (an instance may start half-placed). Only instances with nodesPerInstance > 1 "
        "are gangs.",
    )
    queueName: str | None = Field(
        default=None,
        max_length=63,
        json_schema_extra=cel(
            "self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",
            "spec.scheduling.queueName must be a queue name: lowercase letters, digits and '-'",
        ),
        description="Kueue LocalQueue (required for kueue) or Volcano queue (default queue "
        "when unset).",
    )


class PDDeploymentSpec(Model):
    model: ModelSpec
    engine: EngineSpec
    prefill: RoleSpec = Field(default_factory=RoleSpec)
    decode: RoleSpec = Field(default_factory=RoleSpec)
    router: RouterSpec = Field(default_factory=RouterSpec)
    kvTransfer: KVTransferSpec = Field(default_factory=KVTransferSpec)
    kvCache: KvCacheTiers = Field(
        default_factory=KvCacheTiers,
        description="KV-cache tiers beyond GPU memory (the model's KV shape is "
        "spec.model.kvCache).",
    )
    topology: TopologySpec = Field(default_factory=TopologySpec)
    autoscaling: AutoscalingSpec | None = Field(
        default=None,
        json_schema_extra=AUTOSCALING_RULES,
        description="Per-role autoscaling through PDDRoleScaler scale targets "
        "(docs/autoscaling.md); absent: the replicas of spec.prefill and spec.decode.",
    )
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)


def _attention_tp(role: str) -> str:
    """CEL: the ranks one layer's attention heads are split over, as the adapters lay a role
    out (engines/*.py ``layout``): vLLM tensor (gpusPerInstance unset), SGLang tensor / data
    (DP attention splits the TP group; all the instance's GPUs unset). 0 where the layout
    rules refuse the values (no division by zero)."""
    r, p = f"self.{role}", f"self.{role}.parallelism"
    return (
        f"(self.engine.type == 'sglang' ? (has({p}) ? ({p}.data >= 1 ? {p}.tensor / {p}.data "
        f": 0) : {r}.gpusPerInstance * {r}.nodesPerInstance) : (has({p}) ? {p}.tensor : "
        f"{r}.gpusPerInstance))"
    )


def _shape_rules(role: str) -> list[tuple[str, str]]:
    """Per role: the attention and KV heads must split evenly over the tensor-parallel ranks
    where spec.model.kvCache gives the counts (planning/parallelism_fit.py has the same rules
    for a shape from the operator's table, and their sources; SGLang's expert rule is its
    adapter's)."""
    tp, kv = _attention_tp(role), "self.model.kvCache"
    given = f"self.engine.type == 'custom' || !has({kv}) || {tp} < 1 || "
    field = f"spec.{role}"
    size = (
        f"{field}'s tensor-parallel size (parallelism.tensor, else gpusPerInstance; SGLang: "
        "tensor / data with DP attention, else gpusPerInstance x nodesPerInstance)"
    )
    return [
        (
            given + f"!has({kv}.attentionHeads) || {kv}.attentionHeads % {tp} == 0",
            f"{size} must divide spec.model.kvCache.attentionHeads: the engine splits each "
            "layer's attention heads evenly over its tensor-parallel ranks and fails at start "
            "otherwise; choose a size that divides them (1, 2, 4 or 8 for 64 heads)",
        ),
        (
            given + f"(has({kv}.latent) && {kv}.latent) || {kv}.kvHeads < 1 || "
            f"({tp} >= {kv}.kvHeads ? {tp} % {kv}.kvHeads == 0 : {kv}.kvHeads % {tp} == 0)",
            f"{size} and spec.model.kvCache.kvHeads must divide one another: the engine splits "
            "the KV heads over its tensor-parallel ranks, or copies each to a whole number of "
            "ranks where there are more ranks than heads, and fails at start otherwise (8 KV "
            "heads: 1, 2, 4, 8, 16, ...)",
        ),
    ]


SPEC_RULES = cel(
    [
        (
            "!(self.kvTransfer.gpuDirect in ['dmabuf', 'peermem']) || "
            "self.kvTransfer.ucx.transports == ['auto'] || "
            "self.kvTransfer.ucx.transports.exists(t, t in " + cel_list(RDMA_TRANSPORTS) + ")",
            "spec.kvTransfer.gpuDirect forces GPUDirect RDMA but spec.kvTransfer.ucx.transports "
            "has no RDMA transport: add rc_x (or dc_x/rc), use ['auto'], or set gpuDirect to off",
        ),
        (
            "!(self.kvTransfer.gpuDirect in ['dmabuf', 'peermem']) || "
            "has(self.kvTransfer.rdma.resourceName) || self.topology.dra.enabled",
            "spec.kvTransfer.gpuDirect forces GPUDirect RDMA: set "
            "spec.kvTransfer.rdma.resourceName (e.g. rdma/rdma_shared_device_a) or enable "
            "spec.topology.dra so pods get a NIC",
        ),
        (
            "self.kvTransfer.nicSelection.mode != 'explicit' || "
            "size(self.kvTransfer.nicSelection.map) > 0",
            "spec.kvTransfer.nicSelection.mode is explicit: list GPU index -> device:port in "
            "spec.kvTransfer.nicSelection.map, or use mode auto",
        ),
        (
            "self.kvTransfer.metadataExchange.mode != 'etcd' || "
            "size(self.kvTransfer.metadataExchange.etcdEndpoints) > 0",
            "spec.kvTransfer.metadataExchange.mode is etcd: set "
            "spec.kvTransfer.metadataExchange.etcdEndpoints",
        ),
        (
            "has(self.autoscaling) || self.prefill.replicas + self.decode.replicas > 0",
            "spec.prefill.replicas and spec.decode.replicas are both 0: a deployment needs at "
            "least one instance (scale to zero needs spec.autoscaling with minReplicas 0)",
        ),
        (
            "!self.topology.dra.enabled || !has(self.kvTransfer.rdma.resourceName)",
            "spec.topology.dra.enabled asks DRA for the NIC: remove "
            "spec.kvTransfer.rdma.resourceName (device-plugin resource) or disable DRA",
        ),
        (
            # The engine, its sidecar and its side channels share the pod's network.
            "self.engine.port != self.kvTransfer.sideChannelPort && "
            "self.engine.port != self.kvTransfer.bootstrapPort && "
            f"(self.kvTransfer.metadataExchange.mode == 'engine' || "
            f"self.engine.port != {SIDECAR_PORT})",
            "spec.engine.port must differ from spec.kvTransfer.sideChannelPort, "
            f"spec.kvTransfer.bootstrapPort and the sidecar's port {SIDECAR_PORT}: they share "
            "the pod's network; choose another engine port",
        ),
        *_adapter_rules(),
        *_router_policy_rules(),
        *_shape_rules("prefill"),
        *_shape_rules("decode"),
        (
            "self.scheduling.gang != 'kueue' || has(self.scheduling.queueName)",
            "spec.scheduling.gang is kueue: set spec.scheduling.queueName to the LocalQueue "
            "the instances are admitted through",
        ),
    ]
)


class Condition(Model):
    """A condition by the Kubernetes API conventions."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    observedGeneration: int = 0
    lastTransitionTime: str = ""


class RoleStatus(Model):
    model_config = ConfigDict(extra="ignore", frozen=True)

    desired: int = Field(
        default=0, description="What the role runs now: pods, or instances where they span nodes."
    )
    ready: int = Field(
        default=0,
        description="Of those, how many are Ready. Prefill and decode are counted from their "
        "pods (Ready and not terminating; an instance when all its ranks are), the router from "
        "its Deployment.",
    )
    updated: int = Field(
        default=0,
        description="Of those, how many run the current revision: prefill and decode pods "
        "created from their StatefulSet's update revision, the router from its Deployment.",
    )
    revision: str = Field(
        default="",
        description="The revision the spec asks prefill and decode pods to run: a hash of what "
        "they must share to pair (their pdd.dev/revision label).",
    )


class PlacementStatus(Model):
    model_config = ConfigDict(extra="ignore", frozen=True)

    level: str = ""
    domain: str = ""
    nodes: list[str] = Field(default_factory=list)
    message: str = ""


# status.transfer.ranks lists at most this many prefill ranks, the ones asked to probe.
MAX_TRANSFER_RANKS = 32


class RankTransferStatus(Model):
    """One prober's own measurement: a prefill rank's, where instances span nodes, or the
    first prefill pod of a slice's, where the deployment may grow by slices."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    pod: str = Field(default="", description="The prefill rank pod that ran the probe.")
    role: str = Field(default="prefill", description="The role of `pod`.")
    instance: int = Field(default=0, description="The instance `pod` is a rank of.")
    rank: int = Field(default=0, description="Its rank in that instance (0: the leader).")
    peer: str = Field(default="", description="The decode pod it measured against.")
    slice: int | None = Field(
        default=None, description="The slice whose path it measured (status.slices' index)."
    )
    path: str = ""
    transport: str = ""
    measuredGBps: float = 0.0
    expectedGBps: float = 0.0
    verified: bool = Field(default=False, description="This rank's path reached the floor.")
    reason: str = Field(
        default="", description="The verdict, as KVTransferVerified's reasons for one path."
    )
    message: str = Field(default="", description="Measured vs expected, and what to check.")


class SliceStatus(Model):
    """A group of prefill and decode pods in one topology domain, paired among themselves
    (docs/autoscaling.md, "Slices"). Slice 0 is the home domain (status.placement)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    index: int = 0
    level: str = ""
    domain: str = ""
    prefill: int = Field(default=0, description="Prefill pods the slice runs.")
    decode: int = Field(default=0, description="Decode pods the slice runs.")


class TransferStatus(Model):
    model_config = ConfigDict(extra="ignore", frozen=True)

    path: str = ""
    transport: str = ""
    measuredGBps: float = 0.0
    expectedGBps: float = 0.0
    verified: bool = False
    message: str = ""
    lastProbeTime: str = ""
    requestedAt: str = Field(default="", description="When the operator last asked for a probe.")
    measuredBy: str = Field(
        default="",
        description="`preflight`: with the engine's own GPUs and NICs, before it started; "
        "`sidecar`: between the sidecars, without them.",
    )
    link: str = Field(default="", description="The link measured: nvlink, rdma, gpu or host.")
    engineDescriptorBytes: int = Field(
        default=0, description="The engine's KV descriptor size (one block of one layer)."
    )
    engineGBps: float = Field(
        default=0.0, description="What the path moved at the engine's descriptor size."
    )
    direction: str = Field(
        default="",
        description="The engine's direction the check moved the KV in: READ (decode pulls, "
        "vLLM's NixlConnector) or WRITE (prefill pushes: vLLM's NixlPushConnector, SGLang).",
    )
    peerBoundary: str = Field(
        default="",
        description="`pod`: the check's peer ran beyond a pod boundary (its own PID, IPC and "
        "mount namespaces), as the other role's engine does; `host-pid`: both roles run in the "
        "host's PID namespace (hostPID), so the peer had only its own IPC and mount namespaces "
        "and /dev/shm; `host-pid-ipc`: hostPID and hostIPC, only the mount namespace apart; "
        "`none`: in the same namespaces.",
    )
    ucxLanes: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="The UCX lanes that carried the bytes, from UCX's own protocol table.",
    )
    emulated: bool = Field(
        default=False,
        description="UCX moved the bytes by software emulation (through the CPU) rather than "
        "a zero-copy or RDMA protocol.",
    )
    promptKVSeconds: float = Field(
        default=0.0,
        description="What the KV of one 4,096-token prompt of this model takes per engine rank "
        "at the measured rate (the engine's descriptor size where measured): the time-to-first-"
        "token a request pays for the transfer. 0: the model's shape is unknown.",
    )
    ranks: list[RankTransferStatus] = Field(
        default_factory=list,
        max_length=MAX_TRANSFER_RANKS,
        description="Where instances span nodes: every prefill rank's own measurement (the "
        f"first {MAX_TRANSFER_RANKS} ranks); the fields above are the worst rank's.",
    )


class AdapterStatus(Model):
    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    requestFields: dict[str, str] = Field(
        default_factory=dict,
        description="What a request's JSON body sets to be served with the adapter: vLLM "
        '{"model": "<adapter>"}; SGLang {"model": "<served name>", "lora_path": "<adapter>"}.',
    )


class PDDeploymentStatus(Model):
    model_config = ConfigDict(extra="ignore", frozen=True)

    observedGeneration: int = 0
    prefill: RoleStatus = Field(default_factory=RoleStatus)
    decode: RoleStatus = Field(default_factory=RoleStatus)
    router: RoleStatus = Field(default_factory=RoleStatus)
    prefillReplicas: str = Field(default="0/0", description="ready/desired, for kubectl get.")
    decodeReplicas: str = Field(default="0/0", description="ready/desired, for kubectl get.")
    placement: PlacementStatus = Field(default_factory=PlacementStatus)
    slices: list[SliceStatus] = Field(
        default_factory=list,
        description="Autoscaled deployments with a follower: each slice, its domain and counts.",
    )
    transfer: TransferStatus = Field(default_factory=TransferStatus)
    adapters: list[AdapterStatus] = Field(
        default_factory=list,
        description="The LoRA adapters the engines are told to load (spec.model.adapters), "
        "each with the request fields that select it.",
    )
    waitingSince: str = Field(
        default="",
        description=(
            "When the operator first found this generation waiting for an object it names that "
            "may still be created (the model's Secret or claim); empty while none is awaited. "
            "Reconciling until 5 minutes after it, Stalled from then on."
        ),
    )
    conditions: list[Condition] = Field(default_factory=list)


PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Model", "type": "string", "jsonPath": ".spec.model.name", "priority": 1},
    {
        "name": "Prefill",
        "type": "string",
        "jsonPath": ".status.prefillReplicas",
        "description": "prefill ready/desired",
    },
    {
        "name": "Decode",
        "type": "string",
        "jsonPath": ".status.decodeReplicas",
        "description": "decode ready/desired",
    },
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": f'.status.conditions[?(@.type=="{condition_types.READY}")].status',
    },
    {"name": "Transfer", "type": "string", "jsonPath": ".status.transfer.path", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


class PDDeployment(Model):
    """A parsed PDDeployment: what the operator reads from the API server."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    namespace: str
    uid: str
    generation: int
    spec: PDDeploymentSpec
    status: PDDeploymentStatus = Field(default_factory=PDDeploymentStatus)

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> PDDeployment:
        meta = body["metadata"]
        return cls(
            name=meta["name"],
            namespace=meta["namespace"],
            uid=meta["uid"],
            generation=int(meta.get("generation", 1)),
            spec=PDDeploymentSpec.model_validate(body.get("spec") or {}),
            status=PDDeploymentStatus.model_validate(body.get("status") or {}),
        )


# ------------------------------------------------------------------------ PDDRoleScaler
# One per autoscaled role, created and owned by the operator: the scale target of that role.

SCALER_KIND = "PDDRoleScaler"
SCALER_PLURAL = "pddrolescalers"
SCALER_SINGULAR = "pddrolescaler"
SCALER_SHORT_NAMES = ["pddrs"]


class PDDRoleScalerSpec(Model):
    """Written by the HPA, KEDA or `kubectl scale` through /scale; created by the operator."""

    model_config = ConfigDict(extra="ignore")

    deployment: str = Field(
        default="",
        max_length=253,
        json_schema_extra=cel("self == oldSelf", "spec.deployment cannot change"),
        description="The PDDeployment whose role this scales (set by the operator).",
    )
    role: Literal["prefill", "decode"] = Field(
        default="decode",
        json_schema_extra=cel("self == oldSelf", "spec.role cannot change"),
        description="The role this scales (set by the operator).",
    )
    replicas: int = Field(
        default=1,
        json_schema_extra=cel(
            "self >= 0 && self <= 512", "spec.replicas must be between 0 and 512"
        ),
        description="The count asked for. The operator keeps the role within "
        "spec.autoscaling's bounds and ratio of its PDDeployment; status.replicas says what "
        "it runs.",
    )


class PDDRoleScalerStatus(Model):
    model_config = ConfigDict(extra="ignore", frozen=True)

    replicas: int = Field(default=0, description="Pods of the role the operator runs now.")
    readyReplicas: int = 0
    selector: str = Field(
        default="", description="Label selector of the role's pods (for HPA pod metrics)."
    )
    message: str = Field(
        default="", description="Why status.replicas differs from spec.replicas, if it does."
    )


SCALER_PRINTER_COLUMNS = [
    {"name": "Deployment", "type": "string", "jsonPath": ".spec.deployment"},
    {"name": "Role", "type": "string", "jsonPath": ".spec.role"},
    {"name": "Wanted", "type": "integer", "jsonPath": ".spec.replicas"},
    {"name": "Running", "type": "integer", "jsonPath": ".status.replicas"},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]
