"""One rank failing restarts its whole instance (planning.instance_restart)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pdd_operator.planning.instance_restart import instances_to_restart


@dataclass(frozen=True)
class Pod:
    name: str
    instance: str = "0"
    role: str = "prefill"
    engine_restarts: int = 0
    failed: bool = False
    terminating: bool = False

    @property
    def uid(self) -> str:
        return f"uid-{self.name}"


def ranks(instance: str = "0", **worker: object) -> list[Pod]:
    leader = Pod(f"x-prefill-{instance}-0", instance)
    return [leader, Pod(f"x-prefill-{instance}-1", instance, **worker)]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("worker", "cause"),
    [
        ({"engine_restarts": 1}, "the engine of x-prefill-0-1 restarted"),
        ({"failed": True}, "x-prefill-0-1 failed"),
    ],
)
def test_a_broken_rank_restarts_every_rank_of_its_instance(
    worker: dict[str, object], cause: str
) -> None:
    (restart,) = instances_to_restart([*ranks(**worker), *ranks("1")])
    assert (restart.role, restart.instance, restart.cause) == ("prefill", "0", cause)
    assert restart.pods == (
        ("x-prefill-0-0", "uid-x-prefill-0-0"),
        ("x-prefill-0-1", "uid-x-prefill-0-1"),
    )


def test_healthy_terminating_and_single_node_pods_restart_nothing() -> None:
    assert instances_to_restart([*ranks(), *ranks("1")]) == []
    restarting = [Pod("x-prefill-0-0", terminating=True), Pod("x-prefill-0-1", engine_restarts=2)]
    assert instances_to_restart(restarting) == []
    assert instances_to_restart([Pod("x-prefill-3", instance="", engine_restarts=4)]) == []
