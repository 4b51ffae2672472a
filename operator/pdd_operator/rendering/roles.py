"""Render a prefill or decode role: a StatefulSet (stable pod identities) and its headless
Service; where instances span nodes, a StatefulSet and a headless Service per instance
(rendering.ranks, docs/multinode.md)."""

from __future__ import annotations

import hashlib
import json
import weakref
from typing import Any

from pdd_contract.env import PDD_DEPLOYMENT, PDD_ROLE, POD_IP
from pdd_contract.paths import ENV_DIR, ENV_FILE
from pdd_contract.resources import GPU_RESOURCE
from pdd_operator.api import names
from pdd_operator.api.v1alpha1 import (
    INJECTED_CONTAINER_SETTABLE,
    INJECTED_CONTAINERS,
    PREFLIGHT_CONTAINER,
    SIDECAR_CONTAINER,
    SIDECAR_ONLY_VOLUMES,
    PDDeployment,
    PDDeploymentSpec,
)
from pdd_operator.engines.base import EngineLaunch, EnginePort, HealthCheck, role_spec
from pdd_operator.planning.eligibility import GPU_TOLERATION
from pdd_operator.planning.kv_offload import raised_quantity, rendered_tier
from pdd_operator.planning.placement import Placement
from pdd_operator.rendering import kv_disk, model, sidecar, transfer
from pdd_operator.rendering.command import engine_launch, wrap_with_env_file
from pdd_operator.rendering.context import RenderContext
from pdd_operator.rendering.gang import gang_pod_fields
from pdd_operator.rendering.kinds import SERVICE, STATEFUL_SET, ChildPart
from pdd_operator.rendering.merge import merge_pod_template
from pdd_operator.rendering.meta import child_metadata as child_metadata
from pdd_operator.rendering.pod_security import (
    engine_security_context,
    non_root_security_context,
    pod_security_context,
)
from pdd_operator.rendering.ranks import (
    is_multinode,
    leader_only_probe,
    rank_env,
    rank_script,
    rendezvous,
)

SHM_VOLUME = "dshm"
ENV_VOLUME = "pdd-env"
PREFLIGHT_TMP_VOLUME = "preflight-tmp"
HTTP_PORT_NAME = "http"


def engine_revision(spec: PDDeploymentSpec) -> str:
    """Hash of everything that must match between a prefill and a decode pod to pair them.

    Model, engine build and KV-transfer settings: a prefill pod only sends KV blocks to decode
    pods of the same revision (the sidecar and router read the `pdd.dev/revision` label).
    A pass asks for it of one spec object several times (its render context, each role's pod
    template, the router, instance restarts); the spec is frozen, so it is worked out once
    per object."""
    known = _revisions.get(id(spec))
    if known is not None and known[0]() is spec:
        return known[1]
    relevant = {
        "model": spec.model.model_dump(mode="json"),
        "engine": spec.engine.model_dump(mode="json"),
        "kvTransfer": spec.kvTransfer.model_dump(mode="json"),
    }
    blob = json.dumps(relevant, sort_keys=True).encode()
    revision = hashlib.sha256(blob).hexdigest()[:10]
    if len(_revisions) >= _REVISIONS_KEPT:
        _revisions.clear()
    _revisions[id(spec)] = (weakref.ref(spec), revision)
    return revision


# By the spec object's id; the weak reference tells a live object from a later one that
# got the same id. Bounded: passes hold a few dozen specs at a time.
_REVISIONS_KEPT = 1024
_revisions: dict[int, tuple[weakref.ref[PDDeploymentSpec], str]] = {}


def render_role(pdd: PDDeployment, role: str, ctx: RenderContext) -> list[dict[str, Any]]:
    if not is_multinode(pdd, role):
        return [render_role_statefulset(pdd, role, ctx), render_role_service(pdd, role, ctx)]
    instances = range(role_spec(pdd.spec, role).replicas)
    return [
        render_role_service(pdd, role, ctx),
        *[obj for i in instances for obj in render_instance(pdd, role, i, ctx)],
    ]


