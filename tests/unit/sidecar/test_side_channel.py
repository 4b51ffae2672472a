"""Which peers' ports the sidecar checks, from the channel the operator names: the sidecar
knows the roles serving vLLM's and SGLang's channels, and takes them for any other."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdd_sidecar.cli import _parser, build_config
from pdd_sidecar.config import SidecarConfig
from pdd_sidecar.reachability import side_channel_for


@pytest.mark.parametrize(
    ("channel", "role", "served_by", "targets"),
    [
        ("vllm", "prefill", (), {"decode"}),  # every pod listens: check the other role
        ("vllm", "decode", (), {"prefill"}),
        ("sglang", "decode", (), {"prefill"}),  # only prefill runs the bootstrap server
        ("sglang", "prefill", (), set()),
        ("trtllm", "prefill", ("decode",), {"decode"}),  # unknown: the roles given
        ("trtllm", "decode", ("decode",), set()),
        ("trtllm", "decode", ("prefill", "decode"), {"prefill"}),
    ],
)
def test_target_roles(
    channel: str, role: str, served_by: tuple[str, ...], targets: set[str]
) -> None:
    seen = side_channel_for(channel, role, (7000,), served_by)
    assert seen is not None
    assert seen.target_roles == targets and seen.ports == (7000,)


def test_no_side_channel_checks_nothing() -> None:
    assert side_channel_for("none", "decode", ()) is None


@pytest.mark.parametrize(
    ("channel", "ports", "served_by", "message"),
    [
        ("trtllm", (7000,), (), "name the roles"),
        ("trtllm", (), ("prefill",), "give its ports"),
    ],
)
def test_an_unknown_channel_needs_its_roles_and_ports(
    channel: str, ports: tuple[int, ...], served_by: tuple[str, ...], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        side_channel_for(channel, "decode", ports, served_by)


def config_from(tmp_path: Path, *flags: str) -> SidecarConfig:
    token = tmp_path / "token"
    token.write_text("t0ken")
    argv = ["serve", "--role", "decode", "--token-file", str(token), *flags]
    return build_config(_parser().parse_args(argv))


@pytest.mark.parametrize(
    ("flags", "ports"),
    [
        (("--side-channel", "vllm"), (5600,)),
        (("--side-channel", "vllm", "--vllm-dp-size", "3"), (5600, 5601, 5602)),
        (("--side-channel", "sglang"), (8998,)),
        (("--side-channel", "sglang", "--side-channel-ports", "9100"), (9100,)),
        (("--side-channel", "none"), ()),
    ],
)
def test_cli_default_ports(tmp_path: Path, flags: tuple[str, ...], ports: tuple[int, ...]) -> None:
    assert config_from(tmp_path, *flags).side_channel_ports == ports


def test_cli_takes_the_roles_of_a_channel_it_does_not_know(tmp_path: Path) -> None:
    config = config_from(
        tmp_path, "--side-channel", "trtllm", "--side-channel-ports", "7000,7001",
        "--side-channel-roles", "prefill",
    )  # fmt: skip
    assert config.side_channel_ports == (7000, 7001)
    assert config.side_channel_roles == ("prefill",)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--side-channel", "trtllm", "--side-channel-ports", "7000"), "name the roles"),
        (("--side-channel", "trtllm", "--side-channel-roles", "prefill"), "give its ports"),
        (
            ("--side-channel", "vllm", "--side-channel-roles", "prefill,router"),
            "router is not prefill or decode",
        ),
    ],
)
def test_cli_refuses_a_channel_it_cannot_check(
    tmp_path: Path, flags: tuple[str, ...], message: str
) -> None:
    with pytest.raises(SystemExit, match=message):
        config_from(tmp_path, *flags)
