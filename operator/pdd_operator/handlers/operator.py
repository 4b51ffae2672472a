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
from pdd_operator.config import OperatorConfig
from pdd_operator.handlers.runtime import OperatorRuntime
from pdd_operator.handlers.view import CHILD_INDEX_PREFIX, IndexView
from pdd_operator.kube.client import load_configuration
from pdd_operator.kube.resources import CHILD_KINDS, POD, ROLE_SCALER, Kind
from pdd_operator.reconcile import Reconciler
from pdd_operator.rendering.context import OperatorSettings
from pdd_operator.status.observe import (
    controller_uid,
    owner_key,
    summarize_child,
    summarize_pod,
    summarize_scaler,
)

log = logging.getLogger(__name__)
MANAGED = {"app.kubernetes.io/managed-by": names.MANAGED_BY}
REPLICASETS = Kind("apps/v1", "ReplicaSet", "replicasets")
# Every handler of these kinds filters on MANAGED, so the apiserver may filter for us.
OWN_LABELLED_KINDS = (*CHILD_KINDS, ROLE_SCALER, REPLICASETS, POD)


@kopf.on.login()
def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    """kopf's own connection, from the same credentials as the operator's API client (kopf's
    `login_via_client` would read the kubeconfig from the environment instead)."""
    config: OperatorConfig = memo["config"]
    return _connection_info(load_configuration(config.kubeconfig))


def _connection_info(configuration: Any) -> kopf.ConnectionInfo:
    # As kopf.login_via_client reads a client Configuration: the token is whatever the client
    # would send (it may come from an exec plugin or a token file), with its scheme.
    header = configuration.get_api_key_with_prefix(
        "BearerToken"
    ) or configuration.get_api_key_with_prefix("authorization")
    scheme, _, token = header.partition(" ") if header else ("", "", "")
    if not token:
        scheme, token = "", scheme
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        username=configuration.username or None,
        password=configuration.password or None,
        scheme=scheme or None,
        token=token or None,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
    )


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    config: OperatorConfig = memo["config"]  # built once by the cli, passed to kopf.run
    # Explicit events (condition transitions) are posted; handler log lines never become
    # Event writes, or an unchanged resync would write.
    settings.posting.level = logging.CRITICAL + 10
    settings.watching.server_timeout = 600
    settings.watching.client_timeout = 660
    # kopf runs one worker per watched object. A limit deadlocks start-up once an indexed kind
    # has more objects than the limit (each worker waits for every object to be indexed while
    # holding its slot), so none by default; the reconciler bounds its own passes instead.
    settings.queueing.worker_limit = config.worker_limit or None
    settings.persistence.diffbase_storage = NoDiffBase()
    watch_only_ours(settings)
    memo["runtime"] = OperatorRuntime.start(config)


def watch_only_ours(settings: kopf.OperatorSettings) -> None:
    """Server-side label selectors for the kinds whose every handler filters on MANAGED.

    kopf's `labels=` filters run in the operator: without these the apiserver sends every
    StatefulSet, Service, Secret... of the whole cluster, and each is parsed and dropped.
    kopf opens one watch per resource and applies a selector to all its handlers, so a kind
    qualifies only when all of its handlers want our objects alone. Every Node and every bound
    pod (for GPU capacity) comes from the fleet watch instead (handlers/fleet.py).
    """
    selector = ",".join(f"{k}={v}" for k, v in MANAGED.items())
    for kind in OWN_LABELLED_KINDS:
        settings.watching.label_selectors[kind.group, kind.version, kind.plural] = selector


