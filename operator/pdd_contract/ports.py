"""The engines' NIXL side-channel ports: the operator renders them, opens them in the
NetworkPolicy and tells the sidecar, which checks that peers can reach them.

vLLM's NixlConnector listens for the metadata handshake on VLLM_NIXL_SIDE_CHANNEL_PORT plus the
data-parallel rank; SGLang's prefill side serves it on its disaggregation bootstrap port.
"""

from __future__ import annotations

VLLM_SIDE_CHANNEL_BASE_PORT = 5600
SGLANG_BOOTSTRAP_PORT = 8998


def vllm_side_channel_ports(
    dp_size: int, base: int = VLLM_SIDE_CHANNEL_BASE_PORT
) -> tuple[int, ...]:
    """One port per data-parallel rank: base, base + 1, ..."""
    return tuple(base + rank for rank in range(dp_size))
