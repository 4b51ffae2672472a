"""Walk whole rollouts through the pure planner and check the invariants at every step; the
partitions of one reconcile from the observed StatefulSets and pods."""

from __future__ import annotations

import itertools

import pytest

from pdd_operator.planning.rollout import (
    RoleRollout,
    next_partitions,
    rollout_partitions,
    serving_revision,
    starting_partitions,
)
from pdd_operator.status.observe import ChildSummary, PodSummary


def simulate(prefill: int, decode: int) -> list[dict[str, int]]:
    """Pods become Ready at once after each step; returns the partitions of every step."""
    partitions = starting_partitions({"prefill": prefill, "decode": decode})
    replicas = {"prefill": prefill, "decode": decode}
    steps = [dict(partitions)]
    for _ in range(100):
        roles = {
            r: RoleRollout(
                replicas[r], partitions[r], replicas[r] - partitions[r], replicas[r] - partitions[r]
            )
            for r in replicas
        }
        nxt = next_partitions(roles)
        if nxt == partitions:
            break
        partitions = nxt
        steps.append(dict(partitions))
    return steps


@pytest.mark.parametrize("prefill,decode", [(1, 1), (2, 4), (4, 2), (3, 8), (1, 0), (0, 3)])
def test_rollout_finishes_one_pod_at_a_time_decode_first(prefill: int, decode: int) -> None:
    steps = simulate(prefill, decode)
    assert steps[-1] == {"prefill": 0, "decode": 0}
    assert len(steps) == prefill + decode + 1
    for before, after in itertools.pairwise(steps):
        moved = sum(before[r] - after[r] for r in before)
        assert moved == 1  # one pod per step
    if prefill and decode:
        assert steps[1]["decode"] == decode - 1  # decode leads


@pytest.mark.parametrize("prefill,decode", [(2, 4), (4, 2), (3, 8)])
def test_no_new_prefill_pod_without_a_new_decode_pod(prefill: int, decode: int) -> None:
    for step in simulate(prefill, decode):
        new_prefill, new_decode = prefill - step["prefill"], decode - step["decode"]
        if new_prefill:
            assert new_decode >= 1
        # the roles stay within one pod-step of each other's share
        assert (
            abs(new_prefill / prefill - new_decode / decode) <= max(1 / prefill, 1 / decode) + 1e-9
        )


def test_waits_while_an_updated_pod_is_not_ready() -> None:
    roles = {"prefill": RoleRollout(2, 2, 0, 0), "decode": RoleRollout(4, 3, 0, 1)}
    assert next_partitions(roles) == {"prefill": 2, "decode": 3}


def test_partition_is_clamped_to_replicas_after_a_scale_down() -> None:
    roles = {"prefill": RoleRollout(1, 2, 0, 0), "decode": RoleRollout(1, 1, 0, 0)}
    assert next_partitions(roles) == {"prefill": 1, "decode": 0}


NEW, OLD = "r2", "r1"
REPLICAS = {"prefill": 2, "decode": 4}


def statefulset(role: str, revision: str, partition: int) -> ChildSummary:
    key = ("apps/v1", "StatefulSet", f"llama-{role}")
    return ChildSummary(key, "h", role, template_revision=revision, partition=partition)


def pods(role: str, revision: str, ready: int, unready: int = 0) -> list[PodSummary]:
    return [
        PodSummary(f"llama-{role}-{i}", f"u{i}", role, "n", i < ready, revision, None)
        for i in range(ready + unready)
    ]


SERVICE = ChildSummary(("v1", "Service", "llama-prefill"), "h", "prefill")
ROUTER = ChildSummary(("apps/v1", "Deployment", "llama-router"), "h", "router")