class NoDiffBase(kopf.DiffBaseStorage):
    """No last-handled state: only event handlers are registered, which need no diff, and
    kopf's default builds one per watch event by deep-copying the whole body."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> Any:
        return None

    def fetch(self, *, body: kopf.Body) -> None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: Any) -> None:
        return None


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    runtime: OperatorRuntime | None = memo.get("runtime")
    if runtime:
        await runtime.stop()


# Index functions are `async` although they never await: kopf runs a plain function in a
# thread for every watch event, and that hop cost more than the indexing itself.


# PDDeployments and pods are namespaced: kopf's `namespace` (None only for cluster-scoped
# kinds) is always a name here.


@kopf.index(api.GROUP, api.VERSION, api.PLURAL)
async def pdd_index(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> Any:
    return {(namespace or "", name): _plain(body)}


def _child_indexer(plural: str) -> Any:
    async def index(body: kopf.Body, memo: kopf.Memo, **_: Any) -> Any:
        key = owner_key(body)
        if not key:
            return None
        runtime: OperatorRuntime | None = memo.get("runtime")
        if runtime is None:
            return {key: summarize_child(body, OperatorSettings.field_manager)}
        summary = summarize_child(body, runtime.settings.field_manager, runtime.digests)
        runtime.changes.saw(summary.uid, summary)
        return {key: summary}

    return index


for _kind in CHILD_KINDS:
    kopf.index(
        _kind.group,
        _kind.version,
        _kind.plural,
        labels=MANAGED,
        id=f"{CHILD_INDEX_PREFIX}{_kind.plural}",
    )(_child_indexer(_kind.plural))


# Scale targets by their PDDeployment; their spec.replicas is the HPA's (or KEDA's) ask.
@kopf.index(api.GROUP, api.VERSION, api.SCALER_PLURAL, labels=MANAGED)
async def scaler_index(body: kopf.Body, **_: Any) -> Any:
    key = owner_key(body)
    return {key: summarize_scaler(body)} if key else None


@kopf.on.event(api.GROUP, api.VERSION, api.SCALER_PLURAL, labels=MANAGED)
async def on_scaler(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    key = owner_key(body)
    if key:
        await _coalesced(memo, key, kwargs)


# Pods by their controller's uid (a StatefulSet's or a ReplicaSet's): the view follows the
# owner chain from the PDDeployment's uid, so a pod that copies the labels is no one's.
@kopf.index("v1", "pods", labels=MANAGED)
async def pod_index(namespace: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> Any:
    owner = controller_uid(body)
    if not owner:
        return None
    summary = summarize_pod(body)
    runtime: OperatorRuntime | None = memo.get("runtime")
    if runtime is not None:
        runtime.changes.saw(summary.uid, summary)
    return {(namespace or "", owner): summary}


# The router Deployment's ReplicaSets (they carry its pod template's labels): the link between
# the Deployment and its pods.
@kopf.index("apps", "v1", "replicasets", labels=MANAGED)
async def replicaset_index(namespace: str | None, body: kopf.Body, **_: Any) -> Any:
    owner = controller_uid(body, "Deployment")
    uid = body.get("metadata", {}).get("uid", "")
    return {(namespace or "", owner): uid} if owner and uid else None


@kopf.on.event(api.GROUP, api.VERSION, api.PLURAL)
async def on_pddeployment(
    namespace: str | None, name: str, body: kopf.Body, memo: kopf.Memo, **kwargs: Any
) -> None:
    reconciler = await _reconciler(memo, kwargs)
    key = (namespace or "", name)
    version = body.get("metadata", {}).get("resourceVersion", "")
    if not reconciler.is_own_status_write(key, version):
        await reconciler.reconcile(key)


def _child_event_handler() -> Any:
    async def handler(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
        key = owner_key(body)
        if _worth_a_pass(memo, body, kwargs) and key:
            await _coalesced(memo, key, kwargs)

    return handler


for _kind in CHILD_KINDS:
    kopf.on.event(
        _kind.group, _kind.version, _kind.plural, labels=MANAGED, id=f"on_{_kind.plural}"
    )(_child_event_handler())


@kopf.on.event("v1", "pods", labels=MANAGED)
async def on_pod(namespace: str | None, body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    owner = body.get("metadata", {}).get("annotations", {}).get(names.ANNOTATION_OWNER_NAME)
    if _worth_a_pass(memo, body, kwargs) and owner:
        await _coalesced(memo, (namespace or "", owner), kwargs)


def _worth_a_pass(memo: kopf.Memo, body: kopf.Body, kwargs: dict[str, Any]) -> bool:
    """Whether the event changed what a pass reads of the object (handlers/changes.py).
    Asked for every event, so that a deletion always forgets the object's looks."""
    runtime: OperatorRuntime = memo["runtime"]
    uid = str(body.get("metadata", {}).get("uid", ""))
    return runtime.changes.worth_a_pass(uid, kwargs.get("type"))


async def _coalesced(memo: kopf.Memo, key: tuple[str, str], kwargs: dict[str, Any]) -> None:
    """Child and pod events come in bursts (a pod is scheduled, bound, started, ready): the
    pass waits a moment so that one pass answers the whole burst."""
    runtime: OperatorRuntime = memo["runtime"]
    reconciler = await _reconciler(memo, kwargs)
    await reconciler.reconcile(key, runtime.config.coalesce_seconds)


async def _reconciler(memo: kopf.Memo, kwargs: dict[str, Any]) -> Reconciler:
    """The reconciler over the handler's indexes, once the fleet was listed (kopf waits for its
    own indexes to be complete before any handler runs; the fleet watch is ours)."""
    runtime: OperatorRuntime = memo["runtime"]
    await runtime.fleet_watch.synced()
    indexes = {k: v for k, v in kwargs.items() if isinstance(v, kopf.Index)}
    view = IndexView(indexes, runtime.fleet)
    runtime.remember_view(view)
    return runtime.reconciler(view)


def _plain(body: kopf.Body) -> dict[str, Any]:
    """A detached copy: kopf reuses the body object across events."""
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": dict(body.get("metadata", {})),
        "spec": body.get("spec", {}),
        "status": body.get("status", {}),
    }
