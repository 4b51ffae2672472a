"""Parsers for the contents of the sysfs/procfs files the scan reads. Pure string -> value;
each returns None (or a neutral value) for text it does not recognise instead of raising,
because one odd file must not hide the rest of the node's topology."""

from __future__ import annotations

import re
from dataclasses import dataclass

_KERNEL_RELEASE = re.compile(r"^\s*(\d+)\.(\d+)")
# "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build ..."
# "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 ..."
_NVRM_VERSION = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+(?:\.\d+)+)")
_PORT_STATE = re.compile(r"^\s*(?:\d+\s*:\s*)?([A-Z_]+)\s*$")
_PORT_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")

# Minimum Linux driver of each CUDA release (NVIDIA's "CUDA Toolkit and Corresponding Driver
# Versions" table): a driver supports the highest CUDA version whose minimum it meets.
_CUDA_BY_MIN_DRIVER: tuple[tuple[tuple[int, ...], str], ...] = (
    ((450, 36, 6), "11.0"),
    ((455, 23), "11.1"),
    ((460, 27, 3), "11.2"),
    ((465, 19, 1), "11.3"),
    ((470, 42, 1), "11.4"),
    ((495, 29, 5), "11.5"),
    ((510, 39, 1), "11.6"),
    ((515, 43, 4), "11.7"),
    ((520, 61, 5), "11.8"),
    ((525, 60, 13), "12.0"),
    ((530, 30, 2), "12.1"),
    ((535, 54, 3), "12.2"),
    ((545, 23, 6), "12.3"),
    ((550, 54, 14), "12.4"),
    ((555, 42, 2), "12.5"),
    ((560, 28, 3), "12.6"),
    ((570, 26), "12.8"),
    ((575, 51, 3), "12.9"),
    ((580, 65, 6), "13.0"),
)
_NEWEST_BRANCH_IN_TABLE = 580


@dataclass(frozen=True)
class NvidiaDriver:
    version: str | None
    open_kernel_module: bool


def parse_kernel_release(release: str) -> tuple[int, int] | None:
    """`6.8.0-45-generic` -> (6, 8)."""
    match = _KERNEL_RELEASE.match(release)
    return (int(match.group(1)), int(match.group(2))) if match else None


def parse_nvidia_version(text: str) -> NvidiaDriver:
    """Contents of /proc/driver/nvidia/version -> driver version and module flavour."""
    match = _NVRM_VERSION.search(text)
    return NvidiaDriver(
        version=match.group(1) if match else None,
        open_kernel_module="Open Kernel Module" in text,
    )


def cuda_version_for_driver(driver_version: str | None) -> str | None:
    """The highest CUDA version a driver supports (what nvidia-smi prints as "CUDA Version").
    None when unknown, including branches newer than the table (they support more than its
    last row, and reporting less would be wrong)."""
    numbers = _version_numbers(driver_version)
    if not numbers or numbers[0] > _NEWEST_BRANCH_IN_TABLE:
        return None
    supported = [cuda for minimum, cuda in _CUDA_BY_MIN_DRIVER if numbers >= minimum]
    return supported[-1] if supported else None


def parse_cuda_version(version: str | None) -> tuple[int, int] | None:
    numbers = _version_numbers(version)
    return (numbers[0], numbers[1]) if len(numbers) >= 2 else None


def parse_gpu_information(text: str) -> dict[str, str]:
    """/proc/driver/nvidia/gpus/<bus>/information ("Key: \\t value" lines) -> dict."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, separator, value = line.partition(":")
        if separator:
            fields[key.strip()] = value.strip()
    return fields


def gpu_uuid(information: dict[str, str]) -> str | None:
    """The GPU UUID, or None where the driver hides it (older drivers print GPU-????...)."""
    uuid = information.get("GPU UUID", "")
    return uuid if uuid.startswith("GPU-") and "?" not in uuid else None


def parse_port_state(text: str) -> str:
    """`4: ACTIVE` -> ACTIVE; unrecognised text -> UNKNOWN."""
    match = _PORT_STATE.match(text)
    return match.group(1) if match else "UNKNOWN"


def parse_port_rate(text: str) -> float | None:
    """`400 Gb/sec (4X NDR)` -> 400.0 (Gb/s)."""
    match = _PORT_RATE.match(text)
    return float(match.group(1)) if match else None


def parse_numa_node(text: str) -> int | None:
    """sysfs numa_node: -1 (or garbage) means unknown."""
    try:
        node = int(text.strip())
    except ValueError:
        return None
    return node if node >= 0 else None


def parse_hex(text: str) -> int | None:
    try:
        return int(text.strip(), 16)
    except ValueError:
        return None


def _version_numbers(version: str | None) -> tuple[int, ...]:
    if not version:
        return ()
    numbers: list[int] = []
    for part in version.strip().split("."):
        if not part.isdigit():
            break
        numbers.append(int(part))
    return tuple(numbers)
