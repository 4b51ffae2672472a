"""Placement planner (pure): put each prefill/decode slice into one topology domain.

Contract used by the reconciler:

    plan_placement(spec, nodes: Fleet | Sequence[NodeFacts], previous: PlacementStatus,
                   reserved=None, own=None, unschedulable=False) -> PlacementResult

`Fleet` indexes one snapshot of the nodes once (eligible nodes, domains per level) so that
planning every deployment against a 2,000-node fleet costs O(domains), not O(nodes).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from pdd_contract.labels import LABEL_GPUDIRECT
from pdd_contract.resources import GPU_RESOURCE
from pdd_operator.api import condition_reasons as reasons
from pdd_operator.api.v1alpha1 import PDDeploymentSpec, PlacementStatus, RoleSpec
from pdd_operator.planning.eligibility import RoleNodes, Taint, role_nodes


@dataclass(frozen=True)
class Placement:
    """Where the planner put the slice: a node-label domain, or nowhere in particular."""

    mode: str = "none"  # required | preferred | none
    level: str = ""  # node label key, e.g. nvidia.com/gpu.clique
    domain: str = ""  # its value
    node_requirements: tuple[tuple[str, tuple[str, ...]], ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class NodeFacts:
    """What the planner needs to know about one Node (built from the Node and bound pods)."""

    name: str
    labels: Mapping[str, str]
    allocatable_gpus: int
    used_gpus: int  # requested by bound, unfinished pods, ours too (Fleet.held says whose)
    ready: bool = True
    schedulable: bool = True
    taints: tuple[Taint, ...] = ()  # NoSchedule and NoExecute only (planning.eligibility)

    def takes(self, role: RoleNodes) -> bool:
        """Whether pods asking `role` of a node may be scheduled here."""
        return role.accepts(self.labels, self.taints)

    @property
    def free_gpus(self) -> int:
        return max(self.allocatable_gpus - self.used_gpus, 0)

    @property
    def gpudirect(self) -> str:
        """dmabuf | peermem | none | unknown (no topology agent label)."""
        return self.labels.get(LABEL_GPUDIRECT, "unknown")


@dataclass(frozen=True)
class PlacementResult:
    placed: bool
    placement: Placement
    reason: str  # CamelCase condition reason
    message: str
    nodes: tuple[str, ...] = field(default_factory=tuple)


# --- the planner -----------------------------------------------------------------------------

GPUDIRECT_CAPABLE = ("dmabuf", "peermem")


@dataclass(frozen=True)
class GpuDirectFilter:
    """Which `pdd.dev/gpudirect` values a node needs; empty `values` means no filter."""

    values: tuple[str, ...]
    adjective: str  # names an eligible node in messages: "dma-buf-capable", "ready", ...


@dataclass(frozen=True)
class _Domain:
    level: str
    name: str
    nodes: tuple[NodeFacts, ...]
    free: int


class _Group(NamedTuple):
    """Instances of one size, packed together by first-fit."""

    size: int  # GPUs per pod
    pods: int
    asks: RoleNodes | None = None  # what the pods ask of a node; None: as the other role's
    role: str = ""  # prefill or decode, where the two roles ask different nodes


Asks = tuple[RoleNodes, ...]  # what each role of a slice asks of a node, without repeats


@dataclass(frozen=True)
class _Fit:
    fits: bool
    nodes: tuple[str, ...] = ()  # nodes first-fit put at least one instance on, by name
    failed_group: int = -1  # index into the instance groups of the first one that did not fit


class Fleet:
    """One snapshot of the nodes, indexed for the planner and shared by every plan made from it.

    Eligible nodes and each level's domains (with their free GPUs) are computed once per
    GPUDirect filter and level, on first use. The snapshot is read-only: a deployment's own
    pods are handed to `plan_placement` separately (`own`) and only the domains they touch are
    recomputed.
    """

    def __init__(
        self,
        nodes: Iterable[NodeFacts],
        held: Mapping[tuple[str, str], Mapping[str, int]] | None = None,
    ) -> None:
        self.nodes: tuple[NodeFacts, ...] = tuple(nodes)
        # GPUs each deployment's bound pods hold per node, as counted in `used_gpus` above:
        # {(namespace, name): {node: gpus}} (see node_facts.GpuUsage).
        self.held: Mapping[tuple[str, str], Mapping[str, int]] = held or {}
        self.by_name = {n.name: n for n in self.nodes}
        self.has_gpudirect_labels = any(LABEL_GPUDIRECT in n.labels for n in self.nodes)
        self.usable = tuple(
            n for n in self.nodes if n.ready and n.schedulable and n.allocatable_gpus > 0
        )
        self._eligible: dict[tuple[tuple[str, ...], Asks | None], tuple[NodeFacts, ...]] = {}
        self._domains: dict[tuple[tuple[str, ...], Asks | None, str], list[_Domain]] = {}
        self._named: dict[tuple[tuple[str, ...], str], dict[str, _Domain]] = {}

    def eligible(self, values: tuple[str, ...], asks: Asks | None = None) -> tuple[NodeFacts, ...]:
        """Usable nodes whose `pdd.dev/gpudirect` is one of `values` (all when empty) and
        that the pods of at least one of `asks` may go to (None: whatever the pods ask)."""
        key = (values, asks)
        if key not in self._eligible:
            self._eligible[key] = tuple(
                n
                for n in self.usable
                if (not values or n.gpudirect in values)
                and (asks is None or any(n.takes(a) for a in asks))
            )
        return self._eligible[key]

    def domains(
        self,
        values: tuple[str, ...],
        level: str,
        own: Mapping[str, int],
        asks: Asks | None = None,
    ) -> list[_Domain]:
        """The level's domains of nodes eligible for `asks` (None: whatever the pods ask),
        fewest free GPUs first, with the GPUs that `own` (node name -> GPUs) holds counted as
        free."""
        key = (values, asks, level)
        if key not in self._domains:
            self._domains[key] = _domains(self.eligible(values, asks), level)
        base = self._domains[key]
        touched = self._touched(level, own)
        if not touched:
            return base
        regrouped = [
            _domain(d.level, d.name, _with_own(d.nodes, own)) if d.name in touched else d
            for d in base
        ]
        regrouped.sort(key=_best_fit_order)
        return regrouped

    def domain(
        self, values: tuple[str, ...], level: str, name: str, own: Mapping[str, int]
    ) -> _Domain | None:
        """One domain of `domains(values, level, own)` by name (None: no eligible node has
        it), without regrouping the others: a placed slice's every pass looks up its own."""
        key = (values, level)
        if key not in self._named:
            self._named[key] = {d.name: d for d in self.domains(values, level, {})}
        found = self._named[key].get(name)
        if found is None or name not in self._touched(level, own):
            return found
        return _domain(level, name, _with_own(found.nodes, own))

    def _touched(self, level: str, own: Mapping[str, int]) -> set[str]:
        """The level's domains that hold one of the nodes in `own`."""
        return {
            value
            for name in own
            if (node := self.by_name.get(name)) is not None and (value := node.labels.get(level))
        }


