"""The engines' NIXL side channels: the operator renders them, opens them in the
NetworkPolicy and tells the sidecar, which checks that peers can reach them.

vLLM's NixlConnector listens for the metadata handshake on VLLM_NIXL_SIDE_CHANNEL_PORT plus the
data-parallel rank, in prefill and decode pods alike; SGLang's prefill side serves it on its
disaggregation bootstrap port and the decode side connects. The operator sets the channel's
name (env.PDD_SIDE_CHANNEL) and ports (env.PDD_SIDE_CHANNEL_PORTS); the roles that serve a
channel named here are known to both sides, any other channel names them in
env.PDD_SIDE_CHANNEL_ROLES. Where a role's pods do not all listen on those ports (an instance
over several nodes: vLLM's rank-r pod serves the ports of its own data-parallel ranks, SGLang's
bootstrap server runs on rank 0 alone), env.PDD_SIDE_CHANNEL_RANK_PORTS gives that role's
ports per rank (``format_rank_ports``): the peer's pod index is its rank.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType

VLLM_SIDE_CHANNEL_BASE_PORT = 5600
# The NIXL sidecar's port in every engine pod the operator renders (it shares the pod's
# network with the engine, so the engine must not listen there).
SIDECAR_PORT = 8099
SGLANG_BOOTSTRAP_PORT = 8998

VLLM_SIDE_CHANNEL = "vllm"
SGLANG_SIDE_CHANNEL = "sglang"
NO_SIDE_CHANNEL = "none"

# Side channel -> the roles whose pods listen on it.
SIDE_CHANNEL_SERVED_BY: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        VLLM_SIDE_CHANNEL: ("prefill", "decode"),
        SGLANG_SIDE_CHANNEL: ("prefill",),
    }
)


def vllm_side_channel_ports(
    dp_size: int, base: int = VLLM_SIDE_CHANNEL_BASE_PORT
) -> tuple[int, ...]:
    """One port per data-parallel rank: base, base + 1, ..."""
    return tuple(base + rank for rank in range(dp_size))


def default_side_channel_ports(channel: str, dp_size: int = 1) -> tuple[int, ...]:
    """The ports a sidecar started without PDD_SIDE_CHANNEL_PORTS checks (the operator always
    sets them): the engines' defaults, none for a channel this module does not name."""
    if channel == VLLM_SIDE_CHANNEL:
        return vllm_side_channel_ports(dp_size)
    if channel == SGLANG_SIDE_CHANNEL:
        return (SGLANG_BOOTSTRAP_PORT,)
    return ()


# A role's side-channel ports by rank: entry r is what the instance's rank-r pod listens on.
RankPorts = tuple[tuple[int, ...], ...]


def format_rank_ports(by_role: Mapping[str, RankPorts]) -> str:
    """PDD_SIDE_CHANNEL_RANK_PORTS's value: ``{"prefill": [[5600], [5601]]}`` (JSON, roles
    sorted, so an unchanged deployment renders the same text)."""
    document = {role: [list(ports) for ports in by_role[role]] for role in sorted(by_role)}
    return json.dumps(document, separators=(",", ":"))


def parse_rank_ports(value: str) -> dict[str, RankPorts]:
    """The inverse of ``format_rank_ports``; ValueError, saying what is wrong, for anything
    else."""
    try:
        document = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg})") from None
    if not isinstance(document, dict):
        raise ValueError('expected an object of roles, e.g. {"prefill": [[5600], [5601]]}')
    return {str(role): _rank_list(role, ranks) for role, ranks in document.items()}


def _rank_list(role: object, ranks: object) -> RankPorts:
    if not isinstance(ranks, list) or not all(isinstance(r, list) for r in ranks):
        raise ValueError(f"{role}: expected a list of port lists, one per rank")
    if not all(isinstance(p, int) and 0 < p < 65536 for rank in ranks for p in rank):
        raise ValueError(f"{role}: ports are whole numbers from 1 to 65535")
    return tuple(tuple(rank) for rank in ranks)


def ports_of_rank(rank_ports: RankPorts, pod_index: int | None) -> tuple[int, ...]:
    """What a pod listens on. One entry: every pod of the role (its instances are one pod
    each, so the pod index counts replicas, not ranks). Several: the pod index is the rank,
    and a rank beyond the list serves nothing; a pod whose index is not known (a static peer
    list) is taken for rank 0."""
    if len(rank_ports) == 1:
        return rank_ports[0]
    index = pod_index or 0
    return rank_ports[index] if 0 <= index < len(rank_ports) else ()


# Where the ranks of an instance over several nodes meet on its leader: vLLM's
# --data-parallel-rpc-port, SGLang's --dist-init-addr port (torch.distributed's store).
MULTINODE_RENDEZVOUS_PORT = 29550
