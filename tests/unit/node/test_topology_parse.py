"""Parsers of sysfs/procfs file contents."""

from __future__ import annotations

import pytest

from pdd_node.topology.parse import (
    cuda_version_for_driver,
    gpu_uuid,
    parse_gpu_information,
    parse_kernel_release,
    parse_numa_node,
    parse_nvidia_version,
    parse_port_rate,
    parse_port_state,
)

OPEN = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  "
    "(dvs-builder@U16-I3-B03-4-3)  Thu Feb 22 01:44:30 UTC 2024\nGCC version:  gcc 12.3.0\n"
)
OPEN_ARM = "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  570.86.15  Release Build\n"
PROPRIETARY = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 2023\n"


@pytest.mark.parametrize(
    ("release", "expected"),
    [
        ("6.8.0-45-generic", (6, 8)),
        ("5.4.0-150-generic", (5, 4)),
        ("5.12.0", (5, 12)),
        ("6.18.44-fc-v782", (6, 18)),
        ("4.18.0-513.el8.x86_64", (4, 18)),
        ("garbage", None),
        ("", None),
    ],
)
def test_kernel_release(release: str, expected: tuple[int, int] | None) -> None:
    assert parse_kernel_release(release) == expected


@pytest.mark.parametrize(
    ("text", "version", "open_module"),
    [
        (OPEN, "550.54.15", True),
        (OPEN_ARM, "570.86.15", True),
        (PROPRIETARY, "535.129.03", False),
        ("NVRM version: something else entirely", None, False),
        ("", None, False),
    ],
)
def test_nvidia_version(text: str, version: str | None, open_module: bool) -> None:
    driver = parse_nvidia_version(text)
    assert (driver.version, driver.open_kernel_module) == (version, open_module)


@pytest.mark.parametrize(
    ("driver", "cuda"),
    [
        ("515.43.04", "11.7"),  # the first driver dma-buf's CUDA >= 11.7 accepts
        ("515.43.03", "11.6"),
        ("535.129.03", "12.2"),
        ("550.54.15", "12.4"),
        ("570.86.15", "12.8"),
        ("580.159.04", "13.0"),  # what nvidia-smi printed on the project's H200 machine
        ("450.36.06", "11.0"),
        ("440.33", None),  # older than the table
        ("590.44.01", None),  # newer branch than the table: unknown, not understated
        ("not-a-version", None),
        (None, None),
    ],
)
def test_cuda_version_for_driver(driver: str | None, cuda: str | None) -> None:
    assert cuda_version_for_driver(driver) == cuda


def test_gpu_information() -> None:
    text = (
        "Model: \t\t NVIDIA H200\nIRQ:   \t\t 41\n"
        "GPU UUID: \t GPU-0efea0bf-e77c-f160-fae9-be7e28f21d35\nBus Location: \t 0000:00:06.0\n"
    )
    information = parse_gpu_information(text)
    assert information["Bus Location"] == "0000:00:06.0"
    assert information["Model"] == "NVIDIA H200"
    assert gpu_uuid(information) == "GPU-0efea0bf-e77c-f160-fae9-be7e28f21d35"


@pytest.mark.parametrize("uuid", ["GPU-????????-????-????-????-????????????", "", "garbage"])
def test_hidden_or_missing_uuid_is_none(uuid: str) -> None:
    assert gpu_uuid({"GPU UUID": uuid}) is None


@pytest.mark.parametrize(
    ("text", "state"),
    [("4: ACTIVE", "ACTIVE"), ("1: DOWN", "DOWN"), ("2: INIT", "INIT"), ("", "UNKNOWN")],
)
def test_port_state(text: str, state: str) -> None:
    assert parse_port_state(text) == state


@pytest.mark.parametrize(
    ("text", "rate"),
    [
        ("400 Gb/sec (4X NDR)", 400.0),
        ("200 Gb/sec (2X HDR)", 200.0),
        ("2.5 Gb/sec (1X SDR)", 2.5),
        ("", None),
        ("fast", None),
    ],
)
def test_port_rate(text: str, rate: float | None) -> None:
    assert parse_port_rate(text) == rate


@pytest.mark.parametrize(("text", "node"), [("0", 0), ("1\n", 1), ("-1", None), ("x", None)])
def test_numa_node(text: str, node: int | None) -> None:
    assert parse_numa_node(text) == node