def _with_own(nodes: Iterable[NodeFacts], own: Mapping[str, int]) -> tuple[NodeFacts, ...]:
    """The nodes with the GPUs this deployment's own pods hold there counted as free: they are
    ours to place again, and counting them would move the slice out of its own domain."""
    return tuple(
        replace(n, used_gpus=max(n.used_gpus - own[n.name], 0)) if own.get(n.name) else n
        for n in nodes
    )


def gpudirect_filter(spec: PDDeploymentSpec, fleet: Fleet) -> GpuDirectFilter:
    """The GPUDirect eligibility a node needs for this spec (see spec.kvTransfer.gpuDirect)."""
    mode = spec.kvTransfer.gpuDirect
    if mode == "dmabuf":
        return GpuDirectFilter(("dmabuf",), "dma-buf-capable")
    if mode == "peermem":
        return GpuDirectFilter(("peermem",), "peermem-capable")
    rdma = spec.kvTransfer.rdma.resourceName is not None or spec.topology.dra.enabled
    # Without the topology agent no node says what it can do; filtering would block every
    # deployment on such clusters, so `auto` then trusts the scheduler.
    if mode == "auto" and rdma and fleet.has_gpudirect_labels:
        return GpuDirectFilter(GPUDIRECT_CAPABLE, "GPUDirect-capable")
    return GpuDirectFilter((), "ready")


