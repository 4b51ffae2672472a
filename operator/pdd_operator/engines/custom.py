"""A custom engine: the user's image and ``spec.engine.command``, told only its model.

It gets the role, the deployment and the transfer environment every engine gets, plus
PDD_MODEL (the Hugging Face repo id, or the directory its model volume is mounted at); it
has no side channel of its own, so its NIXL metadata goes through the sidecar or etcd (the
CRD refuses ``metadataExchange.mode: engine`` for it). The KV layout assumed for
the transfer check is vLLM's block size with K and V as separate descriptors.
"""

from __future__ import annotations

from pdd_contract.env import PDD_MODEL
from pdd_operator.api.v1alpha1 import DEFAULT_ROUTER_IMAGE, PDDeploymentSpec
from pdd_operator.engines import cel_rules
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

    def own_spec_rules(self) -> list[tuple[str, str]]:
        """What the operator renders only for the engines it knows: a router, a side
        channel, a CPU tier, LoRA adapters."""
        return [
            (
                "self.engine.type != 'custom' || !self.router.enabled || "
                f"has(self.router.command) || self.router.image != '{DEFAULT_ROUTER_IMAGE}'",
                "a custom engine has no router of its own: set spec.router.command (and args) "
                "to run one from the default image (vllm-router, smg), set spec.router.image "
                "to a router image with its own entrypoint, or set spec.router.enabled to false",
            ),
            (
                "self.engine.type != 'custom' || self.kvTransfer.metadataExchange.mode != 'engine'",
                "spec.kvTransfer.metadataExchange.mode 'engine' needs a vllm or sglang engine "
                "(custom engines have no known side channel): use sidecar or etcd",
            ),
            (
                "!(has(self.kvCache.offload.cpu) || has(self.kvCache.offload.disk)) || "
                "self.engine.type != 'custom'",
                "spec.kvCache.offload is rendered for vllm and sglang engines: a custom "
                "engine's KV tiers are its own (set them in spec.engine.args)",
            ),
            (
                f"!{cel_rules.ADAPTERS_LISTED} || self.engine.type != 'custom'",
                "spec.model.adapters is rendered for vllm and sglang engines: a custom engine "
                "loads its adapters itself (set them in spec.engine.args)",
            ),
        ]

    def launch(self, spec: PDDeploymentSpec, role: str) -> EngineLaunch:
        del role
        # The repo id, or the directory a model volume is mounted at.
        return EngineLaunch((), (), (env_value(PDD_MODEL, model_location(spec, self.model_dir)),))


ADAPTER = CustomAdapter()