def render_instance(
    pdd: PDDeployment, role: str, index: int, ctx: RenderContext
) -> list[dict[str, Any]]:
    """One instance over nodesPerInstance nodes: a StatefulSet whose ordinals are the ranks
    (0 leads), started in parallel, and the headless Service that names the leader."""
    name = names.instance_name(pdd.name, role, index)
    selector = {**names.selector_labels(pdd.name, role), names.LABEL_INSTANCE: str(index)}
    statefulset = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": child_metadata(pdd, name, role),
        "spec": {
            "replicas": role_spec(pdd.spec, role).nodesPerInstance,
            "serviceName": name,
            # Every rank at once: the leader waits for the others at the rendezvous.
            "podManagementPolicy": "Parallel",
            # The operator replaces an instance's ranks together (planning.instance_rollout):
            # a rank-by-rank update would mix two revisions in one engine.
            "updateStrategy": {"type": "OnDelete"},
            "selector": {"matchLabels": selector},
            "template": render_pod_template(pdd, role, ctx, index),
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_metadata(pdd, name, role),
        "spec": {
            "clusterIP": "None",
            # The ranks resolve the leader before any of them is Ready.
            "publishNotReadyAddresses": True,
            "selector": selector,
            "ports": [{"name": "rendezvous", "port": rendezvous(pdd, role, index).port}],
        },
    }
    return [statefulset, service]