def plan_placement(
    spec: PDDeploymentSpec,
    nodes: Fleet | Sequence[NodeFacts],
    previous: PlacementStatus,
    reserved: Mapping[tuple[str, str], int] | None = None,
    own: Mapping[str, int] | None = None,
    unschedulable: bool = False,
) -> PlacementResult:
    """Choose one topology domain for the whole slice (all prefill and decode instances).

    Levels are tried best first; within a level the feasible domain with the fewest free GPUs
    wins (big domains stay free for big deployments). The previous domain is kept while the
    slice can ever fit there (its nodes have enough GPUs in all), even while other pods hold
    them: moving the slice re-rolls every pod, and two deployments waiting for each other's
    domain would otherwise swap domains forever. `reserved` holds GPUs other deployments were
    placed on but are not yet bound, per (level, domain), so two new slices planned at once do
    not both count the same free GPUs. `own` maps node names to the GPUs this deployment's
    bound pods hold there; they count as free (the slice is re-placed as a whole).
    `unschedulable` (the scheduler refused one of the slice's pods) releases the kept domain
    when another domain has room now: the fleet facts are up to a second old, so a slice can
    be planned into GPUs another slice had just taken.
    """
    reserved = reserved or {}
    own = own or {}
    mode = spec.topology.placement
    if mode == "none":
        return PlacementResult(
            placed=True,
            placement=Placement(mode="none"),
            reason=reasons.PLACEMENT_DISABLED,
            message="spec.topology.placement is none: the scheduler puts prefill and decode "
            "pods on any node",
        )
    fleet = nodes if isinstance(nodes, Fleet) else Fleet(nodes)
    gpudirect = gpudirect_filter(spec, fleet)
    requirements = ((LABEL_GPUDIRECT, gpudirect.values),) if gpudirect.values else ()
    unplaced = Placement(mode=mode, node_requirements=requirements)
    by_role = _asks_by_role(spec)
    groups = _instance_groups(spec, by_role)
    needed = _gpus(groups)
    running = _still_running(spec, fleet, gpudirect, previous, own, needed, requirements)
    if running is not None:
        return running

    asks = _distinct(by_role)
    if not fleet.eligible(gpudirect.values):
        refusal: str | None = _no_eligible_message(spec, fleet.nodes, fleet.usable)
    else:
        refusal = _refused_by_a_role(spec, fleet, gpudirect, by_role)
    if refusal is not None:
        return PlacementResult(
            placed=False, placement=unplaced, reason=reasons.NO_ELIGIBLE_NODES, message=refusal
        )
    eligible = fleet.eligible(gpudirect.values, asks)

    levels = list(dict.fromkeys(spec.topology.levels))
    domains = {level: fleet.domains(gpudirect.values, level, own, asks) for level in levels}
    who = _roles_phrase(spec)

    def placed(domain: _Domain, fit: _Fit) -> PlacementResult:
        return PlacementResult(
            placed=True,
            placement=Placement(
                mode=mode, level=domain.level, domain=domain.name, node_requirements=requirements
            ),
            reason=reasons.PLACED,
            message=f"{who} placed in {domain.level}={domain.name} ({needed} GPUs needed, "
            f"{domain.free} free on {_count(len(domain.nodes), gpudirect.adjective)})",
            nodes=fit.nodes,
        )

    sticky = next(
        (d for d in domains.get(previous.level, []) if d.name == previous.domain and d.name), None
    )
    if sticky is not None:
        fit = _first_fit(groups, sticky.nodes)
        if fit.fits:
            return placed(sticky, fit)
        capacity = sum(n.allocatable_gpus for n in sticky.nodes)
        ever_fits = _first_fit(groups, [replace(n, used_gpus=0) for n in sticky.nodes]).fits
        room_elsewhere = unschedulable and any(
            _has_room(d, groups, needed, reserved)
            for level in levels
            for d in domains[level]
            if d is not sticky
        )
        if ever_fits and not room_elsewhere:
            return PlacementResult(
                placed=True,
                placement=Placement(
                    mode=mode, level=sticky.level, domain=sticky.name,
                    node_requirements=requirements,
                ),
                reason=reasons.WAITING_FOR_CAPACITY,
                message=f"{who} kept in {sticky.level}={sticky.name}: waiting for GPUs there "
                f"({needed} needed, {sticky.free} free now, {capacity} in all)",
            )  # fmt: skip
    for level in levels:
        for domain in domains[level]:  # fewest free GPUs first: best fit
            if domain is not sticky and _has_room(domain, groups, needed, reserved):
                return placed(domain, _first_fit(groups, domain.nodes))

    first = next((level for level in levels if domains[level]), None)
    if first is None:
        return _without_domains(
            spec, groups, _with_own(eligible, own), unplaced, gpudirect.adjective
        )
    largest = min(domains[first], key=lambda d: (-d.free, d.name))
    message = (
        f"no {first} has {needed} free GPUs on {gpudirect.adjective} nodes; "
        f"largest has {largest.free}"
    )
    if largest.free >= needed:
        message += f" but {_fragmentation(groups, largest.nodes)}"
    return PlacementResult(
        placed=False, placement=unplaced, reason=reasons.INSUFFICIENT_CAPACITY, message=message
    )


