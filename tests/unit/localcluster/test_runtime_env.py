"""The container environment, resolved like the kubelet: image ENV, service variables, env
in order with `$(VAR)` expansion, downward-API fields, secret and config-map keys."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from pdd_localcluster.runtime.podenv import (
    EnvError,
    command_line,
    container_env,
    expand,
    run_as,
)

POD: dict[str, Any] = {
    "metadata": {"name": "p-0", "namespace": "ns", "uid": "u-1", "labels": {"app": "x"}},
    "spec": {"nodeName": "node-a", "serviceAccountName": "sa"},
    "status": {"podIP": "127.86.0.9"},
}
OBJECTS = {("secret", "s"): {"token": "t0k"}, ("configmap", "c"): {"mode": "fast", "k2": "v2"}}


def lookup(kind: str, name: str) -> Mapping[str, str] | None:
    return OBJECTS.get((kind, name))


def env_of(container: dict[str, Any], **kw: Any) -> dict[str, str]:
    return container_env(
        container,
        POD,
        image_env=kw.get("image_env", {"PATH": "/img/bin", "A": "image"}),
        service_env={"KUBERNETES_SERVICE_HOST": "127.0.0.1"},
        lookup_data=lookup,
    )


@pytest.mark.parametrize(
    ("value", "defined", "want"),
    [
        ("$(A)/x", {"A": "1"}, "1/x"),
        ("$(MISSING)", {}, "$(MISSING)"),  # undefined stays as written
        ("$$(A)", {"A": "1"}, "$(A)"),  # $$ escapes
        ("a$b$(A)", {"A": "1"}, "a$b1"),
        ("$(A)$(B)", {"A": "1", "B": "2"}, "12"),
    ],
)
def test_expand(value: str, defined: dict[str, str], want: str) -> None:
    assert expand(value, defined) == want


def test_env_in_order_over_the_image_env_with_expansion_and_references() -> None:
    container = {
        "env": [
            {"name": "A", "value": "mine"},
            {"name": "URL", "value": "http://$(POD_IP):$(PORT)"},  # PORT is defined later
            {"name": "PORT", "value": "8000"},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "token"}}},
            {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "mode"}}},
            {"name": "LATE", "value": "$(POD_IP)"},
        ]
    }
    env = env_of(container)
    assert env["A"] == "mine"
    assert env["PATH"] == "/img/bin"
    assert env["HOSTNAME"] == "p-0"
    assert env["KUBERNETES_SERVICE_HOST"] == "127.0.0.1"
    assert env["URL"] == "http://$(POD_IP):$(PORT)"  # only earlier variables expand
    assert (env["NODE"], env["SA"], env["APP"]) == ("node-a", "sa", "x")
    assert (env["TOKEN"], env["MODE"], env["LATE"]) == ("t0k", "fast", "127.86.0.9")


def test_env_from_with_prefix_and_optional_references() -> None:
    container = {
        "envFrom": [
            {"configMapRef": {"name": "c"}, "prefix": "C_"},
            {"secretRef": {"name": "nope", "optional": True}},
        ],
        "env": [
            {
                "name": "X",
                "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k", "optional": True}},
            }
        ],
    }
    env = env_of(container)
    assert (env["C_mode"], env["C_k2"]) == ("fast", "v2")
    assert "X" not in env


@pytest.mark.parametrize(
    "ref,kubelet_says",
    [
        ({"secretKeyRef": {"name": "nope", "key": "k"}}, 'secret "nope" not found'),
        (
            {"secretKeyRef": {"name": "s", "key": "missing"}},
            "couldn't find key missing in Secret ns/s",
        ),
        ({"configMapKeyRef": {"name": "nope", "key": "k"}}, 'configmap "nope" not found'),
        ({"fieldRef": {"fieldPath": "status.unknown"}}, "status.unknown"),
    ],
)
def test_a_reference_that_does_not_resolve_is_a_config_error_in_the_kubelets_words(
    ref: dict[str, Any], kubelet_says: str
) -> None:
    """The operator reads these messages (a missing model Secret): they are the kubelet's."""
    with pytest.raises(EnvError) as raised:
        env_of({"env": [{"name": "X", "valueFrom": ref}]})
    assert kubelet_says in str(raised.value)


def test_command_and_args_expand_against_the_final_env() -> None:
    c = {"command": ["sh", "-c"], "args": ["echo $(A) $(NOPE) $$(A)"]}
    assert command_line(c, [], {"A": "1"}) == ["sh", "-c", "echo 1 $(NOPE) $(A)"]
    assert command_line({"args": ["x"]}, ["entry"], {}) == ["entry", "x"]
    with pytest.raises(EnvError, match="no command"):
        command_line({}, [], {})


@pytest.mark.parametrize(
    ("container", "argv"),
    [
        ({}, ["pdd-operator", "run"]),  # ENTRYPOINT + CMD
        ({"args": ["run", "--x"]}, ["pdd-operator", "run", "--x"]),  # args replace CMD
        ({"command": ["sh"]}, ["sh"]),  # command drops the ENTRYPOINT and the CMD
        ({"command": ["sh"], "args": ["-c", "true"]}, ["sh", "-c", "true"]),
    ],
)
def test_the_image_entrypoint_and_cmd_follow_the_pod_spec(
    container: dict[str, Any], argv: list[str]
) -> None:
    assert command_line(container, ["pdd-operator"], {}, ["run"]) == argv


@pytest.mark.parametrize(
    ("pod_context", "container_context", "image_user", "want"),
    [
        ({}, {}, "", (0, 0)),  # no USER, no securityContext: root
        ({}, {}, "65532:65532", (65532, 65532)),  # the image's USER
        ({}, {}, "1000", (1000, 0)),  # a USER without group: group 0, as runc does
        ({"runAsUser": 7}, {}, "65532:65532", (7, 65532)),  # the pod's over the image's
        ({"runAsUser": 7, "runAsGroup": 8}, {"runAsUser": 9}, "", (9, 8)),  # container's first
    ],
)
def test_a_container_runs_as_its_security_context_says_else_as_the_image_user(
    pod_context: dict[str, Any],
    container_context: dict[str, Any],
    image_user: str,
    want: tuple[int, int],
) -> None:
    pod = {**POD, "spec": {**POD["spec"], "securityContext": pod_context}}
    container = {"name": "c", "securityContext": container_context}
    assert run_as(container, pod, image_user) == want


@pytest.mark.parametrize(
    ("context", "image_user", "message"),
    [
        ({"runAsNonRoot": True}, "", "runAsNonRoot and image will run as root"),
        ({}, "nonroot", "image USER 'nonroot' is not numeric"),
    ],
)
def test_a_user_the_kubelet_would_refuse_is_a_config_error(
    context: dict[str, Any], image_user: str, message: str
) -> None:
    with pytest.raises(EnvError, match=message):
        run_as({"name": "c", "securityContext": context}, POD, image_user)
