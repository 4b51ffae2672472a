"""Who this sidecar is and how it is set up (filled from flags and the downward API)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pdd_contract.paths import KV_PATH_FILE
from pdd_contract.ports import SIDECAR_PORT, RankPorts

ROLES = ("prefill", "decode")
DEFAULT_PORT = SIDECAR_PORT  # the port the operator renders (--port)


def other_role(role: str) -> str:
    return "decode" if role == "prefill" else "prefill"


def url_host(host: str) -> str:
    """IPv6 pod IPs need brackets in a URL."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


@dataclass(frozen=True)
class Identity:
    """This pod, as the downward API describes it."""

    deployment: str
    namespace: str
    role: str
    pod_name: str
    pod_uid: str
    pod_ip: str
    # The engine revision (the pod's ``pdd.dev/revision`` label, env PDD_REVISION): a prefill
    # pod only pairs with decode pods of the same one. Empty: pair with any (no filtering).
    revision: str = ""

    def to_json(self) -> dict[str, str]:
        return {
            "deployment": self.deployment,
            "namespace": self.namespace,
            "role": self.role,
            "pod": self.pod_name,
            "pod_uid": self.pod_uid,
            "pod_ip": self.pod_ip,
            "revision": self.revision,
        }


@dataclass(frozen=True)
class EtcdSettings:
    """NIXL's native etcd exchange, as the engine is configured for it."""

    endpoints: tuple[str, ...]
    namespace: str  # NIXL_ETCD_NAMESPACE; NIXL's default is "/nixl/agents/"


@dataclass(frozen=True)
class SidecarConfig:
    identity: Identity
    # The bearer token now (pdd_sidecar.token.TokenFile: read again when its Secret changes).
    token: Callable[[], str] = field(repr=False)
    exchange: str = "sidecar"  # "sidecar" | "etcd"
    host: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    unix_socket: str | None = None
    etcd: EtcdSettings | None = None
    side_channel: str = "none"  # a channel name (pdd_contract.ports) or "none"
    side_channel_ports: tuple[int, ...] = ()
    side_channel_roles: tuple[str, ...] = ()  # empty: what pdd_contract.ports knows
    # The roles whose pods do not all listen on side_channel_ports: their ports per rank.
    side_channel_rank_ports: Mapping[str, RankPorts] = field(default_factory=dict)
    # A peer sidecar that has not answered for this long stops being served (its engine's
    # writes would fail anyway); the K8s source drops a deleted pod at once.
    peer_grace_s: float = 15.0
    # After SIGTERM: keep serving while this pod's engine still has agents published (it
    # drains its requests, which need their peers' metadata), at most this long.
    drain_s: float = 55.0
    poll_timeout_s: float = 20.0  # long-poll length between sidecars
    resync_s: float = 10.0  # re-list the peer source at least this often
    reachability_interval_s: float = 10.0
    connect_timeout_s: float = 2.0
    # This pod answers the operator's probe requests (pdd.dev/probe-request on itself).
    prober: bool = False
    probe_poll_s: float = 5.0
    probe_peer_wait_s: float = 30.0  # a request seen before any peer answered waits this long
    kv_path_file: str = KV_PATH_FILE  # the preflight's check with the engine's devices
