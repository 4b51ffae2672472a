"""A pod of an instance over several nodes is checked on the side-channel ports its own rank
listens on (issue 37): the operator renders them, the sidecar reads them from its environment,
and the ports it then dials for a peer of rank r are what the engine started with that rank's
rendered flags listens on, by each release's own rule:

- vLLM up to 0.11.0: one listener per GPU worker, base + dp_rank x tp + tp_rank
  (nixl_connector.py L267-270, L622 in v0.11.0);
- vLLM from 0.11.1 (0.33.0): one per data-parallel engine, base + dp_rank
  (nixl/base_scheduler.py L77-80);
- SGLang: the prefill's bootstrap server, on rank 0 alone (ranks 1 and up run no tokenizer
  manager, which starts it).

The oracle below reads the rank's launched command line (the container's real start shell),
not the adapter's port table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from helpers.multinode import children, engine_container, flag, launched_argv, multinode
from pdd_contract.env import PDD_SIDE_CHANNEL_RANK_PORTS
from pdd_contract.ports import format_rank_ports, parse_rank_ports, ports_of_rank
from pdd_operator.api.v1alpha1 import SIDECAR_CONTAINER
from pdd_sidecar.cli import _parser, build_config
from pdd_sidecar.peers import PeerEndpoint
from pdd_sidecar.reachability import side_channel_for

BASE = 5600
FOUR_NODES = {
    "replicas": 1,
    "gpusPerInstance": 8,
    "nodesPerInstance": 4,
    "parallelism": {"tensor": 2, "data": 16},
}


def vllm_listeners(argv: list[str], release: str) -> tuple[int, ...]:
    """Where vLLM of ``release`` started with ``argv`` listens for the NIXL handshake."""
    start = int(flag(argv, "--data-parallel-start-rank") or 0)
    local = int(flag(argv, "--data-parallel-size-local") or 1)
    tp = int(flag(argv, "--tensor-parallel-size") or 1)
    dp_ranks = range(start, start + local)
    if release == "0.11.0":
        return tuple(BASE + dp * tp + t for dp in dp_ranks for t in range(tp))
    return tuple(BASE + dp for dp in dp_ranks)


def sidecar_env(statefulset: dict[str, Any]) -> dict[str, str]:
    containers = statefulset["spec"]["template"]["spec"]["containers"]
    sidecar = next(c for c in containers if c["name"] == SIDECAR_CONTAINER)
    return {e["name"]: e["value"] for e in sidecar["env"] if "value" in e}


def checked_ports(
    env: dict[str, str], role: str, peer_role: str, rank: int, tmp_path: Path, mp: Any
) -> tuple[int, ...]:
    """What a sidecar of ``role``, started with the rendered env, dials on that peer."""
    for key, value in env.items():
        mp.setenv(key, value)
    token = tmp_path / "token"
    token.write_text("t0ken")
    config = build_config(
        _parser().parse_args(["serve", "--role", role, "--token-file", str(token)])
    )
    channel = side_channel_for(
        config.side_channel,
        role,
        config.side_channel_ports,
        config.side_channel_roles,
        config.side_channel_rank_ports,
    )
    assert channel is not None and peer_role in channel.target_roles
    return channel.ports_of(PeerEndpoint(peer_role, "10.0.0.9", 8099, pod_index=rank))


@pytest.mark.parametrize("release", ["0.11.0", "0.33.0"])
@pytest.mark.parametrize("rank", [0, 1, 3])
def test_the_sidecar_checks_the_ports_each_vllm_rank_listens_on(
    release: str, rank: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = {"type": "vllm", "image": f"vllm/vllm-openai:v{release}"}
    objs = children(multinode(engine=engine, prefill=FOUR_NODES))
    prefill = objs[("StatefulSet", "llama-prefill-0")]
    argv = launched_argv(engine_container(prefill), rank, tmp_path)
    decode = objs[("StatefulSet", "llama-decode-0")]  # a decode pod checks its prefill peers
    seen = checked_ports(sidecar_env(decode), "decode", "prefill", rank, tmp_path, monkeypatch)
    assert seen == vllm_listeners(argv, release)
    assert len(seen) == (8 if release == "0.11.0" else 4)  # 16 DP ranks over 4 nodes


@pytest.mark.parametrize(("rank", "expected"), [(0, (8998,)), (1, ())])
def test_only_an_sglang_instances_first_rank_is_checked_for_its_bootstrap_port(
    rank: int, expected: tuple[int, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = {"replicas": 1, "gpusPerInstance": 8, "nodesPerInstance": 2}
    engine = {"type": "sglang", "image": "lmsysorg/sglang:v0.5.23"}
    decode = children(multinode("sglang", engine=engine, prefill=layout))[
        ("StatefulSet", "llama-decode-0")
    ]
    env = sidecar_env(decode)
    assert checked_ports(env, "decode", "prefill", rank, tmp_path, monkeypatch) == expected


def test_single_node_deployments_render_no_rank_ports() -> None:
    """Nothing new in their pods' environment: an upgrade of the operator rolls none of them."""
    for engine in ("vllm", "sglang"):
        objs = children(multinode(engine, prefill={"replicas": 2, "gpusPerInstance": 8},
                                  decode={"replicas": 2, "gpusPerInstance": 8}))  # fmt: skip
        env = sidecar_env(objs[("StatefulSet", "llama-decode")])
        assert PDD_SIDE_CHANNEL_RANK_PORTS not in env


def test_rank_ports_round_trip_and_pick_a_pod() -> None:
    table = {"prefill": ((5600, 5601), (5602, 5603)), "decode": ((5600,),)}
    text = format_rank_ports(table)
    assert parse_rank_ports(text) == table
    assert ports_of_rank(table["prefill"], 1) == (5602, 5603)
    assert ports_of_rank(table["prefill"], 2) == ()  # beyond the instance: serves nothing
    assert ports_of_rank(table["prefill"], None) == (5600, 5601)  # unknown: rank 0
    assert ports_of_rank(table["decode"], 5) == (5600,)  # one entry: replicas, not ranks


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("5600,5601", "not JSON"),
        ("[[5600]]", "object of roles"),
        ('{"prefill": [5600]}', "list of port lists"),
        ('{"prefill": [[70000]]}', "1 to 65535"),
    ],
)
def test_malformed_rank_ports_are_refused_with_what_is_wrong(
    value: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match=message):
        parse_rank_ports(value)
    monkeypatch.setenv(PDD_SIDE_CHANNEL_RANK_PORTS, value)
    token = tmp_path / "token"
    token.write_text("t0ken")
    argv = ["serve", "--role", "decode", "--token-file", str(token), "--side-channel", "vllm"]
    with pytest.raises(SystemExit, match="--side-channel-rank-ports"):
        build_config(_parser().parse_args(argv))


def test_rank_ports_for_a_role_that_does_not_serve_the_channel_are_refused() -> None:
    with pytest.raises(ValueError, match="decode, which does not serve it"):
        side_channel_for("sglang", "prefill", (8998,), (), {"decode": ((8998,), ())})
