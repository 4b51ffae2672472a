"""The engines' NIXL side channels: the operator renders them, opens them in the
NetworkPolicy and tells the sidecar, which checks that peers can reach them.

vLLM's NixlConnector listens for the metadata handshake on VLLM_NIXL_SIDE_CHANNEL_PORT plus the
data-parallel rank, in prefill and decode pods alike; SGLang's prefill side serves it on its
disaggregation bootstrap port and the decode side connects. The operator sets the channel's
name (env.PDD_SIDE_CHANNEL) and ports (env.PDD_SIDE_CHANNEL_PORTS); the roles that serve a
channel named here are known to both sides, any other channel names them in
env.PDD_SIDE_CHANNEL_ROLES.
"""

from __future__ import annotations

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


# Where the ranks of an instance over several nodes meet on its leader: vLLM's
# --data-parallel-rpc-port, SGLang's --dist-init-addr port (torch.distributed's store).
MULTINODE_RENDEZVOUS_PORT = 29550