@pytest.mark.parametrize(
    ("children", "observed_pods", "expected"),
    [
        pytest.param([], [], {}, id="nothing-applied-yet"),
        pytest.param([SERVICE, ROUTER], [], {}, id="no-statefulset-no-partition"),
        pytest.param(
            [statefulset("prefill", OLD, 0), statefulset("decode", OLD, 0)],
            pods("prefill", OLD, 2) + pods("decode", OLD, 4),
            {"prefill": 2, "decode": 4},
            id="a-new-revision-starts-with-nothing-updated",
        ),
        pytest.param(
            [statefulset("prefill", NEW, 0), statefulset("decode", OLD, 0)],
            [],
            {"prefill": 2, "decode": 4},
            id="one-role-behind-restarts-both",
        ),
        pytest.param(
            [statefulset("decode", OLD, 0)],
            [],
            {"decode": 4},
            id="only-the-roles-that-exist",
        ),
        pytest.param(
            [statefulset("prefill", NEW, 2), statefulset("decode", NEW, 4), SERVICE, ROUTER],
            pods("prefill", OLD, 2) + pods("decode", OLD, 4),
            {"prefill": 2, "decode": 3},
            id="decode-moves-first",
        ),
        pytest.param(
            [statefulset("prefill", NEW, 2), statefulset("decode", NEW, 3)],
            pods("decode", NEW, 0, unready=1) + pods("decode", OLD, 3),
            {"prefill": 2, "decode": 3},
            id="waits-for-an-updated-pod-to-be-ready",
        ),
        pytest.param(
            [statefulset("prefill", NEW, 2), statefulset("decode", NEW, 3)],
            pods("decode", NEW, 1) + pods("prefill", OLD, 2),
            {"prefill": 1, "decode": 3},
            id="then-the-role-furthest-behind",
        ),
        pytest.param(
            [statefulset("prefill", NEW, 0), statefulset("decode", NEW, 0)],
            pods("prefill", NEW, 2) + pods("decode", NEW, 4),
            {"prefill": 0, "decode": 0},
            id="done",
        ),
    ],
)
def test_rollout_partitions_of_one_reconcile(
    children: list[ChildSummary], observed_pods: list[PodSummary], expected: dict[str, int]
) -> None:
    assert rollout_partitions(NEW, REPLICAS, children, observed_pods) == expected


def routers(revision: str, count: int = 1) -> list[PodSummary]:
    return [
        PodSummary(f"llama-router-{revision}-{i}", f"r{i}", "router", "n", True, revision, None)
        for i in range(count)
    ]


HALFWAY = [statefulset("prefill", NEW, 1), statefulset("decode", NEW, 1)]
HALFWAY_PODS = (
    pods("prefill", NEW, 1)
    + pods("prefill", OLD, 1)
    + pods("decode", NEW, 1)
    + pods("decode", OLD, 1)
)


@pytest.mark.parametrize(
    ("observed_routers", "expected"),
    [
        pytest.param(routers(OLD), {"prefill": 1, "decode": 1}, id="an-old-router-serves"),
        pytest.param(routers(NEW) + routers(OLD), {"prefill": 1, "decode": 1}, id="both-serve"),
        pytest.param(routers(NEW), {"prefill": 1, "decode": 0}, id="handed-over"),
        pytest.param([], {"prefill": 1, "decode": 0}, id="no-router"),
    ],
)
def test_the_last_old_pod_of_a_role_waits_for_the_old_routers_to_go(
    observed_routers: list[PodSummary], expected: dict[str, int]
) -> None:
    replicas = {"prefill": 2, "decode": 2}
    observed = HALFWAY_PODS + observed_routers
    assert rollout_partitions(NEW, replicas, HALFWAY, observed) == expected


def test_a_terminating_old_router_still_holds_the_last_old_pods() -> None:
    (old,) = routers(OLD)
    terminating = PodSummary(old.name, old.uid, "router", "n", False, OLD, None, terminating=True)
    replicas = {"prefill": 2, "decode": 2}
    got = rollout_partitions(NEW, replicas, HALFWAY, [*HALFWAY_PODS, terminating])
    assert got == {"prefill": 1, "decode": 1}


