"""Process-wide objects of a running operator (kept in kopf's memo, not in globals)."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, cast

from pdd_operator.api import names
from pdd_operator.api.names import DeploymentKey
from pdd_operator.config import OperatorConfig
from pdd_operator.informers.creation_events import CreationEvents, creation_event_collections
from pdd_operator.informers.fleet import FleetCache, FleetState, fleet_collections
from pdd_operator.informers.listwatch import Watches
from pdd_operator.informers.mount_events import MountFailures, mount_event_collections
from pdd_operator.informers.owned import OwnedObjects, owned_collections
from pdd_operator.informers.view import IndexView
from pdd_operator.kube.client import (
    API_CONNECTIONS,
    KubeApi,
    api_error_message,
    load_api_client,
)
from pdd_operator.metrics import OperatorMetrics
from pdd_operator.reconcile import EventSink, Reconciler
from pdd_operator.rendering.context import OperatorSettings

log = logging.getLogger(__name__)


@dataclass
class OperatorRuntime:
    config: OperatorConfig
    kube: KubeApi
    metrics: OperatorMetrics
    settings: OperatorSettings
    watches: Watches
    view: IndexView
    reconciler: Reconciler
    # The PDDeployments as kopf last handed them (written by the handler only).
    pdds: dict[DeploymentKey, Mapping[str, Any]]
    # A handler's context: kopf.event() finds kopf's event queue through context variables
    # that only handlers have; passes started by the informers and the resync run outside.
    handler_context: contextvars.Context | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _passes: set[asyncio.Task[None]] = field(default_factory=set)

    @classmethod
    def start(
        cls, config: OperatorConfig, metrics: OperatorMetrics, fence: Callable[[], None] | None
    ) -> OperatorRuntime:
        """`fence` (the leader election's) runs before every write this runtime makes."""
        settings = OperatorSettings(
            sidecar_image=config.sidecar_image,
            router_image=config.router_image,
            image_pull_secrets=config.image_pull_secrets,
            metrics_scraper_namespaces=config.metrics_scraper_namespaces,
            metrics_scraper_pod_labels=config.metrics_scraper_pod_labels,
        )
        kube = KubeApi(load_api_client(config.kubeconfig), settings.field_manager, fence)
        loop = asyncio.get_running_loop()
        # API calls run in threads (asyncio.to_thread); the default pool has cpu+4 threads,
        # which serialises the applies of many deployments behind each other.
        loop.set_default_executor(
            ThreadPoolExecutor(max_workers=API_CONNECTIONS, thread_name_prefix="pdd-api")
        )
        pdds: dict[DeploymentKey, Mapping[str, Any]] = {}
        state, owned = FleetState(), OwnedObjects()

        def refusal_changed(workload_uid: str) -> None:  # from the Events' informer thread
            if (key := owned.deployment_of_child(workload_uid)) is not None:
                trigger(key, "events")

        def token_missing(namespace: str, secret: str) -> None:  # from the Events' thread
            for key, body in list(pdds.items()):
                uid = str(body.get("metadata", {}).get("uid", ""))
                if key[0] == namespace and names.token_secret_name(key[1], uid) == secret:
                    trigger(key, "events")

        creations = CreationEvents(refusal_changed)
        mounts = MountFailures(token_missing)
        view = IndexView(pdds, owned, FleetCache(state), creations, mounts)
        reconciler = Reconciler(
            kube,
            view,
            settings,
            _fenced(fence, _kopf_event),
            metrics,
            max_concurrent=config.max_concurrent_passes,
            coalesce_max_s=config.coalesce_max_seconds,
            names_guarded=_name_guard_in_force(kube, config.name_guard_policy),
        )
        watches = Watches(kube)
        runtime = cls(config, kube, metrics, settings, watches, view, reconciler, pdds)

        def trigger(key: DeploymentKey, cause: str) -> None:  # from an informer's thread
            loop.call_soon_threadsafe(runtime.start_pass, key, cause)

        watches.add(fleet_collections(state, config.namespaces))
        watches.add(
            owned_collections(
                owned,
                config.namespaces,
                settings.field_manager,
                trigger,
                state.own_pod,
                reconciler.own_object_writes,
            )
        )
        watches.add(creation_event_collections(creations, config.namespaces))
        watches.add(mount_event_collections(mounts, config.namespaces))
        watches.start()
        runtime.tasks.append(asyncio.create_task(runtime.resync_forever()))
        return runtime

    def start_pass(self, key: DeploymentKey, cause: str) -> None:
        """A pass for a change an informer saw. Before any kopf handler ran there is no
        context to post events from, and no deployment known: kopf's own start-up events
        give every deployment its first pass."""
        if self.handler_context is None:
            return
        pass_ = self._coalesced_pass(key, cause)
        task = asyncio.create_task(pass_, context=self.handler_context)
        self._passes.add(task)
        task.add_done_callback(self._passes.discard)

    async def _coalesced_pass(self, key: DeploymentKey, cause: str) -> None:
        """Child and pod events come in bursts (pods are created, bound and become ready one
        after another): the pass waits for a quiet moment so that one pass answers the burst."""
        await self.watches.synced()
        try:
            await self.reconciler.reconcile(key, self.config.coalesce_seconds, cause)
        except Exception:  # one bad object must not go unreported, nor stop others
            log.exception("reconcile of %s/%s failed", *key)

    async def resync_forever(self) -> None:
        """Level-triggered safety net: reconcile every PDDeployment each resync period."""
        while True:
            await asyncio.sleep(self.config.resync_seconds)
            if self.handler_context is None:
                continue
            await self.watches.synced()
            for key in list(self.pdds):
                pass_ = self.reconciler.reconcile(key, cause="resync")
                try:
                    await asyncio.create_task(pass_, context=self.handler_context)
                except Exception:  # one bad object must not stop the loop
                    log.exception("resync of %s/%s failed", *key)

    def remember_handler_context(self) -> None:
        if self.handler_context is None:
            self.handler_context = contextvars.copy_context()

    async def stop(self) -> None:
        self.watches.stop()
        for task in [*self.tasks, *self._passes]:
            task.cancel()
        await asyncio.gather(*self.tasks, *self._passes, return_exceptions=True)


def _name_guard_in_force(kube: KubeApi, policy: str) -> bool:
    """Whether the name-guard admission policy refuses takeovers, so that new children's
    names need no look-up (docs/security.md, "Names and ownership"); read once at start-up."""
    if not policy:
        log.info("no name-guard policy configured: each new child's name is looked up first")
        return False
    try:
        problem = kube.name_guard_problem(policy)
    except Exception as err:  # an unreachable API server: the safe way, said once
        problem = api_error_message(err)
    if problem:
        log.warning(
            "the name-guard policy is not in force (%s): each new child's name is looked up "
            "before its apply instead",
            problem,
        )
        return False
    log.info("name-guard policy %s in force: new children are applied without a look-up", policy)
    return True


def _fenced(fence: Callable[[], None] | None, post: EventSink) -> EventSink:
    """The Events kopf posts are writes too: the fence is checked as one is queued (kopf
    sends it from its queue within the same turn of the event loop)."""
    if fence is None:
        return post

    def fenced(body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        fence()
        post(body, type_, reason, message)

    return fenced


def _kopf_event(body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    import kopf

    # The PDDeployment as the handler stored it: a plain copy of the watched object's body.
    raw = cast(kopf.RawBody, dict(body))
    kopf.event(kopf.Body(raw), type=type_, reason=reason, message=message[:1000])