def render_role_service(pdd: PDDeployment, role: str, ctx: RenderContext) -> dict[str, Any]:
    """Headless: gives pods stable DNS names; EndpointSlices list peers (not-ready too)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_metadata(pdd, names.role_name(pdd.name, role), role),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": names.selector_labels(pdd.name, role),
            "ports": _service_ports(pdd.spec, ctx),
        },
    }


def render_role_statefulset(pdd: PDDeployment, role: str, ctx: RenderContext) -> dict[str, Any]:
    rspec = role_spec(pdd.spec, role)
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": child_metadata(pdd, names.role_name(pdd.name, role), role),
        "spec": {
            "replicas": rspec.replicas,
            "serviceName": names.role_name(pdd.name, role),
            "podManagementPolicy": "Parallel",
            "updateStrategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"partition": ctx.partitions.get(role, 0)},
            },
            "selector": {"matchLabels": names.selector_labels(pdd.name, role)},
            "template": render_pod_template(pdd, role, ctx),
        },
    }


def render_pod_template(
    pdd: PDDeployment, role: str, ctx: RenderContext, instance: int | None = None
) -> dict[str, Any]:
    """A role's pod; with `instance`, a rank's pod of that multi-node instance."""
    spec = pdd.spec
    rspec = role_spec(spec, role)
    labels = {**names.common_labels(pdd.name, role), names.LABEL_REVISION: engine_revision(spec)}
    gang = gang_pod_fields(pdd, role, instance) if instance is not None else None
    if instance is not None:
        labels[names.LABEL_INSTANCE] = str(instance)
    pod_spec: dict[str, Any] = {
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 60,
        "securityContext": pod_security_context(),
        "initContainers": [_preflight_container(pdd, role, ctx)],
        "containers": [
            _engine_container(pdd, role, ctx, instance),
            *sidecar.sidecar_containers(pdd, role, ctx, engine_revision(spec)),
        ],
        "volumes": _volumes(spec, role, ctx) + sidecar.sidecar_volumes(pdd),
        **ctx.settings.pull_secrets(),
    }
    account = sidecar.service_account(pdd)
    if account:
        pod_spec["serviceAccountName"] = account
    if spec.topology.dra.enabled:
        pod_spec["resourceClaims"] = [
            {
                "name": "gpu-nic",
                "resourceClaimTemplateName": names.claim_template_name(pdd.name, role),
            }
        ]
    affinity = render_affinity(ctx.placement)
    if instance is not None:
        affinity = {**affinity, **_ranks_together(pdd, role, instance, ctx.placement.level)}
    if affinity:
        pod_spec["affinity"] = affinity
    if rspec.nodeSelector:
        pod_spec["nodeSelector"] = dict(rspec.nodeSelector)
    if rspec.tolerations:
        pod_spec["tolerations"] = [t.model_dump(exclude_none=True) for t in rspec.tolerations]
    if gang is not None:
        labels.update(gang.labels)
        pod_spec.update(gang.spec)
    template: dict[str, Any] = {
        "metadata": {
            "labels": labels,
            "annotations": {
                **(gang.annotations if gang is not None else {}),
                "kubectl.kubernetes.io/default-container": "engine",
                names.ANNOTATION_OWNER_NAME: pdd.name,
                **transfer.network_annotations(spec),
                # What the engine's router reads from a pod it discovers (bootstrap port, ...).
                **ctx.engine(spec).pod_annotations(spec, role),
            },
        },
        "spec": pod_spec,
    }
    if rspec.podTemplate:
        template = merge_pod_template(
            template, rspec.podTemplate, INJECTED_CONTAINERS, INJECTED_CONTAINER_SETTABLE
        )
    # The engine runs model code: no ServiceAccount token is mounted into every container;
    # the sidecar mounts the one it needs itself (sidecar.sidecar_volumes). Set after the
    # podTemplate, as the injected containers are: the account is the sidecar's.
    template["spec"]["automountServiceAccountToken"] = False
    _keep_api_access_in_the_sidecar(template["spec"])
    if not spec.topology.dra.enabled:
        _tolerate_the_gpu_taint(template["spec"])
    return template


def _tolerate_the_gpu_taint(pod_spec: dict[str, Any]) -> None:
    """The pods request GPUs, so nodes tainted for GPU pods only are theirs; the planner counts
    them as room (planning.eligibility.GPU_TOLERATION). Added after the podTemplate, whose
    tolerations replace the rest."""
    toleration = {"key": GPU_TOLERATION.key, "operator": "Exists", "effect": "NoSchedule"}
    tolerations = pod_spec.get("tolerations")
    if not isinstance(tolerations, list):
        tolerations = pod_spec["tolerations"] = []
    if toleration not in tolerations:
        tolerations.append(toleration)


def _keep_api_access_in_the_sidecar(pod_spec: dict[str, Any]) -> None:
    """Drop a mount of the sidecar's token from every other container, where a podTemplate
    that skipped validation added one."""
    for list_name in ("initContainers", "containers"):
        for container in pod_spec.get(list_name, []):
            if container.get("name") == SIDECAR_CONTAINER or "volumeMounts" not in container:
                continue
            container["volumeMounts"] = [
                m for m in container["volumeMounts"] if m.get("name") not in SIDECAR_ONLY_VOLUMES
            ]


def render_affinity(placement: Placement) -> dict[str, Any]:
    """The planner's decision as node affinity the real scheduler enforces."""
    if placement.mode == "none" or not (placement.domain or placement.node_requirements):
        return {}
    expressions = [
        {"key": key, "operator": "In", "values": list(values)}
        for key, values in placement.node_requirements
    ]
    if placement.domain:
        expressions.insert(
            0, {"key": placement.level, "operator": "In", "values": [placement.domain]}
        )
    if placement.mode == "required":
        return {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": expressions}]
                }
            }
        }
    return {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "preference": {"matchExpressions": expressions}}
            ]
        }
    }


def _ranks_together(pdd: PDDeployment, role: str, instance: int, level: str) -> dict[str, Any]:
    """The ranks of an instance on distinct nodes (each is one node's share of its GPUs) and,
    where the planner chose a domain level, all inside one domain of it: one NVLink clique or
    rack per instance, whatever spec.topology.placement lets the slice as a whole do."""
    same_instance = {**names.selector_labels(pdd.name, role), names.LABEL_INSTANCE: str(instance)}
    selector = {"matchLabels": same_instance}
    out: dict[str, Any] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": selector, "topologyKey": "kubernetes.io/hostname"}
            ]
        }
    }
    if level:
        out["podAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": selector, "topologyKey": level}
            ]
        }
    return out


