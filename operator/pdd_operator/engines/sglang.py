"""SGLang (``python3 -m sglang.launch_server``) in its disaggregation mode with NIXL.

The role is ``--disaggregation-mode``; the decode side fetches the prefill side's NIXL
metadata from the bootstrap server that only prefill pods run (``--disaggregation-bootstrap-
port``). K and V move as separate descriptors; a page is one token unless ``--page-size``
says otherwise.
"""

from __future__ import annotations

from pdd_contract.ports import SGLANG_SIDE_CHANNEL, SIDE_CHANNEL_SERVED_BY
from pdd_operator.api.v1alpha1 import PDDeploymentSpec
from pdd_operator.engines.base import (
    EngineAdapter,
    EngineLaunch,
    EnginePort,
    KvLayout,
    SideChannel,
    role_spec,
)

BOOTSTRAP_PORT_NAME = "bootstrap"


class SglangAdapter(EngineAdapter):
    type = "sglang"
    kv_layout = KvLayout(default_block_tokens=1, packed=False)

    def launch(self, spec: PDDeploymentSpec, role: str) -> EngineLaunch:
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
            str(role_spec(spec, role).gpusPerInstance),
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
        return EngineLaunch(("python3",), tuple(args))

    def ports(self, spec: PDDeploymentSpec) -> tuple[EnginePort, ...]:
        return (EnginePort(BOOTSTRAP_PORT_NAME, spec.kvTransfer.bootstrapPort),)

    def side_channel(self, spec: PDDeploymentSpec) -> SideChannel:
        return SideChannel(
            SGLANG_SIDE_CHANNEL,
            (spec.kvTransfer.bootstrapPort,),
            SIDE_CHANNEL_SERVED_BY[SGLANG_SIDE_CHANNEL],
        )


ADAPTER = SglangAdapter()