def fits_domain(
    spec: PDDeploymentSpec,
    fleet: Fleet,
    level: str,
    domain: str,
    reserved: Mapping[tuple[str, str], int] | None = None,
    own: Mapping[str, int] | None = None,
) -> bool:
    """Whether the whole slice at the spec's counts fits that one domain now: its free GPUs
    (those `own` pods hold counted free) less what other deployments reserved there. The
    autoscaler grows a placed slice only this far, so a scaling step never moves it (a move
    re-rolls every pod) and two scale-ups at once cannot both take the same free GPUs."""
    gpudirect = gpudirect_filter(spec, fleet)
    by_role = _asks_by_role(spec)
    domains = fleet.domains(gpudirect.values, level, own or {}, _distinct(by_role))
    found = next((d for d in domains if d.name == domain), None)
    if found is None:
        return False
    groups = _instance_groups(spec, by_role)
    return _has_room(found, groups, _gpus(groups), reserved or {})


def ranked_domains(
    spec: PDDeploymentSpec, fleet: Fleet, level: str, own: Mapping[str, int] | None = None
) -> list[str]:
    """The level's domains of nodes eligible for the spec, best first as plan_placement ranks
    them (fewest free GPUs first: big domains stay free for big slices). Where a deployment
    grows by a slice, the first of these that holds the growth takes it (planning.slices)."""
    gpudirect = gpudirect_filter(spec, fleet)
    asks = _distinct(_asks_by_role(spec))
    return [d.name for d in fleet.domains(gpudirect.values, level, own or {}, asks)]


def _has_room(
    domain: _Domain,
    groups: Sequence[_Group],
    needed: int,
    reserved: Mapping[tuple[str, str], int],
) -> bool:
    """Whether the instances fit the domain's free GPUs now, less those reserved there."""
    if domain.free - reserved.get((domain.level, domain.name), 0) < needed:
        return False
    return _first_fit(groups, domain.nodes).fits


def _instance_groups(spec: PDDeploymentSpec, asks: Mapping[str, RoleNodes]) -> tuple[_Group, ...]:
    """The slice's pods by size, largest first: the first-fit-decreasing order. An instance
    over several nodes is that many pods, each on a node of its own (its GPUs per node).
    Where the two roles ask different nodes (nodeSelector, tolerations) each role's pods are
    a group of their own, packed only onto the nodes they may go to."""
    shared = len(set(asks.values())) == 1
    roles = [(name, role) for name, role in _roles(spec) if role.replicas]
    counts: dict[tuple[int, str], int] = {}
    for name, role in roles:
        key = (role.gpusPerInstance, "" if shared else name)
        counts[key] = counts.get(key, 0) + role.replicas * role.nodesPerInstance
    groups = [
        _Group(size, count, asks[role] if role else None, role)
        for (size, role), count in counts.items()
    ]
    return tuple(sorted(groups, key=lambda g: (-g.size, -g.pods)))


def _roles(spec: PDDeploymentSpec) -> tuple[tuple[str, RoleSpec], ...]:
    return (("prefill", spec.prefill), ("decode", spec.decode))