def gpu_resources(spec: PDDeploymentSpec, role: str) -> dict[str, Any]:
    """GPUs (device plugin, unless DRA claims them), RDMA and the user's extra resources."""
    rspec = role_spec(spec, role)
    limits: dict[str, str] = dict(rspec.resources.limits)
    requests: dict[str, str] = dict(rspec.resources.requests)
    if not spec.topology.dra.enabled:
        limits[GPU_RESOURCE] = str(rspec.gpusPerInstance)
    limits.update(transfer.rdma_resources(spec))
    for key, value in limits.items():
        if key not in requests and "/" in key:
            requests[key] = value  # extended resources: requests must equal limits
    out: dict[str, Any] = {"limits": limits, "requests": requests}
    if spec.topology.dra.enabled:
        out["claims"] = [{"name": "gpu-nic"}]
    return out


def engine_resources(spec: PDDeploymentSpec, role: str, ctx: RenderContext) -> dict[str, Any]:
    """``gpu_resources``, with the memory request (and limit, where set) raised by the CPU
    tier of the KV cache where the role has one: the engine pins that much host memory."""
    resources = gpu_resources(spec, role)
    tier = rendered_tier(spec, ctx.engine(spec), role)
    if tier is None or not tier.verdict.rendered:
        return resources
    extra = tier.tier.pod_bytes
    requests, limits = resources["requests"], resources["limits"]
    # A limit without a request is the request too (Kubernetes' defaulting): raise from it.
    request = requests.get("memory", limits.get("memory"))
    requests["memory"] = raised_quantity(request, extra)
    if "memory" in limits:
        limits["memory"] = raised_quantity(limits["memory"], extra)
    return resources


