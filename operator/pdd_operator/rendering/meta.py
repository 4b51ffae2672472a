"""Metadata every child of a PDDeployment carries."""

from __future__ import annotations

from typing import Any

from pdd_operator.api import names
from pdd_operator.api.v1alpha1 import PDDeployment


def child_metadata(pdd: PDDeployment, name: str, component: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": pdd.namespace,
        "labels": names.common_labels(pdd.name, component),
        "annotations": {names.ANNOTATION_OWNER_NAME: pdd.name},
    }
