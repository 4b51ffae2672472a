"""The containers the operator injects (preflight, nixl-sidecar) stay as rendered: a podTemplate
entry of their name may set their resources and nothing else. The models refuse it
(Stalled=InvalidSpec, with or without the chart's admission policy), and the renderer puts them
back even where that check was bypassed."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from helpers.factories import BASE_BODY, make_pdd
from pdd_operator.api import v1alpha1 as api
from pdd_operator.rendering.context import RenderContext
from pdd_operator.rendering.merge import merge_pod_template
from pdd_operator.rendering.roles import render_pod_template
from pdd_operator.status.invalid import invalid_spec_message

# Every field but resources, in both injected containers.
CHANGES: dict[str, Any] = {
    "command": ["sh", "-c", "cat /var/run/pdd/token"],
    "args": ["--debug"],
    "env": [{"name": "HTTP_PROXY", "value": "http://proxy"}],
    "envFrom": [{"secretRef": {"name": "mine"}}],
    "volumeMounts": [{"name": "model", "mountPath": "/m"}],
    "image": "mine:1",
    "securityContext": {"runAsUser": 0},
    "lifecycle": {"postStart": {"exec": {"command": ["sh"]}}},
}
INJECTED = [("initContainers", "preflight"), ("containers", "nixl-sidecar")]


def fragment(list_name: str, name: str, **fields: Any) -> dict[str, Any]:
    return {"spec": {list_name: [{"name": name, **fields}]}}


@pytest.mark.parametrize(("list_name", "name"), INJECTED)
@pytest.mark.parametrize("field", CHANGES)
def test_a_change_to_an_injected_container_is_named(list_name: str, name: str, field: str) -> None:
    problems = api.pod_template_problems(fragment(list_name, name, **{field: CHANGES[field]}))
    assert problems == [
        f"spec.{list_name}[{name}] sets {field}: the operator injects the {name} container and "
        "owns all of it but its resources; remove those fields (a container of your own needs "
        "another name)"
    ]


def test_every_field_set_is_listed_in_one_problem() -> None:
    problems = api.pod_template_problems(fragment("containers", "nixl-sidecar", **CHANGES))
    assert len(problems) == 1
    assert (
        "sets args, command, env, envFrom, image, lifecycle, securityContext, volumeMounts"
        in (problems[0])
    )


@pytest.mark.parametrize(
    "template",
    [
        fragment("containers", "nixl-sidecar", resources={"limits": {"memory": "1Gi"}}),
        fragment("initContainers", "preflight", resources={"requests": {"cpu": "1"}}),
        fragment("containers", "engine", command=["python", "-m", "mine"]),
        fragment("containers", "sidecar-of-mine", image="mine:1", command=["sh"]),
    ],
    ids=["sidecar resources", "preflight resources", "engine command", "own container"],
)
def test_resources_and_other_containers_pass(template: dict[str, Any]) -> None:
    assert api.pod_template_problems(template) == []


@pytest.mark.parametrize("role", ["prefill", "decode", "router"])
def test_the_spec_is_invalid_with_the_field_named(role: str) -> None:
    spec = {
        **BASE_BODY["spec"],
        role: {"podTemplate": fragment("containers", "nixl-sidecar", args=["x"])},
    }
    with pytest.raises(ValidationError) as raised:
        api.PDDeploymentSpec.model_validate(spec)
    message = invalid_spec_message(raised.value.title, raised.value.errors(include_url=False))
    assert message.startswith(f"spec.{role}.podTemplate: ")
    assert "spec.containers[nixl-sidecar] sets args: the operator injects" in message


def by_name(pod: dict[str, Any], list_name: str) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in pod["spec"][list_name]}


@pytest.mark.parametrize(("list_name", "name"), INJECTED)
def test_the_renderer_keeps_injected_containers_whatever_the_template(
    list_name: str, name: str
) -> None:
    """Rendered with the model check bypassed (model_construct skips validators), the pod
    still has the injected container as the operator renders it; only resources change."""
    pdd = make_pdd({"prefill": {"replicas": 1, "gpusPerInstance": 2}})
    rendered = render_pod_template(pdd, "prefill", RenderContext())
    limits = {"limits": {"memory": "3Gi"}}
    bypassed = pdd.spec.prefill.model_construct(
        **{
            **dict(pdd.spec.prefill),
            "podTemplate": fragment(list_name, name, resources=limits, **CHANGES),
        }
    )
    spec = pdd.spec.model_copy(update={"prefill": bypassed})
    merged = render_pod_template(pdd.model_copy(update={"spec": spec}), "prefill", RenderContext())

    before, after = by_name(rendered, list_name)[name], by_name(merged, list_name)[name]
    assert after["resources"]["limits"]["memory"] == "3Gi"
    assert {k: v for k, v in after.items() if k != "resources"} == {
        k: v for k, v in before.items() if k != "resources"
    }
    assert [c["name"] for c in merged["spec"][list_name]] == [
        c["name"] for c in rendered["spec"][list_name]
    ]


def test_a_template_that_replaces_the_container_list_keeps_the_injected_containers() -> None:
    """A list with an unnamed item replaces the rendered list (merge by name needs names):
    the injected container is put back as rendered."""
    base = {"spec": {"containers": [{"name": "engine"}, {"name": "nixl-sidecar", "image": "s"}]}}
    merged = merge_pod_template(
        base, {"spec": {"containers": [{"image": "mine"}]}}, ["nixl-sidecar"], ["resources"]
    )
    assert merged["spec"]["containers"] == [
        {"image": "mine"},
        {"name": "nixl-sidecar", "image": "s"},
    ]


def test_other_containers_merge_as_before() -> None:
    base = {"spec": {"containers": [{"name": "engine", "args": ["a"]}, {"name": "nixl-sidecar"}]}}
    patch = {"spec": {"containers": [{"name": "engine", "args": ["b"]}, {"name": "mine"}]}}
    merged = merge_pod_template(base, patch, ["nixl-sidecar"], ["resources"])
    assert merged["spec"]["containers"] == [
        {"name": "engine", "args": ["b"]},
        {"name": "nixl-sidecar"},
        {"name": "mine"},
    ]


def injected_mounts(pod: dict[str, Any]) -> set[str]:
    """The volumes the injected containers of a rendered pod mount."""
    spec = pod["spec"]
    containers = [*spec.get("initContainers", []), *spec["containers"]]
    return {
        mount["name"]
        for c in containers
        if c["name"] in api.INJECTED_CONTAINERS
        for mount in c.get("volumeMounts", [])
    }


@pytest.mark.parametrize("exchange", ["sidecar", "etcd"])
def test_the_models_list_every_volume_the_injected_containers_mount(exchange: str) -> None:
    """INJECTED_VOLUMES is what the models refuse without a render: it must name every volume
    a render gives the injected containers, or a new one would be open to a podTemplate."""
    pdd = make_pdd(
        {
            "prefill": {"replicas": 1, "gpusPerInstance": 2},
            "kvTransfer": {"metadataExchange": {"mode": exchange}},
        }
    )
    mounted = injected_mounts(render_pod_template(pdd, "prefill", RenderContext()))
    assert mounted and mounted <= set(api.INJECTED_VOLUMES)


@pytest.mark.parametrize("volume", api.INJECTED_VOLUMES)
def test_a_podtemplate_volume_named_like_an_injected_one_is_named(volume: str) -> None:
    template = {"spec": {"volumes": [{"name": volume, "hostPath": {"path": "/"}}]}}
    assert api.pod_template_problems(template) == [
        f"spec.volumes[{volume}] is a volume the operator injects for its own containers; "
        "give your volume another name"
    ]


def test_the_renderer_keeps_injected_volumes_whatever_the_template() -> None:
    """With the model check bypassed, a podTemplate volume named like the sidecar's token
    volume does not replace it; a volume of the user's own is added."""
    pdd = make_pdd({"prefill": {"replicas": 1, "gpusPerInstance": 2}})
    rendered = render_pod_template(pdd, "prefill", RenderContext())
    swapped = [{"name": name, "emptyDir": {}} for name in injected_mounts(rendered)] + [
        {"name": "mine", "emptyDir": {}}
    ]
    bypassed = pdd.spec.prefill.model_construct(
        **{**dict(pdd.spec.prefill), "podTemplate": {"spec": {"volumes": swapped}}}
    )
    spec = pdd.spec.model_copy(update={"prefill": bypassed})
    merged = render_pod_template(pdd.model_copy(update={"spec": spec}), "prefill", RenderContext())
    before = {v["name"]: v for v in rendered["spec"]["volumes"]}
    after = {v["name"]: v for v in merged["spec"]["volumes"]}
    assert after == {**before, "mine": {"name": "mine", "emptyDir": {}}}


