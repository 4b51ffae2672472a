"""The preflight init container: GPU selection, NIC pinning, checks, env file, exit code."""

from __future__ import annotations

import resource
import subprocess
from pathlib import Path

import pytest

from helpers.topology import FIXTURES, scan_fixture
from pdd_node import preflight
from pdd_node.preflight import (
    TERMINATION_MESSAGE_LIMIT,
    CheckResult,
    ContainerFacts,
    PreflightConfig,
    PreflightError,
    PreflightReport,
    Status,
    check_memlock,
    check_shm,
    check_uverbs,
    parse_nic_map,
    read_container_facts,
    render_env_file,
    run_preflight,
    termination_message,
    visible_gpus,
)

UNLIMITED = resource.RLIM_INFINITY
MIB = 1 << 20
GOOD = ContainerFacts(UNLIMITED, UNLIMITED, ("uverbs0", "uverbs1"), 16 << 30)
UUID_2 = "GPU-00000002-33aa-4bbb-8ccc-333333333333"
UUID_5 = "GPU-00000005-a3aa-4bbb-8ccc-a3a3a3a3a3a3"


# --- GPU selection -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nvidia", "cuda", "expected"),
    [
        (None, None, list(range(8))),
        ("all", None, list(range(8))),
        ("none", None, []),
        ("void", None, []),
        ("", None, []),
        ("3,1", None, [1, 3]),  # the container sees them in PCI order
        (f"{UUID_5},{UUID_2}", None, [2, 5]),
        ("2,3,5", "2,0", [5, 2]),  # CUDA_VISIBLE_DEVICES picks and orders by position
        ("2,3,5", "GPU-00000005", [5]),  # ... or by UUID prefix
        ("2,3,5", "-1", []),
        ("2,3,5", "1,-1,0", [3]),  # CUDA stops at the first invalid ordinal
        ("2,3,5", "", []),
    ],
)
def test_visible_gpus(nvidia: str | None, cuda: str | None, expected: list[int]) -> None:
    gpus = visible_gpus(scan_fixture("h100-hgx").gpus, nvidia, cuda)
    assert [gpu.index for gpu in gpus] == expected


@pytest.mark.parametrize(
    ("nvidia", "cuda", "message"),
    [
        ("9", None, "names GPU 9, but this node has GPUs 0, 1, 2"),
        ("GPU-nope", None, "matches 0 of this container's GPUs"),
        ("GPU-0000000", None, "matches 8 of"),  # an ambiguous prefix
        ("MIG-1234", None, "MIG device"),
        ("0,1", "2", "names device 2 but the container has 2 GPU"),
    ],
)
def test_visible_gpus_errors(nvidia: str, cuda: str | None, message: str) -> None:
    with pytest.raises(PreflightError, match=message):
        visible_gpus(scan_fixture("h100-hgx").gpus, nvidia, cuda)


# --- configuration ------------------------------------------------------------------------


def test_config_defaults() -> None:
    assert PreflightConfig.from_env({}) == PreflightConfig()
    # Without the operator's word the check assumes what every P/D pair crosses: a pod
    # boundary.
    assert PreflightConfig().kv_peer_boundary == "pod"


def test_config_reads_the_engines_direction_and_boundary() -> None:
    env = {"PDD_KV_OPERATION": "READ", "PDD_KV_PEER_BOUNDARY": "none"}
    config = PreflightConfig.from_env(env)
    assert (config.kv_operation, config.kv_peer_boundary) == ("READ", "none")
    assert (config.kv_nixl_threads, config.kv_nixl_split_batch) == (0, 0)


def test_config_reads_the_engines_nixl_threads() -> None:
    env = {"PDD_KV_NIXL_THREADS": "8", "PDD_KV_NIXL_SPLIT_BATCH": "0"}
    config = PreflightConfig.from_env(env)
    assert (config.kv_nixl_threads, config.kv_nixl_split_batch) == (8, 0)
    with pytest.raises(PreflightError, match="PDD_KV_NIXL_THREADS='four' is not a whole number"):
        PreflightConfig.from_env({"PDD_KV_NIXL_THREADS": "four"})


