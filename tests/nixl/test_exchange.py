"""Mode sidecar end to end: two engines (real NIXL agents in their own processes) find each
other through two sidecars on different loopback addresses, move DRAM bytes with a NIXL WRITE,
and survive the prefill pod being replaced without ever touching the predecessor's memory."""

from __future__ import annotations

import hashlib
import json
import signal
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from nixl_harness import (
    TOKEN,
    Processes,
    SidecarProcess,
    free_port,
    http,
    ok,
    sync_until,
    wait_until,
    write_and_verify,
)

pytestmark = pytest.mark.nixl

PREFILL_HOST, DECODE_HOST = "127.0.0.2", "127.0.0.3"
AGENT_A = "demo-prefill-0"
NBYTES = 4 << 20


def _static(prefill_port: int, decode_port: int) -> str:
    return f"static:prefill={PREFILL_HOST}:{prefill_port},decode={DECODE_HOST}:{decode_port}"


def _start_prefill(procs: Processes, port: int, source: str, uid: str) -> tuple[Any, Any, Any]:
    sidecar = procs.sidecar(
        host=PREFILL_HOST, port=port, role="prefill", pod="demo-prefill-0", uid=uid,
        peer_source=source, extra_args=("--peer-grace-seconds", "2"),
    )  # fmt: skip
    engine = procs.engine(f"{AGENT_A}-{uid}")
    info = ok(engine.call("init", name=AGENT_A, nbytes=NBYTES, mode="sidecar",
                           sidecar_url=sidecar.url, token_file=str(procs.token_file)))  # fmt: skip
    return sidecar, engine, info


def _start_decode(procs: Processes, port: int, source: str, grace_s: float) -> tuple[Any, Any]:
    sidecar = procs.sidecar(
        host=DECODE_HOST, port=port, role="decode", pod="demo-decode-0", uid="uid-b1",
        peer_source=source, extra_args=("--peer-grace-seconds", str(grace_s)),
    )  # fmt: skip
    engine = procs.engine("demo-decode-0")
    ok(engine.call("init", name="demo-decode-0", nbytes=NBYTES, mode="sidecar",
                    sidecar_url=sidecar.url, token_file=str(procs.token_file)))  # fmt: skip
    return sidecar, engine


def _pair(
    procs: Processes, pa: int, pb: int, source: str, decode_args: tuple[str, ...] = ()
) -> tuple[SidecarProcess, SidecarProcess]:
    """A prefill pod's sidecar (p0) and a decode pod's (d0, with `decode_args`), on ports
    `pa` and `pb`."""
    sidecar_a = procs.sidecar(host=PREFILL_HOST, port=pa, role="prefill", pod="p0", uid="ua",
                              peer_source=source)  # fmt: skip
    sidecar_b = procs.sidecar(host=DECODE_HOST, port=pb, role="decode", pod="d0", uid="ub",
                              peer_source=source, extra_args=decode_args)  # fmt: skip
    return sidecar_a, sidecar_b


def _served_sha(sidecar: SidecarProcess, agent: str) -> str | None:
    status, body, headers = http("GET", f"{sidecar.url}/v1/agents/{agent}")
    if status == 404:
        return None
    assert status == 200, body
    assert hashlib.sha256(body).hexdigest() == headers["X-PDD-Metadata-SHA256"]
    return headers["X-PDD-Metadata-SHA256"]


def test_exchange_write_and_replacement(procs: Processes) -> None:
    pa, pb = free_port(PREFILL_HOST), free_port(DECODE_HOST)
    source = _static(pa, pb)
    sidecar_a, engine_a, info_a1 = _start_prefill(procs, pa, source, "uid-a1")
    sidecar_b, engine_b = _start_decode(procs, pb, source, grace_s=2)

    # B looks A up through its own sidecar and writes into A's registered DRAM.
    sync_until(engine_b, lambda r: AGENT_A in r[-1]["loaded"], "B to load A's metadata")
    assert _served_sha(sidecar_b, AGENT_A) == info_a1["sha256"]
    write_and_verify(engine_b, engine_a, info_a1, peer=AGENT_A, nbytes=NBYTES, seed=1)
    peers = sidecar_b.get_json("/v1/peers?role=prefill")
    assert [(a["name"], a["pod"], a["pod_uid"]) for a in peers["agents"]] == [
        (AGENT_A, "demo-prefill-0", "uid-a1")
    ]

    # The prefill pod dies (engine and sidecar killed, nothing cleaned up).
    engine_a.kill()
    sidecar_a.kill()
    reports = sync_until(engine_b, lambda r: r[-1]["removed"], "B to see A removed")
    assert reports[-1]["removed"] == [AGENT_A] and AGENT_A not in reports[-1]["loaded"]
    assert _served_sha(sidecar_b, AGENT_A) is None, "a dead pod's metadata is still served"
    assert (sidecar_b.metric("pdd_sidecar_stale_peer_drops_total", reason="unreachable") or 0) >= 1

    # Its replacement: same pod name, same agent name, new pod UID and new agent metadata.
    _, engine_a2, info_a2 = _start_prefill(procs, pa, source, "uid-a2")
    assert info_a2["sha256"] != info_a1["sha256"]
    sync_until(engine_b, lambda r: AGENT_A in r[-1]["loaded"], "B to load A2's metadata")
    assert ok(engine_b.call("sync"))["loaded"][AGENT_A][1] == "uid-a2"
    assert _served_sha(sidecar_b, AGENT_A) == info_a2["sha256"]
    write_and_verify(engine_b, engine_a2, info_a2, peer=AGENT_A, nbytes=NBYTES, seed=2)


