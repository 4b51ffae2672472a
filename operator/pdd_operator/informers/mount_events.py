"""Which Secrets pods could not mount: their kubelets' FailedMount Events.

The operator may not read Secrets (docs/security.md), so it learns that the sidecar token
Secret of a deployment is gone the way a user would: a pod that mounts it waits in
ContainerCreating and its kubelet posts `MountVolume.SetUp failed for volume "sidecar-token" :
secret "<name>" not found`. The API server selects those Events (a field selector); this store
keeps, per Secret, the newest report of each pod. A new report asks for a pass of the
deployment the Secret belongs to, which creates it again within seconds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pdd_operator.informers.listwatch import Collection
from pdd_operator.kube.resources import EVENT
from pdd_operator.status.token import MountFailure, missing_secret

FAILED_MOUNT_EVENTS = ("fieldSelector", "involvedObject.kind=Pod,reason=FailedMount")
SecretMissing = Callable[[str, str], None]  # gets the namespace and the Secret's name


class MountFailures:
    """FailedMount reports of missing Secrets, by (namespace, Secret name), then pod."""

    def __init__(self, on_missing: SecretMissing | None = None) -> None:
        self._on_missing = on_missing
        self._reports: dict[tuple[str, str], dict[str, MountFailure]] = {}
        self._lock = threading.Lock()

    def of(self, namespace: str, secret: str) -> list[MountFailure]:
        """Each pod's newest report about this Secret, newest first."""
        with self._lock:
            reports = list(self._reports.get((namespace, secret), {}).values())
        return sorted(reports, key=lambda r: r.when, reverse=True)

    def __len__(self) -> int:
        return len(self._reports)

    def apply(self, event_type: str, body: Mapping[str, Any]) -> None:
        found = missing_secret(body)
        if found is None or event_type == "DELETED":
            return  # an Event's expiry says nothing about the Secret
        where, failure = found
        with self._lock:
            pods = self._reports.setdefault(where, {})
            before = pods.get(failure.pod)
            if before is not None and before.when > failure.when:
                return
            pods[failure.pod] = failure
        if self._on_missing is not None and (before is None or before.seen != failure.seen):
            self._on_missing(*where)

    def reset(self, bodies: Iterable[Mapping[str, Any]]) -> None:
        """A fresh list (at start, or after a watch was lost): every deployment gets a pass
        then anyway, which looks at what is listed."""
        fresh: dict[tuple[str, str], dict[str, MountFailure]] = {}
        for body in bodies:
            if (found := missing_secret(body)) is not None:
                where, failure = found
                pods = fresh.setdefault(where, {})
                if failure.pod not in pods or pods[failure.pod].when <= failure.when:
                    pods[failure.pod] = failure
        with self._lock:
            self._reports = fresh


def mount_event_collections(failures: MountFailures, namespaces: Iterable[str]) -> list[Collection]:
    """The pods' FailedMount Events of the whole cluster, or of each namespace the operator
    is confined to."""
    return [
        Collection(
            f"failed-mount events{f' in {ns}' if ns else ''}",
            EVENT.path(ns or None),
            (FAILED_MOUNT_EVENTS,),
            failures,
        )
        for ns in tuple(namespaces) or ("",)
    ]