def test_config_from_env() -> None:
    config = PreflightConfig.from_env(
        {
            "PDD_REQUIRE_RDMA": "true",
            "PDD_GPUDIRECT": "DMABUF",
            "PDD_NIC_SELECTION": "explicit",
            "PDD_NIC_MAP": "0=mlx5_0:1;1=mlx5_1:1,mlx5_2:1",
            "NVIDIA_VISIBLE_DEVICES": "0,1",
            "CUDA_VISIBLE_DEVICES": "1",
        }
    )
    assert config == PreflightConfig(
        require_rdma=True,
        gpudirect="dmabuf",
        nic_selection="explicit",
        nic_map={0: ("mlx5_0:1",), 1: ("mlx5_1:1", "mlx5_2:1")},
        nvidia_visible_devices="0,1",
        cuda_visible_devices="1",
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PDD_GPUDIRECT": "always"}, "PDD_GPUDIRECT='always' is not one of"),
        ({"PDD_NIC_SELECTION": "nearest"}, "PDD_NIC_SELECTION='nearest'"),
        ({"PDD_REQUIRE_RDMA": "maybe"}, "PDD_REQUIRE_RDMA='maybe' is not true or false"),
        ({"PDD_NIC_MAP": "0:mlx5_0:1"}, "is not `<gpu index>=<device>:<port>"),
        ({"PDD_NIC_MAP": "x=mlx5_0:1"}, "is not `<gpu index>="),
        ({"PDD_NIC_MAP": "0=mlx5_0"}, "is not `<gpu index>="),
        ({"PDD_KV_OPERATION": "PUSH"}, "PDD_KV_OPERATION='PUSH' is not one of WRITE, READ"),
        (
            {"PDD_KV_PEER_BOUNDARY": "node"},
            "PDD_KV_PEER_BOUNDARY='node' is not one of pod, host-pid, host-pid-ipc, none",
        ),
    ],
)
def test_config_errors(env: dict[str, str], message: str) -> None:
    with pytest.raises(PreflightError, match=message):
        PreflightConfig.from_env(env)


def test_empty_nic_map_entries_are_ignored() -> None:
    assert parse_nic_map(" ; 3=mlx5_3:1 ;") == {3: ("mlx5_3:1",)}


# --- the pieces of a run -------------------------------------------------------------------


def run(
    fixture: str, facts: ContainerFacts = GOOD, **config: object
) -> tuple[PreflightReport, dict[str, Status]]:
    report = run_preflight(scan_fixture(fixture), PreflightConfig(**config), facts)  # type: ignore[arg-type]
    statuses = {check.name: check.status for check in report.checks}
    return report, statuses


def messages(report: PreflightReport, status: str) -> str:
    return "\n".join(check.message for check in report.checks if check.status == status)


def test_h100_all_gpus_pass_and_pin_their_own_nic() -> None:
    report, _ = run("h100-hgx", require_rdma=True, gpudirect="dmabuf")
    assert report.failures == [] and report.warnings == []
    assert report.ucx_net_devices == ",".join(f"mlx5_{i}:1" for i in range(8))
    assert report.gpu_nic_map == ",".join(f"{i}:mlx5_{i}:1" for i in range(8))
    assert report.gpudirect_mode == "dmabuf"
    assert report.ucx_gpu_direct_rdma == "yes"


def test_ranks_follow_the_containers_gpus() -> None:
    report, _ = run("h100-hgx", nvidia_visible_devices=f"{UUID_5},{UUID_2}")
    assert report.gpu_nic_map == "0:mlx5_2:1,1:mlx5_5:1"
    assert report.ucx_net_devices == "mlx5_2:1,mlx5_5:1"


def test_port_down_falls_back_with_a_warning() -> None:
    report, statuses = run("port-down", require_rdma=True, nvidia_visible_devices="2")
    assert report.failures == []
    assert report.ucx_net_devices == "mlx5_0:1"
    assert statuses["rdma-ports"] == "warning"
    warning = messages(report, "warning")
    assert "nearest NIC mlx5_2 (PIX) has no ACTIVE port (ports: mlx5_2:1 DOWN)" in warning
    assert "using mlx5_0:1 (NODE)" in warning


