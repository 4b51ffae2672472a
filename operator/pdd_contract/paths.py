"""Files one container writes or mounts and another reads."""

from __future__ import annotations

# A memory emptyDir: the preflight init container writes ENV_FILE, the engine's entrypoint
# sources it before the engine starts (UCX_NET_DEVICES for the GPUs the pod really got).
ENV_DIR = "/pdd/env"
ENV_FILE = f"{ENV_DIR}/transfer.env"
# The preflight's KV-path check with the pod's own devices (a ProbeResult as JSON), which the
# prober pod's sidecar hands to the operator.
KV_PATH_FILE = f"{ENV_DIR}/kv-path.json"

# The per-deployment sidecar token: a Secret with one key, mounted into the sidecar and the
# engine at TOKEN_DIR.
TOKEN_DIR = "/var/run/pdd/token"
TOKEN_KEY = "token"
TOKEN_FILE = f"{TOKEN_DIR}/{TOKEN_KEY}"
