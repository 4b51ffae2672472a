"""The probe's GPU memory comes from the CUDA driver; without one it says so."""

from __future__ import annotations

import pytest

from pdd_probe.cuda import CudaDriver, CudaError


def test_a_missing_driver_is_a_clear_error() -> None:
    with pytest.raises(CudaError, match=r"no CUDA driver \(libcuda-missing\.so\)"):
        CudaDriver("libcuda-missing.so")