def test_cross_socket_nic_is_a_warning_naming_the_gpus() -> None:
    report, _ = run("nics-on-socket0", require_rdma=True, nvidia_visible_devices="4,5")
    assert report.failures == []
    assert report.ucx_net_devices == "mlx5_0:1,mlx5_1:1"
    warning = messages(report, "warning")
    assert "GPU 4->mlx5_0:1, GPU 5->mlx5_1:1" in warning
    assert "(SYS)" in warning


def test_no_rdma_required_fails_naming_what_to_fix() -> None:
    report, statuses = run("no-rdma", GOOD, require_rdma=True)
    assert statuses["rdma-ports"] == "failed"
    assert "GPU 0, 1, 2, 3, 4, 5, 6, 7 has no ACTIVE RDMA port" in messages(report, "failed")
    assert "no RDMA NIC in /sys/class/infiniband" in messages(report, "failed")


def test_no_rdma_not_required_passes_quietly() -> None:
    no_rdma_container = ContainerFacts(8 * MIB, 8 * MIB, (), 16 << 30)
    report, statuses = run("no-rdma", no_rdma_container)
    assert report.failures == [] and report.warnings == []
    assert statuses == {
        "gpus": "ok",
        "rdma-ports": "ok",
        "memlock": "ok",
        "uverbs": "ok",
        "gpudirect": "ok",
        "shm": "ok",
    }
    assert "UCX_NET_DEVICES" not in render_env_file(report)


@pytest.mark.parametrize(
    ("fixture", "requested", "status", "message_has"),
    [
        ("h100-hgx", "dmabuf", "ok", "dma-buf"),
        ("old-kernel", "peermem", "ok", "nvidia-peermem"),
        ("old-kernel", "auto", "ok", "peermem"),
        ("old-kernel", "dmabuf", "failed", "Linux 5.4 is older than 5.12"),
        ("old-kernel", "dmabuf", "failed", "(this node has nvidia-peermem)"),
        ("proprietary-no-peermem", "peermem", "failed", "modprobe nvidia-peermem"),
        ("proprietary-no-peermem", "dmabuf", "failed", "driver.kernelModuleType=open"),
        ("proprietary-no-peermem", "auto", "warning", "staged through host memory"),
        ("proprietary-no-peermem", "off", "ok", "off as requested"),
        ("h100-hgx", "peermem", "failed", "nvidia_peermem is not loaded"),
        # Without an RDMA NIC neither flavour works, and the fix is about the NIC, not the driver.
        ("no-rdma", "dmabuf", "failed", "dma-buf: no RDMA NIC in /sys/class/infiniband"),
        ("no-rdma", "peermem", "failed", "nvidia-peermem is unavailable on this node: no RDMA NIC"),
    ],
)
def test_gpudirect_request(fixture: str, requested: str, status: str, message_has: str) -> None:
    report, statuses = run(fixture, gpudirect=requested)
    assert statuses["gpudirect"] == status
    gpudirect = next(check for check in report.checks if check.name == "gpudirect")
    assert message_has in gpudirect.message


def test_gpudirect_off_is_reported_as_off() -> None:
    report, _ = run("h100-hgx", gpudirect="off")
    assert report.gpudirect_mode == "off"
    assert report.ucx_gpu_direct_rdma is None


@pytest.mark.parametrize(
    ("soft", "hard", "in_use", "required", "status", "message_has"),
    [
        (UNLIMITED, UNLIMITED, True, True, "ok", "unlimited"),
        (8 * MIB, 8 * MIB, True, True, "failed", "memlock is 8 MiB; RDMA needs unlimited"),
        (8 * MIB, 8 * MIB, True, True, "failed", "LimitMEMLOCK=infinity"),
        (8 * MIB, 8 * MIB, True, True, "failed", "IPC_LOCK"),
        (64 << 10, UNLIMITED, True, True, "failed", "`ulimit -l unlimited`"),
        (8 * MIB, 8 * MIB, True, False, "warning", "memlock is 8 MiB"),
        (8 * MIB, 8 * MIB, False, False, "ok", "no RDMA is in use"),
    ],
)
def test_check_memlock(
    soft: int, hard: int, in_use: bool, required: bool, status: str, message_has: str
) -> None:
    result = check_memlock(ContainerFacts(soft, hard, (), None), in_use, required)
    assert result.status == status
    assert message_has in result.message


