"""Per-role autoscaling policy (pure): from what each role's scale target asks to the replica
counts the operator runs (docs/autoscaling.md).

A scale target (a PDDRoleScaler) exists for every role listed in spec.autoscaling that is not
the follower. Its spec.replicas is what the HPA, KEDA or `kubectl scale` asked for; this module
turns the asks into counts:

- each asked count is kept within its role's minReplicas..maxReplicas;
- a follower runs ceil(leader * its ratio share), within its own bounds, and 0 while the
  leader is at 0 (a prefill without a decode, or the reverse, serves nothing);
- with no follower and both roles scaled, the counts are brought inside ratioBounds in the
  same step: the role that is short is raised (scaling up never takes capacity away), and
  only where it is at its maxReplicas is the other lowered.

The result is applied in one pass, so the ratio is outside its bounds at most between a
target's write and the operator's next pass: one scaling step.

Two rules only cut growth, never what runs: `fit_to_room` (the slice's domain has no room
for more) and `hold_decode_growth` (the KV path is degraded: more decodes behind a transfer
that fell back to TCP do not lower time to first token).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from pdd_operator.api.names import ROLES
from pdd_operator.api.v1alpha1 import AutoscalingSpec, PDDeploymentSpec, RoleAutoscaling

# Bounds of a role that spec.autoscaling does not list (a follower may leave them out).
_UNBOUNDED = RoleAutoscaling(minReplicas=0, maxReplicas=512)

# An autoscaled deployment's router is Ready without workers (rendering.router), so neither
# its readiness nor its Service shows when it has found an engine pod. The upstream routers
# find pods through their own Kubernetes discovery and register one a second or two after it
# turns Ready (smg 1.13.0 here: 1-2 s, one pass of its worker registration). So a new router
# pod turns Ready only this long after it starts, and an engine pod counts as ready in the
# deployment's status only this long after it turned Ready: Ready means the router can send
# to it.
DISCOVERY_GRACE_S = 10


def discovery_wait(ready_since: float, now: float) -> float:
    """Seconds until the routers may be taken to have found a pod that turned Ready at
    `ready_since` (epoch seconds; 0 when unknown: taken as found)."""
    if ready_since <= 0:
        return 0.0
    return max(ready_since + DISCOVERY_GRACE_S - now, 0.0)


@dataclass(frozen=True)
class ScalingPlan:
    """The counts to run per role, and why a count differs from its target's ask."""

    replicas: Mapping[str, int]
    notes: Mapping[str, str] = field(default_factory=dict)
    held: str = ""  # why decode's growth is held (hold_decode_growth); "" when it is not

    @property
    def scaled_to_zero(self) -> bool:
        return all(self.replicas[role] == 0 for role in ROLES)


def scale_target_roles(spec: PDDeploymentSpec) -> tuple[str, ...]:
    """The roles that get a PDDRoleScaler: listed in spec.autoscaling and not the follower."""
    auto = spec.autoscaling
    if auto is None:
        return ()
    return tuple(
        role for role in ROLES if _bounds_of(auto, role) is not None and auto.follower != role
    )


def initial_replicas(spec: PDDeploymentSpec, role: str) -> int:
    """What a new scale target starts at: spec.<role>.replicas, within the role's bounds."""
    return _clamp(_role_spec_replicas(spec, role), _bounds(spec, role))


def plan_scaling(spec: PDDeploymentSpec, asked: Mapping[str, int]) -> ScalingPlan:
    """The counts to run, from the scale targets' asks (role -> spec.replicas of its
    PDDRoleScaler; a target not created yet asks for its initial count)."""
    auto = spec.autoscaling
    if auto is None:
        return ScalingPlan({role: _role_spec_replicas(spec, role) for role in ROLES})
    wanted = {
        role: asked.get(role, initial_replicas(spec, role)) for role in scale_target_roles(spec)
    }
    counts = {role: _clamp(n, _bounds(spec, role)) for role, n in wanted.items()}
    notes = {
        role: _clamp_note(wanted[role], counts[role], _bounds(spec, role))
        for role in counts
        if counts[role] != wanted[role]
    }
    for role in ROLES:
        if role not in counts and _bounds_of(auto, role) is None:
            counts[role] = _role_spec_replicas(spec, role)  # not autoscaled: as spec says
    if auto.follower != "none":
        counts[auto.follower] = _follow(spec, auto, counts)
    elif len(scale_target_roles(spec)) == len(ROLES):
        before = dict(counts)
        counts = _within_ratio_bounds(spec, auto, counts)
        for role in ROLES:
            if counts[role] != before[role]:
                notes[role] = _ratio_note(auto, before, counts)
    return ScalingPlan(counts, notes)


