"""The NIXL sidecar of every prefill/decode pod and what it needs: a token, an identity, a fence.

NIXL metadata carries memory-access keys, so only pods of the same PDDeployment may read it:
the sidecar requires a per-deployment token (a Secret the operator creates once, mounted into
the sidecars) and discovers peers through EndpointSlices with a Role that allows exactly that.
The NetworkPolicy that admits only the deployment's own pods to the sidecar port is rendered
by rendering.network_policy, with or without a sidecar (the engines' side channels need it too).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pdd_contract.env import (
    NIXL_ETCD_ENDPOINTS,
    NIXL_ETCD_NAMESPACE,
    PDD_PROBER_POD,
    PDD_REVISION,
    PDD_SIDE_CHANNEL,
    PDD_SIDE_CHANNEL_PORTS,
    PDD_SIDE_CHANNEL_RANK_PORTS,
    PDD_SIDE_CHANNEL_ROLES,
    PDD_SIDECAR_TOKEN_FILE,
    PDD_SIDECAR_URL,
    POD_IP,
    POD_NAME,
    POD_UID,
)
from pdd_contract.paths import ENV_DIR, TOKEN_DIR, TOKEN_FILE, TOKEN_KEY
from pdd_contract.ports import NO_SIDE_CHANNEL, SIDE_CHANNEL_SERVED_BY, format_rank_ports
from pdd_operator.api import names
from pdd_operator.api.v1alpha1 import SIDECAR_CONTAINER, PDDeployment, PDDeploymentSpec
from pdd_operator.engines.base import EngineAdapter
from pdd_operator.planning.probe_pairs import per_rank_probes, probe_pairs
from pdd_operator.planning.slices import Slice
from pdd_operator.rendering.access import api_access_mount, api_access_volume, render_account
from pdd_operator.rendering.context import RenderContext
from pdd_operator.rendering.kinds import ACCESS_KINDS, ChildPart
from pdd_operator.rendering.pod_security import non_root_security_context
from pdd_operator.rendering.transfer import transfer_env

TOKEN_VOLUME = "sidecar-token"
SCRATCH_VOLUME = "sidecar-tmp"


def sidecar_enabled(spec: PDDeploymentSpec) -> bool:
    return spec.kvTransfer.metadataExchange.mode in ("sidecar", "etcd")


def service_account(pdd: PDDeployment) -> str | None:
    return names.sidecar_account_name(pdd.name) if sidecar_enabled(pdd.spec) else None


def engine_env(pdd: PDDeployment, sidecar_port: int) -> list[dict[str, Any]]:
    """Where the engine finds its sidecar, and NIXL's own etcd settings in etcd mode."""
    spec = pdd.spec
    exchange = spec.kvTransfer.metadataExchange
    env: list[dict[str, Any]] = []
    if sidecar_enabled(spec):
        env.append({"name": PDD_SIDECAR_URL, "value": f"http://127.0.0.1:{sidecar_port}"})
        env.append({"name": PDD_SIDECAR_TOKEN_FILE, "value": TOKEN_FILE})
    if exchange.mode == "etcd":
        env.append({"name": NIXL_ETCD_ENDPOINTS, "value": ",".join(exchange.etcdEndpoints)})
        env.append({"name": NIXL_ETCD_NAMESPACE, "value": etcd_namespace(pdd)})
    return env