@pytest.mark.parametrize(
    ("devices", "in_use", "required", "status"),
    [
        (("uverbs0",), True, True, "ok"),
        ((), True, True, "failed"),
        ((), True, False, "warning"),
        ((), False, False, "ok"),
    ],
)
def test_check_uverbs(devices: tuple[str, ...], in_use: bool, required: bool, status: str) -> None:
    result = check_uverbs(ContainerFacts(UNLIMITED, UNLIMITED, devices, None), in_use, required)
    assert result.status == status
    if status == "failed":
        assert "spec.kvTransfer.rdma.resourceName" in result.message


@pytest.mark.parametrize(
    ("size", "status", "message_has"),
    [
        (None, "warning", "no /dev/shm"),
        (64 * MIB, "warning", "/dev/shm is 64 MiB"),
        (2 << 30, "ok", "2 GiB"),
        (int(252.5 * (1 << 30)), "ok", "252.5 GiB"),
    ],
)
def test_check_shm(size: int | None, status: str, message_has: str) -> None:
    result = check_shm(ContainerFacts(UNLIMITED, UNLIMITED, (), size))
    assert result.status == status
    assert message_has in result.message


# --- explicit NIC map ----------------------------------------------------------------------


def test_explicit_map_is_used_as_given() -> None:
    report, _ = run(
        "h100-hgx",
        nic_selection="explicit",
        nic_map={0: ("mlx5_3:1",), 1: ("mlx5_1:1", "mlx5_0:1")},
        nvidia_visible_devices="0,1",
    )
    assert report.failures == [] and report.warnings == []
    assert report.ucx_net_devices == "mlx5_3:1,mlx5_1:1,mlx5_0:1"
    assert report.gpu_nic_map == "0:mlx5_3:1,1:mlx5_1:1+mlx5_0:1"
    assert report.ranks[0].distance == "NODE"


@pytest.mark.parametrize(
    ("fixture", "nic_map", "required", "status", "message_has"),
    [
        ("port-down", {2: ("mlx5_2:1",)}, True, "failed", "that port is DOWN, not ACTIVE"),
        ("port-down", {2: ("mlx5_2:1",)}, False, "warning", "that port is DOWN"),
        ("h100-hgx", {2: ("mlx5_9:1",)}, False, "failed", "no RDMA NIC mlx5_9"),
        ("h100-hgx", {2: ("mlx5_2:2",)}, False, "failed", "mlx5_2 has no port 2"),
        ("h100-hgx", {3: ("mlx5_3:1",)}, False, "warning", "has no entry for GPU 2"),
        ("h100-hgx", {3: ("mlx5_3:1",)}, True, "failed", "has no entry for GPU 2"),
    ],
)
def test_explicit_map_problems(
    fixture: str,
    nic_map: dict[int, tuple[str, ...]],
    required: bool,
    status: str,
    message_has: str,
) -> None:
    report, statuses = run(
        fixture,
        nic_selection="explicit",
        nic_map=nic_map,
        require_rdma=required,
        nvidia_visible_devices="2",
    )
    assert statuses["rdma-ports"] == status
    assert message_has in messages(report, status)


# --- outputs -------------------------------------------------------------------------------


