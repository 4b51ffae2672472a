"""A custom engine: the user's image and ``spec.engine.command``, told only its model.

It gets the role, the deployment and the transfer environment every engine gets, plus
PDD_MODEL (the Hugging Face repo id, or the directory its model volume is mounted at); it
has no side channel of its own, so its NIXL metadata goes through the sidecar or etcd (the
CRD refuses ``metadataExchange.mode: engine`` for it). The KV layout assumed for
the transfer check is vLLM's block size with K and V as separate descriptors.
"""

from __future__ import annotations

from pdd_contract.env import PDD_MODEL
from pdd_operator.api.v1alpha1 import PDDeploymentSpec
from pdd_operator.engines.base import (
    EngineAdapter,
    EngineLaunch,
    KvLayout,
    env_value,
    model_location,
)


class CustomAdapter(EngineAdapter):
    type = "custom"
    kv_layout = KvLayout(default_block_tokens=16, packed=False)

    def launch(self, spec: PDDeploymentSpec, role: str) -> EngineLaunch:
        del role
        # The repo id, or the directory a model volume is mounted at.
        return EngineLaunch((), (), (env_value(PDD_MODEL, model_location(spec, self.model_dir)),))


ADAPTER = CustomAdapter()
