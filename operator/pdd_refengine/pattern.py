"""The stand-in for computed KV: a pattern derived from the prompt, and its check.

Token ``t`` of a prompt owns ``bytes_per_token`` bytes. Its content is 64-bit words
``seed(prompt, t) + i x φ`` (φ the golden-ratio constant, wrapping), so every word of every
token differs and a single flipped, lost or misplaced byte fails the comparison, while filling
a gigabyte stays a few vectorised numpy operations.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

_PHI = np.uint64(0x9E3779B97F4A7C15)
# Prompts are cut into tokens of this many UTF-8 bytes: no tokenizer, but a prompt's token count
# grows with its length the way a real one roughly does (about 4 bytes per token in English).
BYTES_PER_TEXT_TOKEN = 4


def tokenize(prompt: str | Sequence[int]) -> list[int]:
    """Token ids: given ids as they are, text as 4-byte little-endian chunks (at least one)."""
    if not isinstance(prompt, str):
        return [int(t) for t in prompt] or [0]
    data = prompt.encode()
    chunks = [data[i : i + BYTES_PER_TEXT_TOKEN] for i in range(0, len(data), 4)]
    return [int.from_bytes(c, "little") for c in chunks] or [0]


def prompt_digest(tokens: Sequence[int]) -> bytes:
    digest = hashlib.blake2b(digest_size=16)
    for token in tokens:
        digest.update(int(token).to_bytes(8, "little", signed=True))
    return digest.digest()


def token_seed(digest: bytes, token_index: int) -> int:
    material = hashlib.blake2b(digest + token_index.to_bytes(8, "little"), digest_size=8)
    return int.from_bytes(material.digest(), "little")


def token_kv(digest: bytes, token_index: int, nbytes: int) -> np.ndarray:
    """The ``nbytes`` bytes of token ``token_index``'s KV."""
    words = -(-nbytes // 8)
    with np.errstate(over="ignore"):
        values = np.arange(words, dtype=np.uint64) * _PHI + np.uint64(
            token_seed(digest, token_index)
        )
    return values.view(np.uint8)[:nbytes]


def fill(target: np.ndarray, digest: bytes, first_token: int, bytes_per_token: int) -> None:
    """Write consecutive tokens' KV into ``target`` (a whole number of tokens)."""
    for k in range(len(target) // bytes_per_token):
        start = k * bytes_per_token
        target[start : start + bytes_per_token] = token_kv(digest, first_token + k, bytes_per_token)


def first_mismatch(
    actual: np.ndarray, digest: bytes, first_token: int, bytes_per_token: int
) -> int | None:
    """Offset of the first byte of ``actual`` that differs from the pattern, or None."""
    for k in range(len(actual) // bytes_per_token):
        start = k * bytes_per_token
        expected = token_kv(digest, first_token + k, bytes_per_token)
        differs = np.flatnonzero(actual[start : start + bytes_per_token] != expected)
        if differs.size:
            return start + int(differs[0])
    return None
