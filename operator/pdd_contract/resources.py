"""Resource names the operator renders and counts, the preflight names in its fixes and the
local cluster's simulated nodes offer."""

from __future__ import annotations

# The NVIDIA device plugin's GPU resource.
GPU_RESOURCE = "nvidia.com/gpu"
