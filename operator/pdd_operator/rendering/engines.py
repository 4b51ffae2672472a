"""Engine adapters: how each engine is told its role and its KV-connector wiring.

vLLM's NixlConnector learns its peers over a ZMQ side channel that must listen on the pod IP
(VLLM_NIXL_SIDE_CHANNEL_HOST, from the downward API); SGLang uses a bootstrap port. A custom
engine gets the same environment and nothing else.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pdd_contract.env import PDD_MODEL
from pdd_contract.paths import ENV_FILE
from pdd_operator.api.v1alpha1 import PDDeploymentSpec

# Sources the env file the preflight container wrote (UCX_NET_DEVICES for the GPUs this pod
# really got), then execs the engine with its arguments untouched ("$0" "$@").
SOURCE_ENV_AND_EXEC = f'set -a; if [ -f {ENV_FILE} ]; then . {ENV_FILE}; fi; set +a; exec "$0" "$@"'


@dataclass(frozen=True)
class EngineCommand:
    command: list[str]
    args: list[str]
    env: list[dict[str, Any]] = field(default_factory=list)
    ports: list[dict[str, Any]] = field(default_factory=list)


def engine_command(spec: PDDeploymentSpec, role: str) -> EngineCommand:
    adapters = {"vllm": _vllm, "sglang": _sglang, "custom": _custom}
    base = adapters[spec.engine.type](spec, role)
    role_spec = spec.prefill if role == "prefill" else spec.decode
    args = base.args + list(spec.engine.args) + list(role_spec.args)
    if spec.engine.command is not None:
        return EngineCommand(list(spec.engine.command), args, base.env, base.ports)
    return EngineCommand(base.command, args, base.env, base.ports)


def wrap_with_env_file(command: list[str], args: list[str]) -> tuple[list[str], list[str]]:
    """Run `command args` through a shell that first sources the preflight env file."""
    if not command:
        return command, args
    return ["/bin/sh", "-c", SOURCE_ENV_AND_EXEC], [*command, *args]


def _vllm(spec: PDDeploymentSpec, role: str) -> EngineCommand:
    role_spec = spec.prefill if role == "prefill" else spec.decode
    kv_config = {
        "kv_connector": spec.kvTransfer.connector,
        # NixlConnector moves KV both ways on demand; the role lives in extra config.
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"pdd_role": role},
    }
    args = [
        spec.model.name,
        "--host",
        "0.0.0.0",
        "--port",
        str(spec.engine.port),
        "--tensor-parallel-size",
        str(role_spec.gpusPerInstance),
        "--kv-transfer-config",
        json.dumps(kv_config, separators=(",", ":")),
    ]
    if spec.model.servedName:
        args += ["--served-model-name", spec.model.servedName]
    if spec.engine.kvBlockSize:
        args += ["--block-size", str(spec.engine.kvBlockSize)]
    env: list[dict[str, Any]] = [
        {
            "name": "VLLM_NIXL_SIDE_CHANNEL_HOST",
            "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
        },
        {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(spec.kvTransfer.sideChannelPort)},
    ]
    ports = [
        {
            "name": "side-channel",
            "containerPort": spec.kvTransfer.sideChannelPort,
            "protocol": "TCP",
        }
    ]
    return EngineCommand(["vllm", "serve"], args, env, ports)


def _sglang(spec: PDDeploymentSpec, role: str) -> EngineCommand:
    role_spec = spec.prefill if role == "prefill" else spec.decode
    args = [
        "-m",
        "sglang.launch_server",
        "--model-path",
        spec.model.name,
        "--host",
        "0.0.0.0",
        "--port",
        str(spec.engine.port),
        "--tp",
        str(role_spec.gpusPerInstance),
        "--disaggregation-mode",
        role,
        "--disaggregation-transfer-backend",
        "nixl",
        "--disaggregation-bootstrap-port",
        str(spec.kvTransfer.bootstrapPort),
    ]
    if spec.model.servedName:
        args += ["--served-model-name", spec.model.servedName]
    if spec.engine.kvBlockSize:
        args += ["--page-size", str(spec.engine.kvBlockSize)]
    ports = [
        {"name": "bootstrap", "containerPort": spec.kvTransfer.bootstrapPort, "protocol": "TCP"}
    ]
    return EngineCommand(["python3"], args, [], ports)


def _custom(spec: PDDeploymentSpec, role: str) -> EngineCommand:
    del role
    env = [{"name": PDD_MODEL, "value": spec.model.name}]
    return EngineCommand([], [], env, [])