def test_a_user_container_mounting_the_sidecars_api_token_is_named() -> None:
    template = fragment(
        "containers",
        "engine",
        volumeMounts=[{"name": "pdd-kube-api-access", "mountPath": "/var/run/secrets/k"}],
    )
    assert api.pod_template_problems(template) == [
        "spec.containers[engine].volumeMounts[pdd-kube-api-access] mounts the sidecar's "
        "ServiceAccount token, which only the sidecar holds; remove the mount"
    ]


def test_the_renderer_keeps_the_api_token_in_the_sidecar_only() -> None:
    """With the model check bypassed, an engine mount of the sidecar's token is dropped."""
    pdd = make_pdd({"prefill": {"replicas": 1, "gpusPerInstance": 2}})
    mount = {"name": "pdd-kube-api-access", "mountPath": "/var/run/secrets/k"}
    bypassed = pdd.spec.prefill.model_construct(
        **{
            **dict(pdd.spec.prefill),
            "podTemplate": fragment("containers", "engine", volumeMounts=[mount]),
        }
    )
    spec = pdd.spec.model_copy(update={"prefill": bypassed})
    merged = render_pod_template(pdd.model_copy(update={"spec": spec}), "prefill", RenderContext())
    mounts = {
        c["name"]: {m["name"] for m in c.get("volumeMounts", [])}
        for c in merged["spec"]["containers"]
    }
    assert "pdd-kube-api-access" not in mounts["engine"]
    assert "pdd-kube-api-access" in mounts["nixl-sidecar"]
