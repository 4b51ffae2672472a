"""Mode etcd end to end with a real etcd on loopback: engines exchange metadata through NIXL's
own etcd client, and the sidecar deletes a departed agent's keys (which NIXL leaves behind when
killed), so peer engines drop it; a successor that re-used the agent name keeps its keys.

The peer list is a file (the shape of an EndpointSlice) so the test can make a pod disappear.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from nixl_harness import (
    EtcdServer,
    Processes,
    child_env,
    free_port,
    ok,
    sync_until,
    wait_until,
    write_and_verify,
)

pytestmark = pytest.mark.nixl

PREFILL_HOST, DECODE_HOST = "127.0.0.2", "127.0.0.3"
NAMESPACE = "/pdd/test/demo"  # NIXL_ETCD_NAMESPACE, as the operator would render it
AGENT_A = "demo-prefill-0"
NBYTES = 1 << 20


class Cluster:
    """Writes the peer file and starts pods (sidecar + engine) against one etcd."""

    def __init__(self, procs: Processes, etcd: EtcdServer, tmp_path: Path) -> None:
        self.procs, self.etcd = procs, etcd
        self.peer_file = tmp_path / "peers.json"
        self.endpoints: dict[str, dict[str, Any]] = {}
        self.env = child_env(NIXL_ETCD_ENDPOINTS=etcd.url, NIXL_ETCD_NAMESPACE=NAMESPACE)
        self.write_peers()

    def write_peers(self) -> None:
        self.peer_file.write_text(json.dumps(list(self.endpoints.values())))

    def sidecar(self, host: str, port: int, role: str, pod: str, uid: str, resync: str) -> Any:
        self.endpoints[pod] = {"role": role, "host": host, "port": port, "pod": pod, "uid": uid}
        self.write_peers()
        return self.procs.sidecar(
            host=host, port=port, role=role, pod=pod, uid=uid,
            peer_source=f"file:{self.peer_file}", env=self.env,
            extra_args=("--exchange", "etcd", "--etcd-endpoints", self.etcd.url,
                        "--etcd-namespace", NAMESPACE, "--resync-seconds", resync,
                        "--peer-grace-seconds", "2"),
        )  # fmt: skip

    def engine(self, name: str, sidecar: Any, register: bool = True) -> tuple[Any, dict[str, Any]]:
        engine = self.procs.engine(name, self.env)
        token_file = str(self.procs.token_file)
        info = ok(engine.call("init", name=name, nbytes=NBYTES, mode="etcd",
                               sidecar_url=sidecar.url, token_file=token_file))  # fmt: skip
        # NIXL writes to etcd from a worker thread: register once the key exists, so the
        # sidecar's first revision read already sees it.
        wait_until(lambda: self.metadata_revision(name), 15, f"{name}'s metadata in etcd")
        if register:
            ok(engine.call("register"))
        return engine, info

    def remove_pod(self, pod: str) -> None:
        del self.endpoints[pod]
        self.write_peers()

    def keys(self, agent: str) -> dict[str, tuple[bytes, int]]:
        return self.etcd.keys(f"{NAMESPACE}/{agent}/")

    def metadata_revision(self, agent: str) -> int | None:
        entry = self.keys(agent).get(f"{NAMESPACE}/{agent}/metadata")
        return entry[1] if entry else None


def _reported_revision(sidecar: Any, agent: str) -> int | None:
    agents = {a["name"]: a for a in sidecar.get_json("/v1/peers?role=prefill")["agents"]}
    return agents[agent]["etcd_mod_revision"] if agent in agents else None


def test_etcd_mode_cleanup_and_successor(
    procs: Processes, etcd: EtcdServer, tmp_path: Path
) -> None:
    cluster = Cluster(procs, etcd, tmp_path)
    pa, pb = free_port(PREFILL_HOST), free_port(DECODE_HOST)
    sidecar_a = cluster.sidecar(PREFILL_HOST, pa, "prefill", "demo-prefill-0", "uid-a1", "1")
    sidecar_b = cluster.sidecar(DECODE_HOST, pb, "decode", "demo-decode-0", "uid-b1", "1")
    engine_a, info_a = cluster.engine(AGENT_A, sidecar_a)
    engine_b, _ = cluster.engine("demo-decode-0", sidecar_b)

    # The key layout NIXL 1.5.1 uses: {namespace}/{agent}/metadata plus an empty marker key.
    assert set(cluster.keys(AGENT_A)) == {
        f"{NAMESPACE}/{AGENT_A}/",
        f"{NAMESPACE}/{AGENT_A}/metadata",
    }

    # B learns A's name from its sidecar, loads A's metadata through NIXL's etcd client, writes.
    sync_until(engine_b, lambda r: AGENT_A in r[-1]["loaded"], "B to load A from etcd")
    write_and_verify(engine_b, engine_a, info_a, peer=AGENT_A, nbytes=NBYTES, seed=1)
    revision_a1 = cluster.metadata_revision(AGENT_A)
    wait_until(lambda: _reported_revision(sidecar_b, AGENT_A) == revision_a1, 15,
               "A's sidecar to report A's etcd revision")  # fmt: skip

    # Pod A is deleted; its engine was killed, so NIXL never invalidated its keys.
    engine_a.kill()
    sidecar_a.kill()
    assert cluster.keys(AGENT_A), "NIXL removed its keys itself: the cleanup is not under test"
    cluster.remove_pod("demo-prefill-0")
    wait_until(lambda: not cluster.keys(AGENT_A), 20, "B's sidecar to delete A's etcd keys")
    # NIXL in engine B watches the key: the deletion makes it drop A by itself.
    wait_until(lambda: not ok(engine_b.call("check", peer=AGENT_A))["loaded"], 20,
               "engine B's NIXL to drop A after the delete")  # fmt: skip
    reports = sync_until(engine_b, lambda r: AGENT_A not in r[-1]["loaded"], "B to see A removed")
    assert AGENT_A not in reports[-1]["loaded"]
    assert (sidecar_b.metric("pdd_sidecar_etcd_stale_agent_deletions_total") or 0) >= 1
    assert (sidecar_b.metric("pdd_sidecar_stale_peer_drops_total", reason="pod_gone") or 0) >= 1

    # A replacement pod re-uses the agent name; B loads it through etcd and writes to it.
    sidecar_a2 = cluster.sidecar(PREFILL_HOST, pa, "prefill", "demo-prefill-0", "uid-a2", "600")
    engine_a2, info_a2 = cluster.engine(AGENT_A, sidecar_a2)
    loaded = sync_until(
        engine_b,
        lambda r: r[-1]["loaded"].get(AGENT_A, [None, None])[1] == "uid-a2",
        "B to load A2 from etcd",
    )[-1]
    assert loaded["loaded"][AGENT_A][1] == "uid-a2"
    write_and_verify(engine_b, engine_a2, info_a2, peer=AGENT_A, nbytes=NBYTES, seed=2)
    revision_a2 = cluster.metadata_revision(AGENT_A)
    wait_until(lambda: _reported_revision(sidecar_b, AGENT_A) == revision_a2, 15,
               "A2's sidecar to report A2's etcd revision")  # fmt: skip

    # Race: a successor engine re-publishes under the same name before pod A2 is seen gone.
    # Sidecar A2 (resync 600 s) still reports A2's revision; the delete must not happen.
    engine_a2.kill()
    _engine_a3, _ = cluster.engine(AGENT_A, sidecar_a2, register=False)
    # NIXL publishes to etcd from its own thread: the successor's write lands a moment later.
    wait_until(lambda: (cluster.metadata_revision(AGENT_A) or 0) > revision_a2, 15,
               "the successor's metadata in etcd")  # fmt: skip
    revision_a3 = cluster.metadata_revision(AGENT_A)
    sidecar_a2.kill()
    cluster.remove_pod("demo-prefill-0")
    wait_until(lambda: "already gone or re-published" in sidecar_b.log(), 20,
               "B's sidecar to try the guarded delete")  # fmt: skip
    assert cluster.metadata_revision(AGENT_A) == revision_a3, "the successor's keys were deleted"
    assert sidecar_b.metric("pdd_sidecar_etcd_stale_agent_deletions_total") == 1