def test_env_file_is_sourceable_and_carries_warnings(tmp_path: Path) -> None:
    report, _ = run("port-down", nvidia_visible_devices="1,2", gpudirect="dmabuf")
    env_file = tmp_path / "transfer.env"
    env_file.write_text(render_env_file(report))
    text = env_file.read_text()
    assert "# warning [rdma-ports]: GPU 2's nearest NIC mlx5_2 (PIX)" in text
    assert "# rank 1: GPU 2 0000:33:00.0 -> mlx5_0:1 (NODE)" in text
    shown = subprocess.run(
        [
            "sh",
            "-c",
            f". {env_file}; echo $UCX_NET_DEVICES $PDD_GPU_NIC_MAP "
            "$PDD_GPUDIRECT_MODE $UCX_IB_GPU_DIRECT_RDMA",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert shown == ["mlx5_1:1,mlx5_0:1", "0:mlx5_1:1,1:mlx5_0:1", "dmabuf", "yes"]


def test_termination_message_has_one_paragraph_per_failure() -> None:
    report = PreflightReport(
        (),
        "none",
        (
            CheckResult("memlock", "failed", "memlock is 8 MiB;\n fix it"),
            CheckResult("shm", "warning", "not in the message"),
            CheckResult("uverbs", "failed", "no uverbs"),
        ),
    )
    assert termination_message(report) == (
        "preflight: memlock is 8 MiB; fix it\n\npreflight: no uverbs"
    )


def test_termination_message_is_cut_to_what_the_kubelet_keeps() -> None:
    checks = tuple(CheckResult("x", "failed", "é" * 3000) for _ in range(3))
    message = termination_message(PreflightReport((), "none", checks))
    assert len(message.encode()) <= TERMINATION_MESSAGE_LIMIT
    assert message.endswith("...")


def test_read_container_facts(tmp_path: Path) -> None:
    (tmp_path / "infiniband").mkdir()
    for name in ("uverbs1", "uverbs0", "rdma_cm", "issm0"):
        (tmp_path / "infiniband" / name).touch()
    facts = read_container_facts(tmp_path)
    assert facts.uverbs_devices == ("uverbs0", "uverbs1")
    assert facts.shm_bytes is None  # no <dev>/shm
    (tmp_path / "shm").mkdir()
    size = read_container_facts(tmp_path).shm_bytes
    assert size is not None and size > 0
    assert read_container_facts(tmp_path / "missing").uverbs_devices == ()


# --- main ----------------------------------------------------------------------------------


def main_args(tmp_path: Path, fixture: str) -> list[str]:
    dev = tmp_path / "dev"
    (dev / "infiniband").mkdir(parents=True)
    (dev / "infiniband" / "uverbs0").touch()
    (dev / "shm").mkdir()
    return [
        "--sysfs-root", str(FIXTURES / fixture / "sys"),
        "--procfs-root", str(FIXTURES / fixture / "proc"),
        "--dev-root", str(dev),
        "--env-file", str(tmp_path / "env" / "transfer.env"),
        "--termination-log", str(tmp_path / "termination-log"),
    ]  # fmt: skip


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in (
        "NVIDIA_VISIBLE_DEVICES",
        "CUDA_VISIBLE_DEVICES",
        "PDD_GPUDIRECT",
        "PDD_REQUIRE_RDMA",
        "PDD_NIC_SELECTION",
        "PDD_NIC_MAP",
    ):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_main_writes_the_env_file(tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setattr(resource, "getrlimit", lambda _: (UNLIMITED, UNLIMITED))
    clean_env.setenv("NVIDIA_VISIBLE_DEVICES", f"{UUID_2},{UUID_5}")
    clean_env.setenv("PDD_REQUIRE_RDMA", "true")
    assert preflight.main(main_args(tmp_path, "h100-hgx")) == 0
    assert "export UCX_NET_DEVICES=mlx5_2:1,mlx5_5:1" in (tmp_path / "env/transfer.env").read_text()
    assert not (tmp_path / "termination-log").exists()


def test_main_fails_with_a_termination_message(
    tmp_path: Path, clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clean_env.setattr(resource, "getrlimit", lambda _: (8 * MIB, 8 * MIB))
    clean_env.setenv("PDD_REQUIRE_RDMA", "true")
    clean_env.setenv("PDD_GPUDIRECT", "dmabuf")
    assert preflight.main(main_args(tmp_path, "old-kernel")) == 1
    message = (tmp_path / "termination-log").read_text()
    paragraphs = message.split("\n\n")
    assert len(paragraphs) == 2
    assert paragraphs[0].startswith("preflight: memlock is 8 MiB; RDMA needs unlimited: run")
    assert "cannot do GPUDirect RDMA through dma-buf" in paragraphs[1]
    assert not (tmp_path / "env/transfer.env").exists()
    assert "preflight [failed] memlock" in capsys.readouterr().out


def test_main_fails_on_bad_configuration(tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("PDD_GPUDIRECT", "always")
    assert preflight.main(main_args(tmp_path, "h100-hgx")) == 1
    assert "PDD_GPUDIRECT='always'" in (tmp_path / "termination-log").read_text()


def test_main_fails_on_a_gpu_the_node_lacks(tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("NVIDIA_VISIBLE_DEVICES", "GPU-not-here")
    assert preflight.main(main_args(tmp_path, "h100-hgx")) == 1
    assert "GPU-not-here" in (tmp_path / "termination-log").read_text()