def _asks_by_role(spec: PDDeploymentSpec) -> dict[str, RoleNodes]:
    """What each role's pods ask of a node, whether or not it has replicas now (a slice grown
    from zero has both roles, and its domain stays the one they may go to)."""
    gpu_pods = not spec.topology.dra.enabled
    return {name: role_nodes(role, gpu_pods) for name, role in _roles(spec)}


def _distinct(by_role: Mapping[str, RoleNodes]) -> Asks:
    """What the roles ask of a node, each once."""
    return tuple(dict.fromkeys(by_role.values()))


def _gpus(groups: Iterable[_Group]) -> int:
    return sum(g.size * g.pods for g in groups)


def _domains(eligible: Sequence[NodeFacts], level: str) -> list[_Domain]:
    """Eligible nodes grouped by the level's label value; fewest free GPUs first, then by name."""
    members: dict[str, list[NodeFacts]] = {}
    for node in eligible:
        value = node.labels.get(level)
        if value:
            members.setdefault(value, []).append(node)
    domains = [_domain(level, name, group) for name, group in members.items()]
    domains.sort(key=_best_fit_order)
    return domains


def _domain(level: str, name: str, nodes: Iterable[NodeFacts]) -> _Domain:
    members = tuple(nodes)
    return _Domain(level, name, members, sum(n.free_gpus for n in members))


def _best_fit_order(domain: _Domain) -> tuple[int, str]:
    return (domain.free, domain.name)