def test_replacement_within_grace_reports_old_identity_removed(procs: Processes) -> None:
    """A pod replaced faster than the grace period: one watch answer removes the old identity
    and adds the new one, and the engine reloads before its next transfer."""
    pa, pb = free_port(PREFILL_HOST), free_port(DECODE_HOST)
    source = _static(pa, pb)
    sidecar_a, engine_a, _ = _start_prefill(procs, pa, source, "uid-a1")
    # A long grace: the replacement must be seen as a UID change, not as a pod going away.
    sidecar_b, engine_b = _start_decode(procs, pb, source, grace_s=60)
    first = sync_until(engine_b, lambda r: AGENT_A in r[-1]["loaded"], "B to load A")
    version = first[-1]["version"]

    engine_a.kill()
    sidecar_a.kill()
    _, engine_a2, info_a2 = _start_prefill(procs, pa, source, "uid-a2")

    # The new sidecar may answer before its engine has published, so the removal can come one
    # watch answer before the addition; never may the addition come without the removal.
    removed, added = _watch_until_added(sidecar_b, version)
    assert removed == [(AGENT_A, "uid-a1")]
    assert added == [(AGENT_A, "uid-a2")]
    report = sync_until(engine_b, lambda r: r[-1]["added"], "B to reload A")[-1]
    assert report["removed"] == [AGENT_A] and report["added"] == [AGENT_A]
    assert report["loaded"][AGENT_A][1] == "uid-a2"
    write_and_verify(engine_b, engine_a2, info_a2, peer=AGENT_A, nbytes=NBYTES, seed=3)
    assert (sidecar_b.metric("pdd_sidecar_stale_peer_drops_total", reason="uid_changed") or 0) >= 1


