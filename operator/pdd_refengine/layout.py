"""How many KV bytes one token takes, and how tokens group into blocks.

The reference engine has no model, but the bytes it moves per token are those of the model it
is told to serve, so a transfer is as large as a real engine's: K and V for every layer and KV
head (``layers x kv_heads x head_dim x 2 x dtype_bytes``). Known model ids come from the table;
anything else gets a tiny default, and ``PDD_REFENGINE_KV_LAYOUT`` overrides both.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

LAYOUT_ENV = "PDD_REFENGINE_KV_LAYOUT"


@dataclass(frozen=True)
class KvLayout:
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int

    @property
    def bytes_per_token(self) -> int:
        return self.layers * self.kv_heads * self.head_dim * 2 * self.dtype_bytes  # K and V


# The whole model's KV per token (all tensor-parallel ranks together), bf16.
KNOWN_MODELS: dict[str, KvLayout] = {
    "meta-llama/Llama-3.1-70B-Instruct": KvLayout(80, 8, 128, 2),
    "meta-llama/Llama-3.1-8B-Instruct": KvLayout(32, 8, 128, 2),
    "meta-llama/Llama-3.3-70B-Instruct": KvLayout(80, 8, 128, 2),
    "Qwen/Qwen2.5-7B-Instruct": KvLayout(28, 4, 128, 2),
    "Qwen/Qwen2.5-0.5B-Instruct": KvLayout(24, 2, 64, 2),
}
# Unknown models: 2 layers x 2 heads x 16 x K,V x 2 bytes = 256 B/token, so tests stay small.
DEFAULT_LAYOUT = KvLayout(layers=2, kv_heads=2, head_dim=16, dtype_bytes=2)


def layout_for(model: str, override: str | None = None) -> KvLayout:
    """The model's layout, with ``override`` (the env value) applied field by field."""
    base = KNOWN_MODELS.get(model, DEFAULT_LAYOUT)
    text = os.environ.get(LAYOUT_ENV, "") if override is None else override
    return apply_override(base, text) if text.strip() else base


def apply_override(base: KvLayout, text: str) -> KvLayout:
    """``layers=80,kv_heads=8,head_dim=128,dtype_bytes=2``; fields left out keep ``base``'s."""
    fields: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in KvLayout.__dataclass_fields__:
            raise ValueError(
                f"{LAYOUT_ENV}: {item!r} is not one of layers=, kv_heads=, head_dim=, dtype_bytes="
            )
        number = int(value)
        if number <= 0:
            raise ValueError(f"{LAYOUT_ENV}: {key} must be a positive integer, not {value!r}")
        fields[key] = number
    return replace(base, **fields)


def blocks_for(tokens: int, block_tokens: int) -> int:
    return -(-tokens // block_tokens)