def test_a_role_of_one_replica_moves_although_an_old_router_serves() -> None:
    """Waiting would never end: the new routers need a new pod in every role to be Ready."""
    children = [statefulset("prefill", NEW, 1), statefulset("decode", NEW, 1)]
    got = rollout_partitions(
        NEW,
        {"prefill": 1, "decode": 1},
        children,
        pods("prefill", OLD, 1) + pods("decode", OLD, 1) + routers(OLD),
    )
    assert got == {"prefill": 1, "decode": 0}


@pytest.mark.parametrize("prefill,decode", [(2, 2), (2, 4), (4, 2), (3, 8)])
def test_old_routers_always_have_an_old_pod_in_every_role(prefill: int, decode: int) -> None:
    """Walk a rollout in which the old routers go only after the planner has waited for them
    with the new revision able to serve (a Ready new pod in every role), as a router
    Deployment hands over: until they are gone, every role keeps an old pod."""
    replicas = {"prefill": prefill, "decode": decode}
    partitions = starting_partitions(replicas)
    old_routers = True
    for _ in range(100):
        roles = {
            r: RoleRollout(replicas[r], partitions[r], *[replicas[r] - partitions[r]] * 2)
            for r in replicas
        }
        nxt = next_partitions(roles, old_routers)
        if old_routers:
            assert all(p > 0 for p in nxt.values()), nxt
        if nxt == partitions:
            if not old_routers:
                break
            assert all(state.updated_ready > 0 for state in roles.values())
            old_routers = False  # the new routers are Ready: the old ones go
        partitions = nxt
    assert partitions == {"prefill": 0, "decode": 0}


def router_deployment(revision: str) -> ChildSummary:
    key = ("apps/v1", "Deployment", "llama-router")
    return ChildSummary(key, "h", "router", template_revision=revision)


@pytest.mark.parametrize(
    ("router", "observed_pods", "expected"),
    [
        pytest.param(
            router_deployment(OLD),
            pods("prefill", OLD, 2) + pods("decode", OLD, 1) + pods("decode", NEW, 0, 1),
            OLD,
            id="old-router-stays-while-new-revision-cannot-serve",
        ),
        pytest.param(
            router_deployment(OLD),
            pods("prefill", OLD, 1) + pods("prefill", NEW, 1) + pods("decode", NEW, 1),
            NEW,
            id="new-revision-ready-in-every-role",
        ),
        pytest.param(
            router_deployment(OLD),
            pods("prefill", OLD, 2) + pods("decode", NEW, 0, 1),
            NEW,
            id="old-revision-cannot-serve-either",
        ),
        pytest.param(
            router_deployment(NEW),
            pods("prefill", OLD, 2) + pods("decode", OLD, 2),
            NEW,
            id="once-new-it-stays",
        ),
        pytest.param(router_deployment(""), pods("prefill", OLD, 1), NEW, id="unlabelled-router"),
        pytest.param(None, pods("prefill", OLD, 1), NEW, id="no-router"),
    ],
)
def test_the_router_pairs_the_old_revision_until_the_new_one_can_serve(
    router: ChildSummary | None, observed_pods: list[PodSummary], expected: str
) -> None:
    children = [statefulset("prefill", NEW, 2), statefulset("decode", NEW, 1)]
    if router is not None:
        children.append(router)
    assert serving_revision(NEW, children, observed_pods) == expected


def test_a_terminating_old_pod_does_not_keep_the_router_on_its_revision() -> None:
    (leaving,) = pods("decode", OLD, 1)
    leaving = PodSummary(
        leaving.name, leaving.uid, "decode", "n", True, OLD, None, terminating=True
    )
    observed = [*pods("prefill", OLD, 1), leaving, *pods("decode", NEW, 0, 1)]
    assert serving_revision(NEW, [router_deployment(OLD)], observed) == NEW
