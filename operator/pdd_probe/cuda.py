"""GPU memory for the transfer probe through the CUDA driver API (``libcuda.so.1``, ctypes).

The probe runs where the engine's devices are — the preflight init container, the sidecar —
in an image without PyTorch. The NVIDIA container runtime mounts the driver library into every
container that got a GPU, so the driver API is always there when a GPU is: allocate, fill and
read back device memory with no CUDA toolkit and no framework.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

_SUCCESS = 0


class CudaError(RuntimeError):
    """A CUDA driver call failed; the message names the call and CUDA's own error name."""


@dataclass
class DeviceMemory:
    """One ``cuMemAlloc`` allocation on one device; freed by ``close``."""

    driver: CudaDriver
    device: int
    addr: int
    nbytes: int

    def write(self, data: np.ndarray) -> None:
        self.driver.make_current(self.device)
        host = np.ascontiguousarray(data, dtype=np.uint8)
        source = host.ctypes.data_as(ctypes.c_void_p)
        self.driver.call(
            "cuMemcpyHtoD_v2", ctypes.c_uint64(self.addr), source, ctypes.c_size_t(host.nbytes)
        )

    def read(self) -> np.ndarray:
        self.driver.make_current(self.device)
        host = np.empty(self.nbytes, dtype=np.uint8)
        target = host.ctypes.data_as(ctypes.c_void_p)
        self.driver.call(
            "cuMemcpyDtoH_v2", target, ctypes.c_uint64(self.addr), ctypes.c_size_t(self.nbytes)
        )
        return host

    def close(self) -> None:
        if self.addr:
            self.driver.make_current(self.device)
            self.driver.call("cuMemFree_v2", ctypes.c_uint64(self.addr))
            self.addr = 0


class CudaDriver:
    """The few driver calls the probe needs. Each device is used through its primary context,
    the one the engines (PyTorch) use too, so UCX sees the same kind of allocation."""

    def __init__(self, library: str = "libcuda.so.1") -> None:
        try:
            self._lib = ctypes.CDLL(library)
        except OSError as exc:
            raise CudaError(f"no CUDA driver ({library}): {exc}") from exc
        self.call("cuInit", ctypes.c_uint(0))
        self._contexts: dict[int, ctypes.c_void_p] = {}

    def call(self, name: str, *args: object) -> None:
        status = getattr(self._lib, name)(*args)
        if status != _SUCCESS:
            raise CudaError(f"{name} failed: {self._error_name(status)}")

    def device_count(self) -> int:
        count = ctypes.c_int(0)
        self.call("cuDeviceGetCount", ctypes.byref(count))
        return count.value

    def make_current(self, device: int) -> None:
        context = self._contexts.get(device)
        if context is None:
            handle = ctypes.c_int(0)
            self.call("cuDeviceGet", ctypes.byref(handle), ctypes.c_int(device))
            context = ctypes.c_void_p()
            self.call("cuDevicePrimaryCtxRetain", ctypes.byref(context), handle)
            self._contexts[device] = context
        self.call("cuCtxSetCurrent", context)

    def allocate(self, nbytes: int, device: int) -> DeviceMemory:
        """Zeroed device memory."""
        self.make_current(device)
        pointer = ctypes.c_uint64(0)
        self.call("cuMemAlloc_v2", ctypes.byref(pointer), ctypes.c_size_t(nbytes))
        self.call("cuMemsetD8_v2", pointer, ctypes.c_ubyte(0), ctypes.c_size_t(nbytes))
        return DeviceMemory(self, device, pointer.value, nbytes)

    def _error_name(self, status: int) -> str:
        name = ctypes.c_char_p()
        if self._lib.cuGetErrorName(ctypes.c_int(status), ctypes.byref(name)) == _SUCCESS:
            return (name.value or b"").decode()
        return f"CUDA error {status}"