def with_replicas(spec: PDDeploymentSpec, replicas: Mapping[str, int]) -> PDDeploymentSpec:
    """The spec as the rest of the operator reads it: the roles at the counts being run."""
    if all(_role_spec_replicas(spec, role) == replicas[role] for role in ROLES):
        return spec
    return spec.model_copy(
        update={
            role: getattr(spec, role).model_copy(update={"replicas": replicas[role]})
            for role in ROLES
        }
    )


def leader_role(spec: PDDeploymentSpec) -> str:
    """The role with the scale target where the other follows it (decode unless decode
    follows)."""
    auto = spec.autoscaling
    return "prefill" if auto is not None and auto.follower == "decode" else "decode"


def follower_replicas(spec: PDDeploymentSpec, leader: int) -> int:
    """The follower's count for `leader` pods of the leader, at the ratio and within the
    follower's bounds (the count of one slice, or of the whole deployment)."""
    auto = spec.autoscaling
    if auto is None or auto.follower == "none":
        raise ValueError("follower_replicas needs spec.autoscaling.follower")
    return _follow(spec, auto, {leader_role(spec): leader})


def _follow(spec: PDDeploymentSpec, auto: AutoscalingSpec, counts: Mapping[str, int]) -> int:
    follower, leader = auto.follower, leader_role(spec)
    if counts[leader] == 0:
        return 0
    share = Fraction(getattr(auto.ratio, follower), getattr(auto.ratio, leader))
    return _clamp(math.ceil(counts[leader] * share), _bounds(spec, follower))


def _within_ratio_bounds(
    spec: PDDeploymentSpec, auto: AutoscalingSpec, counts: Mapping[str, int]
) -> dict[str, int]:
    """Prefill per decode within [min, max]: raise the short role first, then lower the other
    where the short one is at its maxReplicas. Both at 0 is in bounds (scaled to zero)."""
    low = Fraction(str(auto.ratioBounds.minPrefillPerDecode))
    high = Fraction(str(auto.ratioBounds.maxPrefillPerDecode))
    p, d = counts["prefill"], counts["decode"]
    pb, db = _bounds(spec, "prefill"), _bounds(spec, "decode")
    if p == 0 and d == 0:
        return dict(counts)
    if p < math.ceil(d * low):  # too few prefills
        p = min(math.ceil(d * low), pb.maxReplicas)
        if p < math.ceil(d * low):
            d = max(math.floor(p / low), db.minReplicas)
    if p > math.floor(d * high):  # too few decodes
        d = min(max(math.ceil(p / high), 1), db.maxReplicas)
        if p > math.floor(d * high):
            p = max(math.floor(d * high), pb.minReplicas)
    return {"prefill": p, "decode": d}


def _bounds_of(auto: AutoscalingSpec, role: str) -> RoleAutoscaling | None:
    bounds: RoleAutoscaling | None = getattr(auto, role)
    return bounds


def _bounds(spec: PDDeploymentSpec, role: str) -> RoleAutoscaling:
    auto = spec.autoscaling
    return (_bounds_of(auto, role) if auto is not None else None) or _UNBOUNDED


def _role_spec_replicas(spec: PDDeploymentSpec, role: str) -> int:
    return int(getattr(spec, role).replicas)


def _clamp(n: int, bounds: RoleAutoscaling) -> int:
    return min(max(n, bounds.minReplicas), bounds.maxReplicas)


def _clamp_note(asked: int, got: int, bounds: RoleAutoscaling) -> str:
    which = "maxReplicas" if asked > got else "minReplicas"
    return f"asked for {asked}, runs {got}: spec.autoscaling {which} is {getattr(bounds, which)}"


def _ratio_note(auto: AutoscalingSpec, before: Mapping[str, int], after: Mapping[str, int]) -> str:
    b = auto.ratioBounds
    return (
        f"prefill:decode {before['prefill']}:{before['decode']} is outside "
        f"spec.autoscaling.ratioBounds ({b.minPrefillPerDecode:g} to "
        f"{b.maxPrefillPerDecode:g} prefill per decode): runs {after['prefill']}:"
        f"{after['decode']}"
    )


