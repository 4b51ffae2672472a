"""The reference engine's KV stand-in: layout arithmetic, the pattern and its check, and
vLLM's kv_transfer_params (pure functions; no NIXL)."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.engine_parsers import parser_dump
from pdd_operator.engines.version import Version
from pdd_refengine import pattern
from pdd_refengine.kv_params import (
    KvParamsError,
    RemotePrefill,
    parse_remote_prefill,
    protocol_generation,
    wants_remote_decode,
    wants_remote_prefill,
)
from pdd_refengine.layout import DEFAULT_LAYOUT, KvLayout, blocks_for, layout_for


@pytest.mark.parametrize(
    ("model", "override", "bytes_per_token"),
    [
        ("meta-llama/Llama-3.1-70B-Instruct", "", 327_680),
        ("meta-llama/Llama-3.1-8B-Instruct", "", 131_072),
        ("some/unknown-model", "", 256),
        ("some/unknown-model", "layers=80,kv_heads=8,head_dim=128,dtype_bytes=2", 327_680),
        ("meta-llama/Llama-3.1-70B-Instruct", "dtype_bytes=1", 163_840),
    ],
)
def test_bytes_per_token(model: str, override: str, bytes_per_token: int) -> None:
    assert layout_for(model, override).bytes_per_token == bytes_per_token


def test_a_70b_request_of_4096_tokens_is_about_1_34_gb() -> None:
    layout = layout_for("meta-llama/Llama-3.1-70B-Instruct", "")
    assert layout.bytes_per_token * 4096 == 1_342_177_280
    assert blocks_for(4096, 16) == 256


@pytest.mark.parametrize("override", ["layers=0", "heads=8", "layers", "layers=x"])
def test_bad_layout_overrides_are_refused(override: str) -> None:
    with pytest.raises(ValueError):
        layout_for("m", override)


@pytest.mark.parametrize(("tokens", "block", "blocks"), [(1, 16, 1), (16, 16, 1), (17, 16, 2)])
def test_blocks_for(tokens: int, block: int, blocks: int) -> None:
    assert blocks_for(tokens, block) == blocks


@pytest.mark.parametrize(
    ("prompt", "tokens"),
    [("", [0]), ("abcd", [int.from_bytes(b"abcd", "little")]), ("abcde", None), ([5, 6], [5, 6])],
)
def test_tokenize(prompt: str | list[int], tokens: list[int] | None) -> None:
    result = pattern.tokenize(prompt)
    assert result == tokens if tokens is not None else len(result) == 2


def _filled(layout: KvLayout, prompt: str, tokens: int) -> tuple[np.ndarray, bytes]:
    digest = pattern.prompt_digest(pattern.tokenize(prompt))
    region = np.zeros(tokens * layout.bytes_per_token, dtype=np.uint8)
    pattern.fill(region, digest, 0, layout.bytes_per_token)
    return region, digest


def test_the_pattern_verifies_and_depends_on_prompt_and_position() -> None:
    bpt = DEFAULT_LAYOUT.bytes_per_token
    region, digest = _filled(DEFAULT_LAYOUT, "hello world", 3)
    assert pattern.first_mismatch(region, digest, 0, bpt) is None
    other = pattern.prompt_digest(pattern.tokenize("hello there"))
    assert pattern.first_mismatch(region, other, 0, bpt) == 0
    assert pattern.first_mismatch(region[bpt:], digest, 0, bpt) == 0  # token 1 is not token 0
    assert (
        len(set(region.tobytes()[i : i + 8] for i in range(0, len(region), 8))) == len(region) // 8
    )


@pytest.mark.parametrize("offset", [0, 1, 255, 256, 511, 767])
def test_a_flipped_byte_fails_where_it_is(offset: int) -> None:
    bpt = DEFAULT_LAYOUT.bytes_per_token
    region, digest = _filled(DEFAULT_LAYOUT, "hello world", 3)
    region[offset] ^= 0x01
    assert pattern.first_mismatch(region, digest, 0, bpt) == offset


def test_prefill_answer_is_what_nixl_connector_sends_and_parses_back() -> None:
    remote = RemotePrefill((3, 1, 2), "engine-a", "10.0.0.7", 5600, 2)
    params = remote.to_params()
    assert params == {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": [3, 1, 2],
        "remote_engine_id": "engine-a",
        "remote_host": "10.0.0.7",
        "remote_port": 5600,
        "tp_size": 2,
    }
    assert wants_remote_prefill(params) and not wants_remote_decode(params)
    assert parse_remote_prefill(params) == remote


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ([], "JSON object"),
        ({"remote_engine_id": "e", "remote_host": "h", "remote_port": 1}, "remote_block_ids"),
        (
            {"remote_block_ids": [], "remote_engine_id": "e", "remote_host": "h", "remote_port": 1},
            "empty",
        ),
        (
            {
                "remote_block_ids": [1],
                "remote_engine_id": "e",
                "remote_host": "h",
                "remote_port": 0,
            },
            "remote_port",
        ),
        (
            {
                "remote_block_ids": ["x"],
                "remote_engine_id": "e",
                "remote_host": "h",
                "remote_port": 1,
            },
            "kv_transfer_params",
        ),
    ],
)
def test_bad_decode_params_are_refused(params: object, message: str) -> None:
    with pytest.raises(KvParamsError, match=message):
        parse_remote_prefill(params)


def test_the_router_request_asks_for_a_remote_decode() -> None:
    assert wants_remote_decode({"do_remote_decode": True, "do_remote_prefill": False})
    assert not wants_remote_decode(None) and not wants_remote_prefill("x")


# The vLLM release each protocol generation is pinned to: its parser fixture carries the keys
# its NixlConnector's pulling scheduler writes and checks, read from that release's source.
GENERATIONS = {"0.11": Version(0, 11, 0), "0.33": Version(0, 33, 0)}


@pytest.mark.parametrize("generation", sorted(GENERATIONS))
def test_the_prefill_answer_has_every_key_of_that_releases_connector(generation: str) -> None:
    upstream = parser_dump("vllm", GENERATIONS[generation])["nixl_kv_transfer_params"]
    remote = RemotePrefill((3, 1, 2), "engine-a", "10.0.0.7", 5600, 2, "req-1", 40)
    params = remote.to_params(generation)  # type: ignore[arg-type]
    assert sorted(params) == upstream["prefill_answer"]
    parsed = parse_remote_prefill(params, generation)  # type: ignore[arg-type]
    if generation == "0.11":  # it carries neither the request id nor the token count
        remote = RemotePrefill((3, 1, 2), "engine-a", "10.0.0.7", 5600, 2)
    assert parsed == remote


@pytest.mark.parametrize("generation", sorted(GENERATIONS))
def test_the_decode_refuses_an_answer_without_a_key_that_releases_decode_checks(
    generation: str,
) -> None:
    upstream = parser_dump("vllm", GENERATIONS[generation])["nixl_kv_transfer_params"]
    params = RemotePrefill((3,), "engine-a", "10.0.0.7", 5600, 1, "req-1").to_params(
        generation  # type: ignore[arg-type]
    )
    for key in upstream["decode_requires"]:
        without = {k: v for k, v in params.items() if k != key}
        with pytest.raises(KvParamsError, match=key):
            parse_remote_prefill(without, generation)  # type: ignore[arg-type]


def test_a_0_33_decode_refuses_a_0_11_answer() -> None:
    """Flat block ids and no remote_request_id: what a 0.33 decode cannot pull from."""
    old = RemotePrefill((3, 1), "engine-a", "10.0.0.7", 5600, 1).to_params("0.11")
    with pytest.raises(KvParamsError, match="one list per KV cache group"):
        parse_remote_prefill(old, "0.33")


@pytest.mark.parametrize(
    ("tag", "generation"),
    [("vllm-0.33.0", "0.33"), ("vllm-0.34.1", "0.33"), ("vllm-0.11.0", "0.11"), ("0.1.0", "0.11")],
)
def test_the_image_tag_names_the_generation(tag: str, generation: str) -> None:
    assert protocol_generation(tag) == generation
