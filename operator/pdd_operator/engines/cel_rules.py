"""How an adapter spells its own CEL rules on the PDDeployment spec: its reserved flags
(refused always, or while a field renders them) and its router's policies. Each adapter lists
its rules (``EngineAdapter.spec_rules``), the registry gathers them (``registry.spec_rules``),
so adding an engine touches its adapter and the registry, not the API module; api/v1alpha1.py
keeps the rules that hold for every engine, and the CRD carries both (api/crd.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pdd_operator.api.v1alpha1 import ALL_ARGS, POLICY_FIELDS, cel_list

Rule = tuple[str, str]  # (CEL over the spec, the message the API server answers with)
# spec.model.adapters lists at least one adapter.
ADAPTERS_LISTED = "(has(self.model.adapters) && size(self.model.adapters) > 0)"


def reserved_flags_rule(engine: str, flags: Mapping[str, str]) -> Rule:
    """Flags the adapter renders from spec fields, refused in the user's args with the field
    to set instead: a user's copy either contradicts the rendered one (the engine takes the
    last) or sizes the engine past its GPUs."""
    listed = cel_list(tuple(flags))
    instead = ", ".join(f"{flag} ({where})" for flag, where in flags.items())
    return (
        f"self.engine.type != '{engine}' || {_args_without(listed)}",
        f"spec.engine.args, spec.prefill.args or spec.decode.args set a flag the operator sets "
        f"for a {engine} engine; remove it (set the field named here instead): {instead}",
    )


def flags_refused_while(engine: str, when: str, flags: Sequence[str], message: str) -> Rule:
    """``flags`` refused in the args while the CEL condition ``when`` holds (a field that
    renders them is set); a user's own, without it, stay theirs."""
    listed = cel_list(tuple(flags))
    return (
        f"!{when} || self.engine.type != '{engine}' || {_args_without(listed)}",
        f"{message}: remove {', '.join(flags)} from spec.engine.args, spec.prefill.args and "
        "spec.decode.args",
    )


def env_refused_while(engine: str, when: str, names: Sequence[str], message: str) -> Rule:
    """Variables refused in the engine's and the prefill's env while the CEL condition
    ``when`` holds (a field that sets them is set): a user's entry would win over the
    rendered one (later in the list)."""
    listed = cel_list(tuple(names))
    return (
        f"!{when} || self.engine.type != '{engine}' || "
        # Two lists: the schema types their items apart, and CEL adds no such lists.
        f"self.engine.env.all(e, !(e.name in {listed})) && "
        f"self.prefill.env.all(e, !(e.name in {listed}))",
        f"{message}: remove {', '.join(names)} from spec.engine.env and spec.prefill.env",
    )


def _args_without(listed: str) -> str:
    return f"{ALL_ARGS}.all(a, !(a in {listed} || {listed}.exists(f, a.startsWith(f + '='))))"


def router_policy_rules(engine: str, policies: Sequence[str]) -> list[Rule]:
    """Each policy field: a policy the engine's router offers."""
    rules = []
    for name in POLICY_FIELDS:
        field = f"self.router.{name}"
        rules.append(
            (
                f"self.engine.type != '{engine}' || !has({field}) || "
                f"{field} in {cel_list(tuple(policies))}",
                f"spec.router.{name} must be one of the {engine} router's policies: "
                + ", ".join(policies),
            )
        )
    return rules


def tensor_size(role: str) -> str:
    """CEL: the role's TP size (parallelism.tensor, else the pod's GPUs)."""
    r = f"self.{role}"
    return f"(has({r}.parallelism) ? {r}.parallelism.tensor : {r}.gpusPerInstance)"