def fit_to_room(
    spec: PDDeploymentSpec,
    asked: Mapping[str, int],
    running: Mapping[str, int],
    fits: Callable[[Mapping[str, int]], bool],
    where: str,
) -> ScalingPlan:
    """The plan for `asked`, its growth cut back until `fits` (the counts fit the domain the
    slice runs in, `where`), for a deployment that cannot grow by slices (planning.slices).
    Only growth is cut: no role goes below what it runs now, and a shrinking role is never
    held up. The ask that is cut is the target whose role grows the
    most, one pod at a time, so a follower shrinks with its leader."""
    plan = plan_scaling(spec, asked)
    asks = {role: plan.replicas[role] for role in scale_target_roles(spec)}
    cut: set[str] = set()
    while not fits(plan.replicas):
        growing = [r for r in asks if plan.replicas[r] > running.get(r, 0)]
        if not growing:
            break  # only what already runs is left: nothing to cut
        role = max(growing, key=lambda r: plan.replicas[r] - running.get(r, 0))
        asks[role] -= 1
        cut.add(role)
        plan = plan_scaling(spec, asks)
    if not cut:
        return plan
    notes = dict(plan.notes)
    for role in cut:
        notes[role] = (
            f"asked for {asked.get(role, initial_replicas(spec, role))}, runs "
            f"{plan.replicas[role]}: no room for more in {where} (growing into another "
            "domain needs spec.autoscaling.follower, so that each slice keeps the ratio: "
            "set it, raise capacity there or lower the ask)"
        )
    return ScalingPlan(plan.replicas, notes)


@dataclass(frozen=True)
class GrowthHold:
    """The asks to plan with once decode's growth is held, and why ("" when nothing is)."""

    asks: Mapping[str, int]
    cut: frozenset[str] = frozenset()  # the targets whose ask was lowered
    why: str = ""


def hold_decode_growth(
    spec: PDDeploymentSpec,
    asked: Mapping[str, int],
    running: Mapping[str, int],
    path_problem: str,
) -> GrowthHold:
    """The asks lowered so that decode runs no more than it runs now, while the KV path is
    degraded (`path_problem` says how; "" while it is verified or not measured yet) and
    spec.autoscaling.kvTransferGuard is on.

    Decode's own ask is lowered first, then the other target's (a decode that follows
    prefill, or ratioBounds raising decode after prefill grew), never below what runs:
    scaling down is not held. With nothing running yet there is no scale-up to hold."""
    targets = scale_target_roles(spec)
    asks = {role: asked.get(role, initial_replicas(spec, role)) for role in targets}
    auto = spec.autoscaling
    limit = running.get("decode")
    if auto is None or not auto.kvTransferGuard or not path_problem or limit is None:
        return GrowthHold(asks)
    wanted = plan_scaling(spec, asks).replicas["decode"]
    if wanted <= limit:
        return GrowthHold(asks)
    asks = {role: _clamp(n, _bounds(spec, role)) for role, n in asks.items()}
    cut: set[str] = set()
    for role in sorted(targets, key=lambda r: r != "decode"):
        while plan_scaling(spec, asks).replicas["decode"] > limit and asks[role] > running.get(
            role, 0
        ):
            asks[role] -= 1
            cut.add(role)
    if not cut:
        return GrowthHold(asks)
    why = (
        f"decode scale-up from {limit} to {wanted} held: the KV transfer path is degraded "
        f"({path_problem}), and decodes added behind it do not lower time to first token. "
        "Fix the path (status.transfer and the KVTransferVerified condition say what was "
        "measured and what to change); scaling resumes once a probe verifies it. To scale "
        "regardless, set spec.autoscaling.kvTransferGuard: false"
    )
    return GrowthHold(asks, frozenset(cut), why)


def with_hold(plan: ScalingPlan, hold: GrowthHold, asked: Mapping[str, int]) -> ScalingPlan:
    """The plan made from a hold's asks, saying on each cut target why it runs less than it
    asked for."""
    if not hold.cut:
        return plan
    notes = dict(plan.notes)
    for role in hold.cut:
        notes[role] = (
            f"asked for {asked.get(role, hold.asks[role])}, runs {plan.replicas[role]}: "
            "decode does not scale up while the KV transfer path is degraded "
            "(the PDDeployment's ScalingHeld condition says why)"
        )
    return ScalingPlan(plan.replicas, notes, held=hold.why)
