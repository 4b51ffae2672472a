"""The reference engine (a test double of vLLM/SGLang) parses exactly the engine command lines
the operator's adapters render: a change in rendering that it cannot serve fails here."""

from __future__ import annotations

import pytest

from helpers.factories import make_pdd
from pdd_operator.engines.registry import ENGINES
from pdd_refengine.cli import DEFAULT_REGION_BYTES, MIN_BLOCKS, UsageError, parse_args

IMAGES = {
    "vllm": "vllm/vllm-openai:v0.33.0",
    "vllm-0.11.0": "vllm/vllm-openai:v0.11.0",
    "sglang": "lmsysorg/sglang:v0.5.23",
    "sglang-0.5.4": "lmsysorg/sglang:v0.5.4",
}


def rendered(engine: str, role: str, **spec: object) -> list[str]:
    """What the engine container runs, as the image sees it: the shim names the engine."""
    engine_type = engine.split("-")[0]
    patch = {
        "engine": {"type": engine_type, "image": IMAGES[engine]},
        "model": {"name": "meta-llama/Llama-3.1-70B-Instruct", "servedName": "llama"},
        **spec,
    }
    launch = ENGINES[engine_type].launch(make_pdd(patch).spec, role)
    argv = [*launch.command, *launch.args]
    if engine_type == "vllm":
        return argv  # `vllm serve ...`: image/bin/vllm passes "vllm" first
    if argv[:2] == ["sglang", "serve"]:  # 0.5.5 and later: image/bin/sglang
        return ["sglang", *argv[2:]]
    assert argv[:3] == ["python3", "-m", "sglang.launch_server"]  # image/python/sglang
    return ["sglang", *argv[3:]]


@pytest.mark.parametrize(
    ("engine", "role", "expect_role", "block_tokens", "bootstrap"),
    [
        ("vllm", "prefill", "prefill", 16, None),
        ("vllm", "decode", "decode", 16, None),
        ("vllm-0.11.0", "prefill", "prefill", 16, None),
        ("vllm-0.11.0", "decode", "decode", 16, None),
        ("sglang", "prefill", "prefill", 1, 8998),
        ("sglang", "decode", "decode", 1, 8998),
        ("sglang-0.5.4", "prefill", "prefill", 1, 8998),
        ("sglang-0.5.4", "decode", "decode", 1, 8998),
    ],
)
def test_rendered_command_lines_parse(
    engine: str, role: str, expect_role: str, block_tokens: int, bootstrap: int | None
) -> None:
    config = parse_args(rendered(engine, role), environ={})
    expected = (engine.split("-")[0], expect_role, block_tokens)
    assert (config.engine, config.role, config.block_tokens) == expected
    assert config.model == "meta-llama/Llama-3.1-70B-Instruct"
    assert config.served_name == "llama"
    assert (config.host, config.port) == ("0.0.0.0", 8000)
    assert config.bootstrap_port == bootstrap
    assert config.ignored == ()
    assert (config.region_bytes, config.memory) == (DEFAULT_REGION_BYTES, "DRAM")


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_block_size_and_user_args(engine: str) -> None:
    argv = rendered(engine, "decode")
    argv += [
        "--block-size" if engine == "vllm" else "--page-size",
        "32",
        "--max-model-len",
        "4096",
        "--enforce-eager",
    ]
    config = parse_args(argv, environ={})
    assert config.block_tokens == 32
    assert config.max_model_len == 4096
    assert config.ignored == ("--enforce-eager",)


def test_tensor_parallel_size_follows_the_spec() -> None:
    config = parse_args(rendered("vllm", "prefill", prefill={"gpusPerInstance": 4}), environ={})
    assert config.tp_size == 4


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["vllm", "bench"], "vllm serve"),
        (["vllm", "serve", "m", "--kv-transfer-config", "{not json"], "not JSON"),
        (["vllm", "serve", "m", "--kv-transfer-config", '{"kv_connector":"Other"}'], "Nixl"),
        (["sglang", "--model-path", "m"], "--disaggregation-mode"),
        (
            [
                "sglang",
                "--model-path",
                "m",
                "--disaggregation-mode",
                "decode",
                "--disaggregation-transfer-backend",
                "mooncake",
            ],
            "nixl",
        ),
        (["tgi"], "usage"),
    ],
)
def test_unusable_command_lines_are_refused(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_args(argv, environ={})


@pytest.mark.parametrize(
    ("environ", "region", "memory"),
    [
        ({"PDD_REFENGINE_KV_REGION_BYTES": "1048576"}, 1 << 20, "DRAM"),
        ({"PDD_REFENGINE_KV_MEMORY": "vram"}, DEFAULT_REGION_BYTES, "VRAM"),
    ],
)
def test_region_from_the_environment(environ: dict[str, str], region: int, memory: str) -> None:
    config = parse_args(["vllm", "serve", "m"], environ=environ)
    assert (config.region_bytes, config.memory, config.role) == (region, memory, "both")


def test_the_push_connector_plays_from_vllm_0_33_only() -> None:
    """As vLLM: NixlPushConnector from 0.24, so the 0.11 image refuses it."""
    push = {"kvTransfer": {"connector": "NixlPushConnector"}}
    argv = rendered("vllm", "decode", **push)
    assert parse_args(argv, {"PDD_REFENGINE_IMAGE_TAG": "vllm-0.33.0"}).kv_mode == "push"
    with pytest.raises(UsageError, match=r"NixlPushConnector needs vLLM 0\.24 or later"):
        parse_args(argv, {"PDD_REFENGINE_IMAGE_TAG": "vllm-0.11.0"})
    assert parse_args(rendered("vllm", "decode"), {}).kv_mode == "pull"


@pytest.mark.parametrize(("engine", "flag"), [("vllm", "--block-size"), ("sglang", "--page-size")])
def test_the_operators_own_block_size_fits_the_default_region(engine: str, flag: str) -> None:
    """70B at TP 1 gets 256-token blocks from the operator: 80 MiB of whole-model KV each,
    more than the 64 MiB default, so the region grows to hold MIN_BLOCKS of them."""
    from pdd_operator.rendering.command import engine_launch

    spec = make_pdd({
        "engine": {"type": engine, "image": IMAGES[engine]},
        "model": {"name": "meta-llama/Llama-3.1-70B-Instruct", "servedName": "llama"},
        "prefill": {"gpusPerInstance": 1}, "decode": {"gpusPerInstance": 1},
    }).spec  # fmt: skip
    launch = engine_launch(ENGINES[engine], spec, "decode")
    argv = [*launch.command, *launch.args]
    argv = argv if engine == "vllm" else ["sglang", *argv[2:]]
    assert argv[argv.index(flag) + 1] == "256"
    config = parse_args(argv, {"PDD_REFENGINE_IMAGE_TAG": f"{engine}-0.33.0"})
    assert config.block_tokens == 256
    assert config.region_bytes == MIN_BLOCKS * 256 * 80 * 8 * 128 * 2 * 2
