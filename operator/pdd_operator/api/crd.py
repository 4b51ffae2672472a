"""Generate the PDDeployment CRD from the pydantic models (the only generator of crds/).

Pydantic's JSON schema is close to what Kubernetes wants but not structural: it uses `$ref`,
`anyOf` with `null` for optional fields, `const`, titles, and it leaves out defaults that come
from a `default_factory`. This module turns it into a structural OpenAPI v3 schema with every
default in it, so defaults live in the CRD (GitOps tools then see no drift).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from pdd_operator.api import v1alpha1 as api

_DROPPED_KEYS = {"title"}
# What an object reads as before the operator first writes its status: a generation not yet
# observed. kstatus (Flux's health checks, CD tools' waits) then says InProgress instead of
# Current for an object no controller has looked at (the operator down, or not watching that
# namespace); the API server fills it in on read, and the operator's first status write
# replaces it. Flux's own CRDs default their status the same way.
UNOBSERVED_STATUS = {"observedGeneration": -1}


def generate_crd(spec_rules: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """The PDDeployment CRD with ``spec_rules`` (rule, message) on spec: the API's own and the
    engines' (engines.registry.spec_rules gathers both)."""
    spec_schema = model_schema(api.PDDeploymentSpec)
    spec_schema.setdefault("x-kubernetes-validations", []).extend(
        {"rule": rule, "message": message} for rule, message in spec_rules
    )
    return _namespaced_crd(
        kind=api.KIND,
        plural=api.PLURAL,
        singular=api.SINGULAR,
        short_names=api.SHORT_NAMES,
        categories=["all", api.CATEGORY],
        description="PDDeployment runs one model as prefill and decode pod groups with a "
        "verified KV-transfer path between them.",
        spec=spec_schema,
        status=_unobserved(model_schema(api.PDDeploymentStatus)),
        subresources={"status": {}},
        printer_columns=api.PRINTER_COLUMNS,
    )


def generate_scaler_crd() -> dict[str, Any]:
    """PDDRoleScaler: one per autoscaled role, the target an HPA or KEDA scales through
    /scale; `labelSelectorPath` gives the HPA the role's pods for pod metrics."""
    return _namespaced_crd(
        kind=api.SCALER_KIND,
        plural=api.SCALER_PLURAL,
        singular=api.SCALER_SINGULAR,
        short_names=api.SCALER_SHORT_NAMES,
        categories=[api.CATEGORY],
        description="PDDRoleScaler is the scale target of one role of a PDDeployment "
        "(created by the operator when spec.autoscaling lists the role): point an HPA or a "
        "KEDA ScaledObject at it.",
        spec=model_schema(api.PDDRoleScalerSpec),
        # Created and kept by the operator, never by a GitOps tool: no unobserved default.
        status=_without_defaults(model_schema(api.PDDRoleScalerStatus)),
        subresources={
            "status": {},
            "scale": {
                "specReplicasPath": ".spec.replicas",
                "statusReplicasPath": ".status.replicas",
                "labelSelectorPath": ".status.selector",
            },
        },
        printer_columns=api.SCALER_PRINTER_COLUMNS,
    )


def _namespaced_crd(
    *,
    kind: str,
    plural: str,
    singular: str,
    short_names: list[str],
    categories: list[str],
    description: str,
    spec: dict[str, Any],
    status: dict[str, Any],
    subresources: dict[str, Any],
    printer_columns: list[dict[str, Any]],
) -> dict[str, Any]:
    """One served and stored version of a namespaced kind of ours."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{api.GROUP}",
            "labels": {
                "app.kubernetes.io/name": "pdd-operator",
                "app.kubernetes.io/part-of": "pdd",
            },
        },
        "spec": {
            "group": api.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": singular,
                "shortNames": short_names,
                "categories": categories,
            },
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": subresources,
                    "additionalPrinterColumns": printer_columns,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": description,
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec,
                                "status": status,
                            },
                        }
                    },
                }
            ],
        },
    }


def _unobserved(status: dict[str, Any]) -> dict[str, Any]:
    """The status schema without the models' field defaults (the operator writes status
    whole), defaulted as a whole to UNOBSERVED_STATUS."""
    return {**_without_defaults(status), "default": dict(UNOBSERVED_STATUS)}


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(mode="validation")
    definitions = raw.pop("$defs", {})
    schema: dict[str, Any] = _structural(raw, definitions)
    _add_factory_defaults(model, schema)
    return schema


def _structural(node: Any, definitions: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_structural(item, definitions) for item in node]
    if not isinstance(node, dict):
        return node
    node = _drop_null_branch(node)  # first: an optional model's one branch is a $ref
    if "$ref" in node:
        target = definitions[node["$ref"].split("/")[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _structural(merged, definitions)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED_KEYS:
            continue
        if key == "const":
            out["enum"] = [value]
        elif key == "properties":
            out[key] = {name: _structural(prop, definitions) for name, prop in value.items()}
        elif key == "additionalProperties" and value is False:
            continue  # structural schemas prune unknown fields anyway
        else:
            out[key] = _structural(value, definitions)
    if out.get("x-kubernetes-preserve-unknown-fields"):
        out.pop("additionalProperties", None)
    if out.get("default") is None:
        out.pop("default", None)
    return out


def _drop_null_branch(node: dict[str, Any]) -> dict[str, Any]:
    """`X | None` becomes X: absence already means None in the API."""
    branches = node.get("anyOf")
    if not branches:
        return node
    real = [b for b in branches if b.get("type") != "null"]
    if len(real) != 1:
        raise ValueError(f"unsupported union in API schema: {branches}")
    rest = {k: v for k, v in node.items() if k != "anyOf"}
    return {**real[0], **rest}


def _add_factory_defaults(model: type[BaseModel], schema: dict[str, Any]) -> None:
    """Put `default_factory` defaults into the schema; nested objects default to {}."""
    properties = schema.get("properties", {})
    for name, field in model.model_fields.items():
        prop = properties.get(field.alias or name)
        if prop is None:
            continue
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            _add_factory_defaults(annotation, prop)
        if field.default_factory is not None and "default" not in prop:
            value = field.default_factory()  # type: ignore[call-arg]
            prop["default"] = {} if isinstance(value, BaseModel) else json.loads(json.dumps(value))


def _without_defaults(node: Any) -> Any:
    """Status is written whole by the operator; schema defaults there would only add noise."""
    if isinstance(node, dict):
        return {k: _without_defaults(v) for k, v in node.items() if k != "default"}
    if isinstance(node, list):
        return [_without_defaults(v) for v in node]
    return node
