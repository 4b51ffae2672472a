"""Settings the operator injects cannot be overridden through a podTemplate (free-form, so
checked by the models: the operator reports Stalled=InvalidSpec), and the env and flag tables
the CRD's rules are generated from say what to set instead."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from helpers.factories import BASE_BODY
from pdd_operator.api import v1alpha1 as api
from pdd_operator.status.invalid import invalid_spec_message

REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("revision label", {"metadata": {"labels": {"pdd.dev/revision": "x"}}}, "pdd.dev/revision"),
    ("role label", {"metadata": {"labels": {"pdd.dev/role": "decode"}}}, "pdd.dev/role"),
    (
        "deployment label",
        {"metadata": {"labels": {"pdd.dev/deployment": "other"}}},
        "pdd.dev/deployment",
    ),
    (
        "managed-by label",
        {"metadata": {"labels": {"app.kubernetes.io/managed-by": "me"}}},
        "app.kubernetes.io/managed-by",
    ),
    (
        "instance label",
        {"metadata": {"labels": {"app.kubernetes.io/instance": "x"}}},
        "app.kubernetes.io/instance",
    ),
    (
        "networks annotation",
        {"metadata": {"annotations": {"k8s.v1.cni.cncf.io/networks": "kube-system/host"}}},
        "spec.kvTransfer.rdma.networks",
    ),
    (
        "owner annotation",
        {"metadata": {"annotations": {"pdd.dev/deployment-name": "other"}}},
        "pdd.dev/deployment-name",
    ),
    (
        "probe request annotation",
        {"metadata": {"annotations": {"pdd.dev/probe-request": "now"}}},
        "pdd.dev/probe-request",
    ),
    *[
        (
            f"{name} in the {container} container",
            {"spec": {"containers": [{"name": container, "env": [{"name": name, "value": "1"}]}]}},
            f"env[{name}]",
        )
        for container, name in [
            ("engine", "UCX_TLS"),
            ("engine", "UCX_NET_DEVICES"),
            ("engine", "VLLM_NIXL_SIDE_CHANNEL_PORT"),
            ("engine", "PDD_ROLE"),
            ("a-container-of-mine", "PDD_SIDECAR_TOKEN_FILE"),
            ("a-container-of-mine", "UCX_TLS"),
        ]
    ],
    (
        "reserved env in an init container",
        {"spec": {"initContainers": [{"name": "setup", "env": [{"name": "PDD_NIC_MAP"}]}]}},
        "spec.initContainers[setup].env[PDD_NIC_MAP]",
    ),
]

ACCEPTED: list[tuple[str, dict[str, Any]]] = [
    ("own labels", {"metadata": {"labels": {"team": "a", "app.kubernetes.io/version": "1"}}}),
    ("own annotations", {"metadata": {"annotations": {"prometheus.io/scrape": "true"}}}),
    (
        "other env",
        {
            "spec": {
                "containers": [
                    {"name": "engine", "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]}
                ]
            }
        },
    ),
    ("pod fields", {"spec": {"priorityClassName": "inference", "hostIPC": False}}),
    # Not the operator's business to type-check: the API server does when it stores the pod.
    ("odd shapes", {"metadata": {"labels": ["not", "a", "map"]}, "spec": {"containers": "x"}}),
]


@pytest.mark.parametrize("template,fragment", [(t, f) for _, t, f in REFUSED],
                         ids=[i for i, _, _ in REFUSED])  # fmt: skip
def test_a_pod_template_that_sets_what_the_operator_sets_is_named(
    template: dict[str, Any], fragment: str
) -> None:
    problems = api.pod_template_problems(template)
    assert len(problems) == 1 and fragment in problems[0], problems


@pytest.mark.parametrize("template", [t for _, t in ACCEPTED], ids=[i for i, _ in ACCEPTED])
def test_a_pod_template_of_the_users_own_settings_passes(template: dict[str, Any]) -> None:
    assert api.pod_template_problems(template) == []


@pytest.mark.parametrize("where", ["prefill", "decode", "router"])
def test_the_spec_is_unreadable_and_the_message_names_the_field(where: str) -> None:
    spec = {**BASE_BODY["spec"], where: {"podTemplate": REFUSED[0][1]}}
    with pytest.raises(ValidationError) as raised:
        api.PDDeploymentSpec.model_validate(spec)
    message = invalid_spec_message(raised.value.title, raised.value.errors(include_url=False))
    assert message.startswith(f"spec.{where}.podTemplate: ")
    assert "pdd.dev/revision" in message and "remove it from the podTemplate" in message


def test_every_reserved_env_name_names_what_to_set_instead() -> None:
    for name, instead in api.RESERVED_ENV.items():
        assert api.env_name_reserved(name) and instead, name
    assert api.env_name_reserved("PDD_ANYTHING")
    assert not api.env_name_reserved("PDDX") and not api.env_name_reserved("UCX_RNDV_THRESH")


def test_the_reserved_env_covers_what_the_renderer_injects() -> None:
    """Every variable the engine container gets from the operator is reserved: a user's entry
    of the same name would otherwise win silently (later entries win)."""
    from pdd_operator.api.v1alpha1 import PDDeployment
    from pdd_operator.rendering.children import render_children
    from pdd_operator.rendering.context import RenderContext

    body = {
        **BASE_BODY,
        "metadata": {**BASE_BODY["metadata"], "uid": "u1"},
        "spec": {
            **BASE_BODY["spec"],
            "kvTransfer": {
                "gpuDirect": "off",
                "metadataExchange": {"mode": "etcd", "etcdEndpoints": ["http://e:2379"]},
            },
        },
    }
    objects = render_children(PDDeployment.from_body(body), RenderContext())
    sts = next(o for o in objects if o["kind"] == "StatefulSet")
    engine = next(c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "engine")
    injected = {e["name"] for e in engine["env"]}
    assert injected and all(api.env_name_reserved(n) for n in injected), sorted(
        n for n in injected if not api.env_name_reserved(n)
    )


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_flags_the_adapter_renders_are_reserved(engine: str) -> None:
    """Each flag the adapter puts on the command line is in the table."""
    from pdd_operator.engines.registry import adapter_for

    spec = api.PDDeploymentSpec.model_validate(
        {
            **BASE_BODY["spec"],
            "engine": {**BASE_BODY["spec"]["engine"], "type": engine, "kvBlockSize": 32},
            "model": {"name": "m", "servedName": "s"},
        }
    )
    args = adapter_for(engine).launch(spec, "prefill").args
    flags = {a for a in args if a.startswith("--")}  # "-m" is python3's, not the engine's
    adapter = adapter_for(engine)
    reserved = set(adapter.reserved_flags) | set(adapter.rendered_switches)
    assert flags <= reserved, flags - reserved
