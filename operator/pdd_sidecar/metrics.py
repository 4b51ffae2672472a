"""The sidecar's Prometheus metrics, in a registry owned by one server instance (no globals,
so two sidecars in one test process do not share counters)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE_LATEST", "SidecarMetrics"]


class SidecarMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.transfer_bandwidth = Gauge(
            "pdd_sidecar_transfer_bandwidth_bytes_per_second",
            "KV transfer bandwidth the last probe measured, by direction and memory path.",
            ["src_role", "dst_role", "path"],
            registry=self.registry,
        )
        self.transfer_errors = Counter(
            "pdd_sidecar_transfer_errors_total",
            "Probe transfers that failed or delivered bytes that did not match.",
            ["src_role", "dst_role", "path"],
            registry=self.registry,
        )
        self.metadata_exchange = Histogram(
            "pdd_sidecar_metadata_exchange_seconds",
            "Time to fetch a peer sidecar's published NIXL agent metadata.",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.peers = Gauge(
            "pdd_sidecar_peers",
            "Peer pods with a reachable sidecar, by role.",
            ["role"],
            registry=self.registry,
        )
        self.stale_peer_drops = Counter(
            "pdd_sidecar_stale_peer_drops_total",
            "Peer agents no longer served: pod gone, new pod UID, new metadata, unreachable.",
            ["reason"],
            registry=self.registry,
        )
        self.peer_reachable = Gauge(
            "pdd_sidecar_peer_reachable",
            "1 if the peer's side-channel port accepted a TCP connection at the last check.",
            ["peer", "port"],
            registry=self.registry,
        )
        self.etcd_keys_deleted = Counter(
            "pdd_sidecar_etcd_stale_agent_deletions_total",
            "Departed agents whose NIXL etcd keys this sidecar deleted.",
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
