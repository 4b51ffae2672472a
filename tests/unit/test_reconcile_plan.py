"""The pure plan of a pass (pdd_operator.reconcile.plan) and the memory it reads: the plan
decides counts, placement and the render context from the spec, the view and the memory
without writing anything; `commit` writes the reservation and the slices once; a
deployment's record lives from its first pass until it is forgotten."""

from __future__ import annotations

import copy
from typing import Any

from helpers.factories import BASE_BODY
from helpers.fake_cluster import FakeCluster
from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.planning.placement import Fleet, NodeFacts
from pdd_operator.planning.reservations import Reservation
from pdd_operator.reconcile.memory import Memory
from pdd_operator.reconcile.plan import commit, plan_pass
from pdd_operator.rendering.context import OperatorSettings

KEY = ("team-a", "llama")
LEVEL = "nvidia.com/gpu.clique"


def body(placement: str = "required") -> dict[str, Any]:
    result = copy.deepcopy(BASE_BODY)
    result["metadata"].update(name="llama", uid="uid-llama", resourceVersion="1")
    result["spec"].update(
        prefill={"replicas": 1, "gpusPerInstance": 1},
        decode={"replicas": 2, "gpusPerInstance": 1},
        topology={"placement": placement, "levels": [LEVEL]},
    )
    return result


def cluster(placement: str = "required") -> FakeCluster:
    fake = FakeCluster(body(placement))
    fake.fleet_snapshot = Fleet(
        NodeFacts(f"node-{clique}", {LEVEL: clique}, gpus, 0)
        for clique, gpus in (("a", 4), ("b", 8))
    )
    return fake


def plan_of(fake: FakeCluster, memory: Memory, placement: str = "required") -> Any:
    pdd = PDDeployment.from_body(body(placement))
    record = memory.record(KEY)
    observed = fake.children(KEY)
    return plan_pass(pdd, fake, observed, record, memory.reservations, OperatorSettings())


def test_the_plan_reserves_nothing_until_it_is_committed() -> None:
    fake, memory = cluster(), Memory()
    plan = plan_of(fake, memory)
    assert plan.placement.placed
    assert plan.home_mark == Reservation(LEVEL, plan.placement.placement.domain, 3)
    assert memory.reservations.get(KEY) is None  # planning wrote nothing
    assert plan_of(fake, memory) == plan  # the same inputs, the same plan
    commit(plan, memory.record(KEY), memory.reservations)
    assert memory.reservations.get(KEY) == plan.home_mark


def test_a_deployment_placed_nowhere_gives_back_its_reservation() -> None:
    fake, memory = cluster(), Memory()
    commit(plan_of(fake, memory), memory.record(KEY), memory.reservations)
    assert memory.reservations.get(KEY) is not None
    plan = plan_of(cluster("none"), memory, "none")
    assert plan.home_mark is None
    commit(plan, memory.record(KEY), memory.reservations)
    assert memory.reservations.get(KEY) is None


def test_a_record_lives_from_the_first_pass_until_the_deployment_is_forgotten() -> None:
    fake, memory = cluster(), Memory()
    assert memory.keys() == set()
    record = memory.record(KEY)
    record.model_attempts = 3
    assert memory.record(KEY) is record
    commit(plan_of(fake, memory), record, memory.reservations)
    memory.forget(KEY)
    assert memory.keys() == set()
    assert memory.record(KEY).model_attempts == 0  # a new record
    assert memory.reservations.get(KEY) is None
