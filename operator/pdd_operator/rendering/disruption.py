"""PodDisruptionBudgets: voluntary evictions (node drains) take at most one pod of a role at a
time, so serving capacity never drops by more than one instance per role."""

from __future__ import annotations

from typing import Any

from pdd_operator.api import names
from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.engines.base import role_spec
from pdd_operator.rendering.kinds import ChildPart, Kind, Stage
from pdd_operator.rendering.roles import child_metadata


def render_disruption_budgets(pdd: PDDeployment) -> list[dict[str, Any]]:
    budgets = []
    for role in names.ROLES:
        if role_spec(pdd.spec, role).replicas < 2:
            continue  # a budget on a single pod would block every drain
        budgets.append(
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": child_metadata(pdd, names.pdb_name(pdd.name, role), role),
                "spec": {
                    "maxUnavailable": 1,
                    "selector": {"matchLabels": names.selector_labels(pdd.name, role)},
                },
            }
        )
    return budgets


POD_DISRUPTION_BUDGET = Kind(
    "policy/v1",
    "PodDisruptionBudget",
    "poddisruptionbudgets",
    why="Each role's disruption budget.",
    stage=Stage.USED,
)
PART = ChildPart(
    "disruption budgets", (POD_DISRUPTION_BUDGET,), lambda pdd, ctx: render_disruption_budgets(pdd)
)
