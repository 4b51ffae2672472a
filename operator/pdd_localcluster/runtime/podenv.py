"""A container's environment, resolved the way the kubelet does: the image's ENV, then the
service variables (here only the apiserver's, since the runner stands in for kube-proxy only
for it), then the container's `env` in order, each value with `$(VAR)` expanded against the
variables defined before it. Pure: secrets and config maps come through `lookup_data`."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Json = dict[str, Any]

# (kind "secret"|"configmap", name) -> its data decoded to text, or None when it does not exist.
DataLookup = Callable[[str, str], Mapping[str, str] | None]


class EnvError(Exception):
    """The container cannot start: a reference it needs does not resolve (what the kubelet
    reports as CreateContainerConfigError)."""


_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(value: str, defined: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: a reference to an undefined variable stays as written,
    `$$` is a literal `$`."""

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return defined.get(name, m.group(0))

    return _VAR_REF.sub(one, value)


def field_value(pod: Json, path: str) -> str:
    """A downward-API fieldRef of the pod."""
    meta = pod.get("metadata", {})
    spec = pod.get("spec", {})
    status = pod.get("status", {})
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
        "status.podIP": status.get("podIP", ""),
        "status.hostIP": status.get("hostIP", ""),
    }
    if path in simple:
        return str(simple[path])
    m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    raise EnvError(f"fieldRef {path!r} is not supported by the local runtime")


def _value_from(src: Json, pod: Json, lookup_data: DataLookup) -> str | None:
    if "fieldRef" in src:
        return field_value(pod, src["fieldRef"]["fieldPath"])
    for kind, field in (("secret", "secretKeyRef"), ("configmap", "configMapKeyRef")):
        if field in src:
            ref = src[field]
            data = lookup_data(kind, ref["name"])
            value = (data or {}).get(ref["key"])
            if value is None and not ref.get("optional"):
                raise EnvError(_unresolved(kind, ref, data is None, pod))
            return value
    if "resourceFieldRef" in src:
        return "0"  # nothing here enforces limits; a divisor-correct value is not worth it
    raise EnvError(f"unsupported valueFrom {sorted(src)}")


def _unresolved(kind: str, ref: Json, missing: bool, pod: Json) -> str:
    """The kubelet's words for a reference that does not resolve (what a
    CreateContainerConfigError says, and what the operator reads)."""
    if missing:
        name = ref["name"]
        return f'{kind} "{name}" not found'
    title = "Secret" if kind == "secret" else "ConfigMap"
    where = f"{pod['metadata'].get('namespace', '')}/{ref['name']}"
    return f"couldn't find key {ref['key']} in {title} {where}"


def container_env(
    container: Json,
    pod: Json,
    *,
    image_env: Mapping[str, str],
    service_env: Mapping[str, str],
    lookup_data: DataLookup,
) -> dict[str, str]:
    env: dict[str, str] = {**image_env, "HOSTNAME": pod["metadata"]["name"]}
    env.update(service_env)
    for src in container.get("envFrom") or []:
        env.update(_env_from(src, lookup_data))
    for var in container.get("env") or []:
        if "valueFrom" in var:
            value = _value_from(var["valueFrom"], pod, lookup_data)
            if value is None:
                continue
            env[var["name"]] = value
        else:
            env[var["name"]] = expand(var.get("value", ""), env)
    return env


def _env_from(src: Json, lookup_data: DataLookup) -> dict[str, str]:
    if "secretRef" in src:
        kind, ref = "secret", src["secretRef"]
    else:
        kind, ref = "configmap", src["configMapRef"]
    data = lookup_data(kind, ref["name"])
    if data is None:
        if ref.get("optional"):
            return {}
        name = ref["name"]
        raise EnvError(f'{kind} "{name}" not found')
    prefix = src.get("prefix", "")
    return {prefix + k: v for k, v in data.items()}


def command_line(
    container: Json,
    image_entrypoint: Sequence[str],
    env: Mapping[str, str],
    image_cmd: Sequence[str] = (),
) -> list[str]:
    """The container's argv, as a container runtime builds it from the pod spec and the image:
    `command` replaces the image's ENTRYPOINT and drops its CMD; `args` replace the CMD; with
    neither, ENTRYPOINT + CMD. `$(VAR)` is expanded in command and args, not in the image's."""
    command = container.get("command")
    args = container.get("args")
    if command:
        argv = [expand(a, env) for a in [*command, *(args or [])]]
    else:
        tail = [expand(a, env) for a in args] if args else list(image_cmd)
        argv = [*image_entrypoint, *tail]
    if not argv:
        raise EnvError("no command: the pod names none and the image has no entrypoint")
    return argv


def run_as(container: Json, pod: Json, image_user: str) -> tuple[int, int]:
    """The (uid, gid) a container's process runs as: the container's securityContext
    runAsUser/runAsGroup over the pod's, else the image's USER ("uid[:gid]"), else root. A
    named (non-numeric) USER is refused, as the kubelet refuses it with runAsNonRoot."""
    pod_context = (pod.get("spec") or {}).get("securityContext") or {}
    context = {**pod_context, **(container.get("securityContext") or {})}
    user, _, group = image_user.partition(":")
    try:
        uid = int(context.get("runAsUser", user or 0))
        gid = int(context.get("runAsGroup", group or 0))
    except ValueError:
        raise EnvError(f"image USER {image_user!r} is not numeric: set runAsUser") from None
    if context.get("runAsNonRoot") and uid == 0:
        raise EnvError("container has runAsNonRoot and image will run as root")
    return uid, gid