def _first_fit(groups: Sequence[_Group], nodes: Sequence[NodeFacts]) -> _Fit:
    """First-fit decreasing of the instances into the nodes' free GPUs (most free first).

    Instances of one size are placed as a run: first-fit puts each into the first node with
    room, and a node that had no room for one has none for the next, so one pass over the
    nodes per size gives the same packing in O(nodes) instead of O(instances x nodes).
    A group whose role asks particular nodes skips the others.
    """
    order = sorted(nodes, key=lambda n: (-n.free_gpus, n.name))
    free = [n.free_gpus for n in order]
    used = [False] * len(order)
    for index, (size, count, asks, _) in enumerate(groups):
        left = count
        for i in _visiting_order(order, asks, groups[index + 1 :]):
            if left == 0:
                break
            room = free[i]
            take = min(left, room // size)
            if take:
                free[i] -= take * size
                left -= take
                used[i] = True
        if left:
            return _Fit(fits=False, failed_group=index)
    return _Fit(
        fits=True, nodes=tuple(sorted(n.name for n, u in zip(order, used, strict=True) if u))
    )


def _visiting_order(
    order: Sequence[NodeFacts], asks: RoleNodes | None, later: Sequence[_Group]
) -> Iterable[int]:
    """The nodes a group's pods may go to, those no later group may use first: a role with
    nodes of its own fills them before the ones the other role needs too."""
    if asks is None:
        return range(len(order))
    others = [g.asks for g in later if g.asks is not None and g.asks != asks]
    mine = [i for i, node in enumerate(order) if node.takes(asks)]
    if not others:
        return mine
    return sorted(mine, key=lambda i: any(order[i].takes(a) for a in others))


def _fragmentation(groups: Sequence[_Group], nodes: Sequence[NodeFacts]) -> str:
    """Why enough free GPUs still do not hold the instances (first-fit failed)."""
    fit = _first_fit(groups, nodes)
    index = max(fit.failed_group, 0)
    size, count, asks, role = groups[index]
    where = f"node the {role} pods may go to" if role else "node"
    instances = f"{size}-GPU {role} instances" if role else f"{size}-GPU instances"
    if index == 0:
        takers = [n for n in nodes if asks is None or n.takes(asks)]
        capacity = sum(n.free_gpus // size for n in takers)
        if capacity == 0:
            return f"no {where} has {size} free"
        holders = f"the {where}s" if role else "its nodes"
        return f"{holders} fit only {capacity} of the {count} {instances}"
    before = _and_list(list(dict.fromkeys(_instances(g) for g in groups[:index])))
    return f"after the {before} instances no {where} has {size} free"


def _instances(group: _Group) -> str:
    return f"{group.size}-GPU {group.role}" if group.role else f"{group.size}-GPU"


def _without_domains(
    spec: PDDeploymentSpec,
    groups: Sequence[_Group],
    eligible: Sequence[NodeFacts],
    unplaced: Placement,
    adjective: str,
) -> PlacementResult:
    """No eligible node carries any level label: place across the cluster if it fits."""
    levels = spec.topology.levels
    why = (
        f"no {adjective} node carries {_or_list(levels)}"
        if levels
        else "spec.topology.levels is empty"
    )
    needed = _gpus(groups)
    free = sum(n.free_gpus for n in eligible)
    on = f"{free} free on the {_count(len(eligible), adjective)}"
    fit = _first_fit(groups, eligible)
    if fit.fits:
        return PlacementResult(
            placed=True,
            placement=unplaced,
            reason=reasons.NO_TOPOLOGY_LABELS,
            message=f"{why}, so the pods are not kept in one topology domain ({needed} GPUs "
            f"needed, {on}); label the nodes (GPU feature discovery sets nvidia.com/gpu.clique) "
            "or set spec.topology.levels",
            nodes=fit.nodes,
        )
    shortage = f"not enough free GPUs: {needed} needed, {on}"
    if free >= needed:
        shortage += f", and {_fragmentation(groups, eligible)}"
    return PlacementResult(
        placed=False,
        placement=unplaced,
        reason=reasons.INSUFFICIENT_CAPACITY,
        message=f"{shortage}; {why}",
    )


def _no_eligible_message(
    spec: PDDeploymentSpec, nodes: Sequence[NodeFacts], usable: Sequence[NodeFacts]
) -> str:
    if not usable:
        gpu_nodes = [n for n in nodes if n.allocatable_gpus > 0]
        if not gpu_nodes:
            return (
                f"no node has {GPU_RESOURCE} allocatable: install the NVIDIA device plugin "
                "(e.g. with the GPU operator) and check that the GPU nodes joined the cluster"
            )
        not_ready = sum(1 for n in gpu_nodes if not n.ready)
        cordoned = sum(1 for n in gpu_nodes if n.ready and not n.schedulable)
        return (
            f"none of the {len(gpu_nodes)} GPU nodes is ready and schedulable "
            f"({not_ready} not ready, {cordoned} cordoned)"
        )
    mode = spec.kvTransfer.gpuDirect
    if mode == "dmabuf":
        message = (
            "no node is dma-buf capable: GPUDirect dma-buf needs Linux >= 5.12 and the NVIDIA "
            "open kernel module; set spec.kvTransfer.gpuDirect to auto or peermem"
        )
    elif mode == "peermem":
        message = (
            "no node has nvidia-peermem loaded: load the nvidia-peermem kernel module (GPU "
            "operator: driver.rdma.enabled=true); set spec.kvTransfer.gpuDirect to auto or dmabuf"
        )
    else:
        message = (
            "no node is GPUDirect RDMA capable: dma-buf needs Linux >= 5.12 and the NVIDIA open "
            "kernel module, peermem needs the nvidia-peermem module; set "
            "spec.kvTransfer.gpuDirect to off to move KV blocks through host memory"
        )
    return f"{message}. {_gpudirect_summary(usable)}"


def _refused_by_a_role(
    spec: PDDeploymentSpec,
    fleet: Fleet,
    gpudirect: GpuDirectFilter,
    by_role: Mapping[str, RoleNodes],
) -> str | None:
    """For the first role whose pods may go to none of the candidate nodes (ready, GPUDirect
    eligible): which labels or taints keep them off, on which nodes, and what to change."""
    candidates = fleet.eligible(gpudirect.values)
    for name, role in _roles(spec):
        asks = by_role[name]
        if not role.replicas or fleet.eligible(gpudirect.values, (asks,)):
            continue
        why: dict[str, list[str]] = {}
        for node in candidates:
            why.setdefault(asks.refusal(node.labels, node.taints) or "", []).append(node.name)
        causes = "; ".join(
            f"{_count(len(nodes))} {reason} ({_sample(sorted(nodes))})"
            for reason, nodes in sorted(why.items())
        )
        return (
            f"none of the {_count(len(candidates), gpudirect.adjective)} takes the {name} pods: "
            f"{causes}; {_fix_for(name, role, why)}"
        )
    return None


def _fix_for(name: str, role: RoleSpec, why: Mapping[str, object]) -> str:
    """What to change, by what kept the pods off: labels, taints or both."""
    fixes = []
    if any(reason.startswith("with the taint") for reason in why):
        template = (role.podTemplate or {}).get("spec")
        where = (
            f"spec.{name}.podTemplate.spec.tolerations (they replace spec.{name}.tolerations)"
            if isinstance(template, Mapping) and "tolerations" in template
            else f"spec.{name}.tolerations"
        )
        fixes.append(f"add the toleration to {where}")
    if any(reason.startswith("without the label") for reason in why):
        fixes.append(f"change spec.{name}.nodeSelector or label the nodes")
    return ", or ".join(fixes)


def _gpudirect_summary(usable: Sequence[NodeFacts]) -> str:
    """What the ready GPU nodes say, e.g. `pdd.dev/gpudirect=peermem on a1, a2 and 1 more`."""
    by_value: dict[str, list[str]] = {}
    for node in usable:
        by_value.setdefault(node.gpudirect, []).append(node.name)
    if set(by_value) == {"unknown"}:
        return f"No ready GPU node carries {LABEL_GPUDIRECT}: is the pdd topology agent running?"
    parts = [
        f"{LABEL_GPUDIRECT}={value} on {_sample(sorted(names))}"
        for value, names in sorted(by_value.items())
    ]
    return "Ready GPU nodes: " + "; ".join(parts)


def _still_running(
    spec: PDDeploymentSpec,
    fleet: Fleet,
    gpudirect: GpuDirectFilter,
    previous: PlacementStatus,
    own: Mapping[str, int],
    needed: int,
    requirements: tuple[tuple[str, tuple[str, ...]], ...],
) -> PlacementResult | None:
    """The slice placed before, running in its domain. Its bound pods were admitted by the
    scheduler, with tolerations the planner may not see (a Kueue flavor's, a webhook's), so
    the domain is judged on every node there, whatever the roles seem to ask."""
    if not previous.domain:
        return None
    found = fleet.domain(gpudirect.values, previous.level, previous.domain, own)
    return _running_in(spec, found, own, needed, requirements) if found else None


def _running_in(
    spec: PDDeploymentSpec,
    domain: _Domain,
    own: Mapping[str, int],
    needed: int,
    requirements: tuple[tuple[str, tuple[str, ...]], ...],
) -> PlacementResult | None:
    """The slice's bound pods already hold every GPU it needs: it is placed where they run,
    whatever the room left around them (other tenants' pods come and go; a status that
    followed them would be rewritten, and could say "waiting" of a slice that serves).
    With `preferred` the scheduler may have put some outside the domain; that is said. An
    autoscaled deployment's pods may belong to slices beyond this one: only those in the
    domain count for it."""
    inside = {n.name for n in domain.nodes}
    held_inside = sum(gpus for name, gpus in own.items() if name in inside)
    outside = sum(gpus for name, gpus in own.items() if name not in inside)
    whole = spec.autoscaling is None and spec.topology.placement == "preferred"
    if held_inside < needed and not (whole and held_inside + outside >= needed):
        return None
    nodes = tuple(sorted(name for name, gpus in own.items() if gpus and name in inside))
    where = f"{domain.level}={domain.name}"
    message = f"{_roles_phrase(spec)} running in {where} ({needed} GPUs on {len(nodes)} nodes"
    if held_inside < needed:
        message += f"; {needed - held_inside} on nodes outside it, as preferred placement allows"
    return PlacementResult(
        placed=True,
        placement=Placement(
            mode=spec.topology.placement,
            level=domain.level,
            domain=domain.name,
            node_requirements=requirements,
        ),
        reason=reasons.PLACED,
        message=message + ")",
        nodes=nodes,
    )


def _roles_phrase(spec: PDDeploymentSpec) -> str:
    roles = [r for r, s in (("prefill", spec.prefill), ("decode", spec.decode)) if s.replicas]
    return " and ".join(roles) or "nothing"


def _count(n: int, adjective: str = "") -> str:
    noun = "node" if n == 1 else "nodes"
    return f"{n} {adjective} {noun}" if adjective else f"{n} {noun}"


def _sample(names: Sequence[str], limit: int = 3) -> str:
    if len(names) > limit:
        return ", ".join(names[:limit]) + f" and {len(names) - limit} more"
    return _and_list(names)


def _and_list(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _or_list(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]