def _engine_container(
    pdd: PDDeployment, role: str, ctx: RenderContext, instance: int | None = None
) -> dict[str, Any]:
    spec = pdd.spec
    rspec = role_spec(spec, role)
    adapter = ctx.engine(spec)
    engine = engine_launch(adapter, spec, role)
    disk = kv_disk.disk_tier(spec, adapter, role)
    health = adapter.health_check(spec)
    readiness = _http_probe(health, health.failure_threshold)
    startup = _http_probe(health, model.startup_failure_threshold(spec, health))
    ranks: list[dict[str, Any]] = []
    script = ""
    if instance is not None:
        meet = rendezvous(pdd, role, instance)
        multinode = adapter.multinode(spec, role, meet)
        engine = EngineLaunch(engine.command, (*engine.args, *multinode.args), engine.env)
        script = rank_script(multinode)
        ranks = rank_env(meet)
        readiness = leader_only_probe(health, spec.engine.port, health.failure_threshold)
        startup = leader_only_probe(
            health, spec.engine.port, model.startup_failure_threshold(spec, health)
        )
    command, args = wrap_with_env_file(engine.command, engine.args, script)
    env: list[dict[str, Any]] = [
        {"name": PDD_ROLE, "value": role},
        {"name": PDD_DEPLOYMENT, "value": names.instance_id(pdd.name)},
        {"name": POD_IP, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        *ranks,
        *engine.env,
        *model.model_env(spec, adapter),
        *transfer.transfer_env(spec),
        *sidecar.engine_env(pdd, ctx.settings.sidecar_port),
        *[e.model_dump(exclude_none=True) for e in spec.engine.env],
        *[e.model_dump(exclude_none=True) for e in rspec.env],
    ]
    container: dict[str, Any] = {
        "name": "engine",
        "image": spec.engine.image,
        "imagePullPolicy": spec.engine.imagePullPolicy,
        "env": _dedupe_env(env),
        "ports": [
            {"name": HTTP_PORT_NAME, "containerPort": spec.engine.port, "protocol": "TCP"},
            *[_container_port(p) for p in adapter.ports(spec)],
        ],
        "resources": kv_disk.with_ephemeral_storage(engine_resources(spec, role, ctx), disk),
        "volumeMounts": [
            {"name": SHM_VOLUME, "mountPath": "/dev/shm"},
            {"name": ENV_VOLUME, "mountPath": ENV_DIR, "readOnly": True},
            *sidecar.engine_mounts(pdd),
            *model.model_mounts(spec, adapter),
            *kv_disk.disk_mounts(disk),
        ],
        "readinessProbe": readiness,
        "startupProbe": startup,
        # Capabilities: none, except IPC_LOCK to pin RDMA memory.
        "securityContext": engine_security_context(transfer.engine_capabilities(spec)),
    }
    if command:
        container["command"] = command
    if args:
        container["args"] = args
    return container


def _container_port(port: EnginePort) -> dict[str, Any]:
    return {"name": port.name, "containerPort": port.port, "protocol": "TCP"}


def _http_probe(health: HealthCheck, failure_threshold: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": health.path, "port": HTTP_PORT_NAME},
        "periodSeconds": health.period_s,
        "timeoutSeconds": health.timeout_s,
        "failureThreshold": failure_threshold,
    }


def _preflight_container(pdd: PDDeployment, role: str, ctx: RenderContext) -> dict[str, Any]:
    """Runs on the node before the engine, with the same GPUs (the device plugin hands an init
    container's devices on to the app containers), to compute UCX_NET_DEVICES and check the
    RDMA prerequisites; a missing required one stops the pod with a message saying what to fix.
    """
    spec = pdd.spec
    return {
        "name": PREFLIGHT_CONTAINER,
        "image": ctx.settings.sidecar_image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["pdd-node", "preflight", "--env-file", ENV_FILE],
        "env": [
            {"name": PDD_ROLE, "value": role},
            *transfer.transfer_env(spec),
            *transfer.kv_path_check_env(spec, ctx.engine(spec)),
        ],
        "resources": gpu_resources(spec, role),
        "volumeMounts": [
            {"name": ENV_VOLUME, "mountPath": ENV_DIR},
            {"name": SHM_VOLUME, "mountPath": "/dev/shm"},
            {"name": PREFLIGHT_TMP_VOLUME, "mountPath": "/tmp"},  # the KV-path check's UCX logs
        ],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        # Reads sysfs/procfs (world-readable) and its own limits: no privilege needed.
        "securityContext": non_root_security_context(read_only_root=True),
    }


def _volumes(spec: PDDeploymentSpec, role: str, ctx: RenderContext) -> list[dict[str, Any]]:
    return [
        {
            "name": SHM_VOLUME,
            "emptyDir": {"medium": "Memory", "sizeLimit": shared_memory_size(spec, role, ctx)},
        },
        {"name": ENV_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        {"name": PREFLIGHT_TMP_VOLUME, "emptyDir": {"sizeLimit": "64Mi"}},
        *model.model_volumes(spec),
        *kv_disk.disk_volumes(kv_disk.disk_tier(spec, ctx.engine(spec), role)),
    ]


def shared_memory_size(spec: PDDeploymentSpec, role: str, ctx: RenderContext) -> str:
    """spec.kvTransfer.sharedMemorySize, plus the CPU tier of the KV cache where the engine
    keeps it in /dev/shm."""
    size = spec.kvTransfer.sharedMemorySize
    tier = rendered_tier(spec, ctx.engine(spec), role)
    if tier is None or not tier.verdict.in_shared_memory:
        return size
    return raised_quantity(size, tier.tier.pod_bytes)


def _service_ports(spec: PDDeploymentSpec, ctx: RenderContext) -> list[dict[str, Any]]:
    ports: list[dict[str, Any]] = [
        {"name": HTTP_PORT_NAME, "port": spec.engine.port, "targetPort": HTTP_PORT_NAME},
        *[{"name": p.name, "port": p.port} for p in ctx.engine(spec).ports(spec)],
    ]
    if sidecar.sidecar_enabled(spec):
        ports.append({"name": "sidecar", "port": ctx.settings.sidecar_port})
    return ports


def _dedupe_env(env: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Later entries win (user env overrides rendered env), first position is kept."""
    by_name: dict[str, dict[str, Any]] = {}
    for item in env:
        by_name[item["name"]] = item
    return list(by_name.values())


PART = ChildPart(
    "roles",
    (STATEFUL_SET, SERVICE),
    lambda pdd, ctx: [obj for role in names.ROLES for obj in render_role(pdd, role, ctx)],
)
