"""Rollouts replace whole instances, one at a time (planning.instance_rollout)."""

from __future__ import annotations

from dataclasses import dataclass

from pdd_operator.planning.instance_rollout import RoleShape, next_instance_to_replace

NODES = {"prefill": RoleShape(instances=2, nodes=2), "decode": RoleShape(instances=2, nodes=2)}


@dataclass(frozen=True)
class Pod:
    role: str
    instance: str
    rank: int
    revision: str = "old"
    ready: bool = True
    terminating: bool = False

    @property
    def name(self) -> str:
        return f"x-{self.role}-{self.instance}-{self.rank}"

    @property
    def uid(self) -> str:
        return f"uid-{self.name}"


def instance(role: str, index: int, **fields: object) -> list[Pod]:
    return [Pod(role, str(index), rank, **fields) for rank in range(2)]  # type: ignore[arg-type]


def fleet(**overrides: dict[str, object]) -> list[Pod]:
    pods: list[Pod] = []
    for role, count in (("prefill", 2), ("decode", 2)):
        for i in range(count):
            pods += instance(role, i, **overrides.get(f"{role}{i}", {}))
    return pods


def test_decode_goes_first_and_the_whole_instance_is_replaced() -> None:
    step = next_instance_to_replace("new", fleet(), NODES)
    assert step is not None and (step.role, step.instance) == ("decode", "0")
    assert step.pods == (("x-decode-0-0", "uid-x-decode-0-0"), ("x-decode-0-1", "uid-x-decode-0-1"))
    assert step.event == "InstanceReplaced"


def test_then_the_role_furthest_behind() -> None:
    step = next_instance_to_replace("new", fleet(decode0={"revision": "new"}), NODES)
    assert step is not None and (step.role, step.instance) == ("prefill", "0")


def test_nothing_while_an_instance_is_unready_short_or_terminating() -> None:
    starting = fleet(decode0={"revision": "new", "ready": False})
    assert next_instance_to_replace("new", starting, NODES) is None
    assert next_instance_to_replace("new", fleet(prefill1={"terminating": True}), NODES) is None
    short = [p for p in fleet() if p.name != "x-prefill-1-1"]
    assert next_instance_to_replace("new", short, NODES) is None


def test_nothing_while_a_replaced_instance_has_no_pod_yet() -> None:
    """Its rank pods are gone and the StatefulSet has not made them anew: the view shows
    only whole, Ready instances, yet one is out of service."""
    gone = [p for p in fleet() if (p.role, p.instance) != ("decode", "0")]
    assert next_instance_to_replace("new", gone, NODES) is None


def test_nothing_once_every_instance_runs_the_revision() -> None:
    assert next_instance_to_replace("old", fleet(), NODES) is None