def engine_mounts(pdd: PDDeployment) -> list[dict[str, Any]]:
    """The deployment's sidecar token, read-only, where PDD_SIDECAR_TOKEN_FILE says: an engine
    that uses the sidecar's API (metadata, peers, probe) authenticates with it. It opens the
    sidecar's API only, no Kubernetes API."""
    if not sidecar_enabled(pdd.spec):
        return []
    return [{"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True}]


def etcd_namespace(pdd: PDDeployment) -> str:
    return f"/pdd/{pdd.namespace}/{names.instance_id(pdd.name)}"


def sidecar_containers(
    pdd: PDDeployment, role: str, ctx: RenderContext, revision: str
) -> list[dict[str, Any]]:
    spec = pdd.spec
    if not sidecar_enabled(spec):
        return []
    port = ctx.settings.sidecar_port
    return [
        {
            "name": SIDECAR_CONTAINER,
            "image": ctx.settings.sidecar_image,
            "imagePullPolicy": "IfNotPresent",
            "command": [
                "pdd-sidecar",
                "serve",
                "--port",
                str(port),
                "--role",
                role,
                "--deployment",
                names.instance_id(pdd.name),
                "--namespace",
                pdd.namespace,
                "--token-file",
                TOKEN_FILE,
                "--exchange",
                spec.kvTransfer.metadataExchange.mode,
                "--peer-source",
                "k8s",
            ],
            "env": [
                {"name": POD_NAME, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": POD_UID, "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                {"name": POD_IP, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                _prober_env(pdd, role),
                {"name": PDD_REVISION, "value": revision},
                *side_channel_env(ctx.engine(spec), spec),
                # The probe must take the engine's KV path: same UCX settings.
                *transfer_env(spec),
                *engine_env(pdd, port),
            ],
            "ports": [{"name": "sidecar", "containerPort": port, "protocol": "TCP"}],
            "readinessProbe": {
                "httpGet": {"path": "/healthz", "port": "sidecar"},
                "periodSeconds": 10,
            },
            # A probe target holds ~128 MiB of buffers plus ~55 MiB per NIXL worker.
            "resources": {
                "requests": {"cpu": "50m", "memory": "128Mi"},
                "limits": {"memory": "512Mi"},
            },
            "volumeMounts": [
                {"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True},
                {"name": "pdd-env", "mountPath": ENV_DIR, "readOnly": True},
                {"name": "dshm", "mountPath": "/dev/shm"},  # UCX shared-memory lanes
                {"name": SCRATCH_VOLUME, "mountPath": "/tmp"},  # probe logs; root fs read-only
                # The pod's API credential: the sidecar's alone (peer discovery, probe results).
                api_access_mount(),
            ],
            "securityContext": non_root_security_context(read_only_root=True),
        }
    ]


def sidecar_volumes(pdd: PDDeployment) -> list[dict[str, Any]]:
    if not sidecar_enabled(pdd.spec):
        return []
    return [
        {
            "name": TOKEN_VOLUME,
            "secret": {
                "secretName": names.token_secret_name(pdd.name, pdd.uid),
                # Readable by any user: the kubelet writes the files as root, the sidecar
                # runs as 65532 and the engine as its image's user, and no fsGroup is set
                # (it would chown the model's volume too). Only the sidecar and the engine
                # mount it.
                "defaultMode": 0o444,
            },
        },
        {"name": SCRATCH_VOLUME, "emptyDir": {"sizeLimit": "256Mi"}},
        api_access_volume(),
    ]


def side_channel_env(adapter: EngineAdapter, spec: PDDeploymentSpec) -> list[dict[str, Any]]:
    """Which engine side channel the sidecar checks for reachability: its name, its ports,
    and the roles serving it where the contract does not already know them."""
    channel = adapter.side_channel(spec)
    if channel is None:
        return [{"name": PDD_SIDE_CHANNEL, "value": NO_SIDE_CHANNEL}]
    env = [
        {"name": PDD_SIDE_CHANNEL, "value": channel.name},
        {"name": PDD_SIDE_CHANNEL_PORTS, "value": ",".join(str(p) for p in channel.ports)},
    ]
    if SIDE_CHANNEL_SERVED_BY.get(channel.name) != channel.served_by:
        env.append({"name": PDD_SIDE_CHANNEL_ROLES, "value": ",".join(channel.served_by)})
    if channel.rank_ports:
        value = format_rank_ports(channel.rank_ports)
        env.append({"name": PDD_SIDE_CHANNEL_RANK_PORTS, "value": value})
    return env


def render_sidecar_access(pdd: PDDeployment, slices: Sequence[Slice] = ()) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding for peer discovery; `slices`: those beyond the
    home domain this pass runs (their first prefill pods probe too)."""
    if not sidecar_enabled(pdd.spec):
        return []
    account = names.sidecar_account_name(pdd.name)
    rules = [
        # Peers are the deployment's pods (the routers discover the same way).
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        # The prober pods (one, or every prefill rank or slice asked) write their results
        # on themselves only.
        {
            "apiGroups": [""],
            "resources": ["pods"],
            "verbs": ["patch"],
            "resourceNames": _probers(pdd, slices),
        },
    ]
    return render_account(account, pdd.namespace, _meta(pdd, account), rules)


def render_token_secret(pdd: PDDeployment, token: str) -> dict[str, Any]:
    """Created once with a random token (never re-applied: a new token would break peers)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(pdd, names.token_secret_name(pdd.name, pdd.uid)),
        "type": "Opaque",
        "stringData": {TOKEN_KEY: token},
    }


def _meta(pdd: PDDeployment, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": pdd.namespace,
        "labels": names.common_labels(pdd.name, "sidecar"),
        "annotations": {names.ANNOTATION_OWNER_NAME: pdd.name},
    }


def _prober(pdd: PDDeployment) -> str:
    return names.prober_pod_name(pdd.name, pdd.spec.prefill.nodesPerInstance)


def _probers(pdd: PDDeployment, slices: Sequence[Slice]) -> list[str]:
    if per_rank_probes(pdd):
        return [pair.pod for pair in probe_pairs(pdd, slices)] or [_prober(pdd)]
    return [_prober(pdd)]


def _prober_env(pdd: PDDeployment, role: str) -> dict[str, Any]:
    """Which pod answers probe requests. Where instances span nodes every prefill rank may be
    asked, and all ranks share one template: the pod's own name says "this one" (the
    operator asks only the ranks probe_pairs lists, the ones the Role lets patch themselves)."""
    if role == "prefill" and per_rank_probes(pdd):
        return {"name": PDD_PROBER_POD, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    return {"name": PDD_PROBER_POD, "value": _prober(pdd)}


ACCESS_PART = ChildPart(
    "sidecar access", ACCESS_KINDS, lambda pdd, ctx: render_sidecar_access(pdd, ctx.slices)
)
