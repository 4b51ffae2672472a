"""The preflight's KV-path check, end to end with real NIXL: the result file the sidecar hands
to the operator, and a check that cannot run (no GPU driver here) reported, not fatal."""

from __future__ import annotations

import ctypes.util
import json
import os
import resource
from pathlib import Path

import pytest

from pdd_contract.probe_result import ProbeResult
from pdd_node import preflight
from pdd_node.kv_path import KvPathRequest, check_kv_path, summary

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "topology"
NO_CUDA_DRIVER = ctypes.util.find_library("cuda") is None


def test_the_check_writes_a_verified_result_for_the_sidecar(tmp_path: Path) -> None:
    out = tmp_path / "env" / "kv-path.json"
    request = KvPathRequest(gpus=0, descriptor_bytes=64 * 1024, peer_boundary="none")
    result = check_kv_path(request, dict(os.environ), out)
    written = ProbeResult.from_dict(json.loads(out.read_text()))
    assert written.verified and written.error is None
    assert (written.measured_by, written.link) == ("preflight", "host")
    assert written.engine_descriptor_bytes == 64 * 1024
    assert "host link" in summary(result) and "engine's 65536-byte descriptors" in summary(result)


@pytest.mark.skipif(not NO_CUDA_DRIVER, reason="a CUDA driver is present: the check would run")
def test_a_check_that_cannot_run_is_reported_and_the_pod_still_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "PDD_NIC_MAP"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(resource, "getrlimit", lambda _: (resource.RLIM_INFINITY,) * 2)
    monkeypatch.setenv("PDD_VERIFY_TRANSFER", "true")
    monkeypatch.setenv("PDD_KV_DESCRIPTOR_BYTES", "65536")
    dev = tmp_path / "dev"
    (dev / "infiniband").mkdir(parents=True)
    (dev / "infiniband" / "uverbs0").touch()
    (dev / "shm").mkdir()
    out = tmp_path / "env" / "kv-path.json"
    args = [
        "--sysfs-root", str(FIXTURES / "h100-hgx" / "sys"),
        "--procfs-root", str(FIXTURES / "h100-hgx" / "proc"),
        "--dev-root", str(dev),
        "--env-file", str(tmp_path / "env" / "transfer.env"),
        "--termination-log", str(tmp_path / "termination-log"),
        "--kv-path-file", str(out),
    ]  # fmt: skip
    assert preflight.main(args) == 0
    result = ProbeResult.from_dict(json.loads(out.read_text()))
    assert result.link == "rdma" and not result.verified
    assert result.error and "CUDA driver" in result.error
    assert "preflight [warning] kv-path: the rdma path check failed" in capsys.readouterr().out


def test_a_malformed_descriptor_size_is_a_configuration_error() -> None:
    with pytest.raises(preflight.PreflightError, match="PDD_KV_DESCRIPTOR_BYTES"):
        preflight.PreflightConfig.from_env({"PDD_KV_DESCRIPTOR_BYTES": "64Ki"})