def _watch_until_added(
    sidecar: SidecarProcess, since: int
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Follow ``/v1/peers/watch`` from ``since`` until an agent is added; returns every
    (name, pod UID) removed and added on the way."""
    removed: list[tuple[str, str]] = []
    added: list[tuple[str, str]] = []
    for _ in range(10):
        url = f"{sidecar.url}/v1/peers/watch?since={since}&wait_s=20"
        watch = json.loads(http("GET", url, timeout=30)[1])
        assert not watch["resync"], watch
        removed += [(r["name"], r["pod_uid"]) for r in watch["removed"]]
        added += [(r["name"], r["pod_uid"]) for r in watch["added"]]
        since = watch["version"]
        if added:
            return removed, added
    raise AssertionError(f"no agent added after 10 watch answers; removed {removed}")


def test_requests_need_the_token(procs: Processes) -> None:
    port = free_port(PREFILL_HOST)
    sidecar = procs.sidecar(host=PREFILL_HOST, port=port, role="prefill", pod="p", uid="u",
                            peer_source=f"static:prefill={PREFILL_HOST}:{port}")  # fmt: skip
    assert http("GET", f"{sidecar.url}/healthz", token=None)[0] == 200
    for method, path, body in [
        ("GET", "/v1/peers", None),
        ("GET", "/v1/peers/watch?since=0&wait_s=0", None),
        ("PUT", "/v1/agents/x", b"metadata"),
        ("GET", "/v1/agents/x", None),
        ("GET", "/v1/local/agents", None),
        ("GET", "/v1/status", None),
        ("GET", "/metrics", None),
        ("POST", "/v1/probe", b"{}"),
    ]:
        for token in (None, "wrong-token", TOKEN + "x"):
            status, _, headers = http(method, f"{sidecar.url}{path}", token=token, body=body)
            assert status == 401, (method, path, token)
            assert headers.get("WWW-Authenticate") == "Bearer"
    assert http("PUT", f"{sidecar.url}/v1/agents/x", body=b"metadata")[0] == 200
    assert TOKEN not in sidecar.log()


def test_a_new_token_in_the_file_is_served_without_a_restart(procs: Processes) -> None:
    """The operator creates a deleted token Secret again with a new token and the kubelet
    rewrites the volume: the running sidecar takes the new token and refuses the old one."""
    port = free_port(PREFILL_HOST)
    sidecar = procs.sidecar(host=PREFILL_HOST, port=port, role="prefill", pod="p", uid="u",
                            peer_source=f"static:prefill={PREFILL_HOST}:{port}")  # fmt: skip
    assert http("GET", f"{sidecar.url}/v1/peers", token=TOKEN)[0] == 200
    procs.token_file.write_text("the-new-token\n")
    assert http("GET", f"{sidecar.url}/v1/peers", token="the-new-token")[0] == 200
    assert http("GET", f"{sidecar.url}/v1/peers", token=TOKEN)[0] == 401


def test_ttl_expiry_unpublishes_a_dead_engines_metadata(procs: Processes) -> None:
    """The engine crashed but its pod (and sidecar) live on: without heartbeats its metadata
    expires and peers see the agent removed, while a heartbeat-free agent without TTL stays."""
    pa, pb = free_port(PREFILL_HOST), free_port(DECODE_HOST)
    source = _static(pa, pb)
    sidecar_a, sidecar_b = _pair(procs, pa, pb, source)
    assert http("PUT", f"{sidecar_a.url}/v1/agents/steady", body=b"md1")[0] == 200

    def names() -> list[str]:
        return [a["name"] for a in sidecar_b.get_json("/v1/peers")["agents"]]

    wait_until(lambda: names() == ["steady"], 15, "B to see the steady agent")
    version = sidecar_b.get_json("/v1/peers")["version"]
    ttl = {"X-PDD-TTL-Seconds": "1.5"}
    assert http("PUT", f"{sidecar_a.url}/v1/agents/crashy", body=b"md2", headers=ttl)[0] == 200
    wait_until(lambda: names() == ["crashy", "steady"], 15, "B to see the TTL'd agent")
    wait_until(lambda: names() == ["steady"], 15, "the TTL'd agent to expire")
    watch = sidecar_b.get_json(f"/v1/peers/watch?since={version}&wait_s=0")
    assert watch["added"] == [] and watch["removed"] == []  # net effect since: nothing
    assert (sidecar_b.metric("pdd_sidecar_stale_peer_drops_total", reason="unpublished") or 0) >= 1


def test_side_channel_reachability(procs: Processes) -> None:
    pa, pb = free_port(PREFILL_HOST), free_port(DECODE_HOST)
    source = _static(pa, pb)
    with socket.socket() as listener:
        listener.bind((PREFILL_HOST, 0))
        listener.listen()
        open_port = listener.getsockname()[1]
        closed_port = free_port(PREFILL_HOST)
        procs.sidecar(host=PREFILL_HOST, port=pa, role="prefill", pod="p0", uid="ua",
                      peer_source=source)  # fmt: skip
        sidecar_b = procs.sidecar(
            host=DECODE_HOST, port=pb, role="decode", pod="d0", uid="ub", peer_source=source,
            extra_args=("--side-channel", "vllm",
                        "--side-channel-ports", f"{open_port},{closed_port}",
                        "--reachability-interval-seconds", "0.5"),
        )  # fmt: skip

        def checks() -> dict[int, bool]:
            rows = sidecar_b.get_json("/v1/status")["side_channel"]
            return {row["port"]: row["reachable"] for row in rows if row["pod"] == "p0"}

        wait_until(lambda: len(checks()) == 2, 15, "both side-channel ports to be checked")
        assert checks() == {open_port: True, closed_port: False}
        assert sidecar_b.metric("pdd_sidecar_peer_reachable", peer="p0", port=str(open_port)) == 1
        reachable = sidecar_b.metric("pdd_sidecar_peer_reachable", peer="p0", port=str(closed_port))
        assert reachable == 0


def test_unix_socket_and_client(procs: Processes) -> None:
    """The engine-side client over the sidecar's Unix socket: publish, fetch, peers, watch."""
    from pdd_sidecar.client import SidecarClient, SidecarError

    port = free_port(PREFILL_HOST)
    socket_path = procs.tmp_path / "sidecar.sock"
    procs.sidecar(
        host=PREFILL_HOST, port=port, role="prefill", pod="p0", uid="ua",
        peer_source=f"static:prefill={PREFILL_HOST}:{port}",
        extra_args=("--unix-socket", str(socket_path)),
    )  # fmt: skip
    client = SidecarClient(f"unix://{socket_path}", TOKEN)
    published = client.publish("engine-0", b"\x00metadata\xff")
    assert published["sha256"] == hashlib.sha256(b"\x00metadata\xff").hexdigest()
    assert client.fetch("engine-0") == b"\x00metadata\xff"
    with pytest.raises(SidecarError) as refused:
        SidecarClient(f"unix://{socket_path}", "wrong").fetch("engine-0")
    assert refused.value.status == 401
    with pytest.raises(SidecarError) as missing:
        client.fetch("nobody")
    assert missing.value.status == 404
    first = client.watch(0, wait_s=0)
    assert first["resync"] and first["added"] == []
    assert client.peers()["agents"] == []
    assert client.status()["local_agents"][0]["name"] == "engine-0"


def test_after_sigterm_the_sidecar_serves_until_its_engine_has_unpublished(
    procs: Processes,
) -> None:
    """A pod's containers all get SIGTERM at once, and the engine drains: the requests it
    still serves load their peers' metadata from this sidecar. So the sidecar serves on while
    its engine has agents published, and stops once they are unpublished."""
    pa, pb = free_port(PREFILL_HOST), free_port(DECODE_HOST)
    source = _static(pa, pb)
    # The product's drain limit, not the harness's short one: the stop must come from the
    # unpublish, not from the limit.
    sidecar_a, sidecar_b = _pair(procs, pa, pb, source, ("--drain-seconds", "55"))
    assert http("PUT", f"{sidecar_a.url}/v1/agents/peer", body=b"md-a")[0] == 200
    assert http("PUT", f"{sidecar_b.url}/v1/agents/mine", body=b"md-b")[0] == 200
    wait_until(lambda: http("GET", f"{sidecar_b.url}/v1/agents/peer")[0] == 200, 15, "B to see A")

    sidecar_b.proc.send_signal(signal.SIGTERM)
    time.sleep(1.5)
    assert sidecar_b.proc.poll() is None, "stopped while its engine still had an agent"
    status, body, _ = http("GET", f"{sidecar_b.url}/v1/agents/peer")
    assert (status, body) == (200, b"md-a")  # the draining engine still gets its peers

    assert http("DELETE", f"{sidecar_b.url}/v1/agents/mine")[0] in (200, 204)
    sidecar_b.proc.wait(timeout=10)


def test_after_sigterm_a_sidecar_without_agents_stops_at_once(procs: Processes) -> None:
    pa, pb = free_port(PREFILL_HOST), free_port(DECODE_HOST)
    sidecar = procs.sidecar(host=PREFILL_HOST, port=pa, role="prefill", pod="p0", uid="ua",
                            peer_source=_static(pa, pb))  # fmt: skip
    sidecar.proc.send_signal(signal.SIGTERM)
    sidecar.proc.wait(timeout=5)


def test_a_terminating_peer_is_served_until_its_engine_unpublishes(
    procs: Processes, tmp_path: Path
) -> None:
    """A deleted pod's engine drains: the decodes reading the KV of the requests it took still
    need its metadata. Its peers serve it on while it answers, and drop it once its engine
    unpublishes (as it stops)."""
    pa, pb = free_port(PREFILL_HOST), free_port(DECODE_HOST)
    peers = tmp_path / "peers.json"
    pods = [
        {"role": "prefill", "host": PREFILL_HOST, "port": pa, "pod": "p0", "uid": "ua"},
        {"role": "decode", "host": DECODE_HOST, "port": pb, "pod": "d0", "uid": "ub"},
    ]
    peers.write_text(json.dumps(pods))
    source = f"file:{peers}"
    sidecar_a, sidecar_b = _pair(procs, pa, pb, source)
    assert http("PUT", f"{sidecar_a.url}/v1/agents/draining", body=b"md-a")[0] == 200

    def served() -> int:
        return http("GET", f"{sidecar_b.url}/v1/agents/draining")[0]

    wait_until(lambda: served() == 200, 15, "B to serve A's agent")
    pods[0]["terminating"] = True
    peers.write_text(json.dumps(pods))
    wait_until(lambda: sidecar_b.get_json("/v1/peers")["pods"][0]["terminating"], 15, "B to see it")
    assert served() == 200  # still served: A's engine is draining

    assert http("DELETE", f"{sidecar_a.url}/v1/agents/draining")[0] in (200, 204)
    wait_until(lambda: served() == 404, 15, "A's agent to leave B's view")
