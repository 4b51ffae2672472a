"""kopf registrations: indexes (watch-fed caches) and thin handlers that call the reconciler.

No change-detecting handlers (on.create/update/resume) and no timers: those make kopf write
annotations and finalizers onto PDDeployments. Event handlers plus a resync task keep the
operator level-triggered and write-free when nothing changed.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from pdd_operator.api import names
from pdd_operator.api import v1alpha1 as api
from pdd_operator.handlers.runtime import OperatorRuntime, runtime_settings
from pdd_operator.handlers.view import CHILD_INDEX_PREFIX, IndexView
from pdd_operator.kube.resources import CHILD_KINDS
from pdd_operator.planning.compact import compact_node, compact_pod
from pdd_operator.status.observe import owner_key, summarize_child, summarize_pod

log = logging.getLogger(__name__)
MANAGED = {"app.kubernetes.io/managed-by": names.MANAGED_BY}


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    return kopf.login_via_client(**kwargs)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    config = runtime_settings()
    # Explicit events (condition transitions) are posted; handler log lines never become
    # Event writes, or an unchanged resync would write.
    settings.posting.level = logging.CRITICAL + 10
    settings.watching.server_timeout = 600
    settings.watching.client_timeout = 660
    settings.batching.worker_limit = config.worker_limit
    memo["runtime"] = OperatorRuntime.start(config)


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    runtime: OperatorRuntime | None = memo.get("runtime")
    if runtime:
        await runtime.stop()


@kopf.index(api.GROUP, api.VERSION, api.PLURAL)
def pdd_index(namespace: str, name: str, body: kopf.Body, **_: Any) -> Any:
    return {(namespace, name): _plain(body)}


def _child_indexer(plural: str) -> Any:
    def index(body: kopf.Body, **_: Any) -> Any:
        key = owner_key(body)
        return {key: summarize_child(body)} if key else None

    return index


for _kind in CHILD_KINDS:
    kopf.index(
        _kind.group,
        _kind.version,
        _kind.plural,
        labels=MANAGED,
        id=f"{CHILD_INDEX_PREFIX}{_kind.plural}",
    )(_child_indexer(_kind.plural))


@kopf.index("v1", "pods", labels=MANAGED)
def pod_index(namespace: str, body: kopf.Body, **_: Any) -> Any:
    owner = body.get("metadata", {}).get("annotations", {}).get(names.ANNOTATION_OWNER_NAME)
    return {(namespace, owner): summarize_pod(body)} if owner else None


@kopf.index("v1", "pods", field="spec.nodeName", value=kopf.PRESENT)
def gpu_pod_index(body: kopf.Body, **_: Any) -> Any:
    pod = compact_pod(body)
    return {body["spec"]["nodeName"]: pod} if pod else None


@kopf.index("v1", "nodes")
def node_index(name: str, body: kopf.Body, **_: Any) -> Any:
    return {name: compact_node(body)}


@kopf.on.event(api.GROUP, api.VERSION, api.PLURAL)
async def on_pddeployment(namespace: str, name: str, memo: kopf.Memo, **kwargs: Any) -> None:
    await _reconcile(memo, (namespace, name), kwargs)


def _child_event_handler() -> Any:
    async def handler(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
        key = owner_key(body)
        if key:
            await _reconcile(memo, key, kwargs)

    return handler


for _kind in CHILD_KINDS:
    kopf.on.event(
        _kind.group, _kind.version, _kind.plural, labels=MANAGED, id=f"on_{_kind.plural}"
    )(_child_event_handler())


@kopf.on.event("v1", "pods", labels=MANAGED)
async def on_pod(namespace: str, body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    owner = body.get("metadata", {}).get("annotations", {}).get(names.ANNOTATION_OWNER_NAME)
    if owner:
        await _reconcile(memo, (namespace, owner), kwargs)


async def _reconcile(memo: kopf.Memo, key: tuple[str, str], kwargs: dict[str, Any]) -> None:
    runtime: OperatorRuntime = memo["runtime"]
    indexes = {k: v for k, v in kwargs.items() if isinstance(v, kopf.Index)}
    view = IndexView(indexes, runtime.fleet)
    runtime.remember_view(view)
    await runtime.reconciler(view).reconcile(key)


def _plain(body: kopf.Body) -> dict[str, Any]:
    """A detached copy: kopf reuses the body object across events."""
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": dict(body.get("metadata", {})),
        "spec": body.get("spec", {}),
        "status": body.get("status", {}),
    }
