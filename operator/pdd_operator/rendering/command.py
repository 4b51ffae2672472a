"""The engine container's command line: the adapter's, then the user's arguments, run through
a shell that first sources the env file the preflight container wrote."""

from __future__ import annotations

from pdd_contract.paths import ENV_FILE
from pdd_operator.api.v1alpha1 import PDDeploymentSpec
from pdd_operator.engines.base import EngineAdapter, EngineLaunch, role_spec
from pdd_operator.planning.kv_layout import chosen_block_tokens
from pdd_operator.planning.kv_offload import rendered_disk_tier, rendered_tier

# Sources the env file the preflight container wrote (UCX_NET_DEVICES for the GPUs this pod
# really got), then execs the engine with its arguments untouched ("$0" "$@").
SOURCE_ENV_AND_EXEC = f'set -a; if [ -f {ENV_FILE} ]; then . {ENV_FILE}; fi; set +a; exec "$0" "$@"'


def engine_launch(adapter: EngineAdapter, spec: PDDeploymentSpec, role: str) -> EngineLaunch:
    """The adapter's launch (with the prefill's CPU and disk tiers of the KV cache where
    spec.kvCache.offload renders them), then its KV block flags (spec.engine.kvBlockSize or the
    size planning.kv_layout chooses) and LoRA adapters (spec.model.adapters), then
    spec.engine.args and the role's args; spec.engine.command in place of its command when
    set."""
    base = adapter.launch(spec, role)
    tier = rendered_tier(spec, adapter, role)
    if tier is not None and tier.verdict.rendered:
        base = adapter.cpu_tier_launch(base, spec, tier.tier)
    disk = rendered_disk_tier(spec, adapter, role)
    if disk is not None and disk.verdict.rendered:
        base = adapter.disk_tier_launch(base, spec, disk.tier)
    blocks = spec.engine.kvBlockSize or chosen_block_tokens(spec, adapter)
    block_flags = adapter.block_flags(spec, blocks) if blocks else ()
    lora = adapter.lora_flags(spec)
    args = (*base.args, *block_flags, *lora, *spec.engine.args, *role_spec(spec, role).args)
    command = base.command if spec.engine.command is None else tuple(spec.engine.command)
    return EngineLaunch(command, args, base.env)


def wrap_with_env_file(
    command: tuple[str, ...], args: tuple[str, ...], rank_script: str = ""
) -> tuple[list[str], list[str]]:
    """Run `command args` through a shell that first sources the preflight env file (and,
    for a rank of a multi-node instance, appends the rank's flags: rendering.ranks)."""
    if not command:
        return list(command), list(args)
    script = SOURCE_ENV_AND_EXEC
    if rank_script:
        script = script.replace('exec "$0" "$@"', rank_script + 'exec "$0" "$@"')
    return ["/bin/sh", "-c", script], [*command, *args]
