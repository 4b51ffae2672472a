"""Process-wide objects of a running operator (kept in kopf's memo, not in globals)."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, cast

from pdd_operator.config import OperatorConfig
from pdd_operator.handlers.changes import ChangeFilter
from pdd_operator.handlers.fleet import FleetCache, FleetState, FleetWatch
from pdd_operator.handlers.view import IndexView
from pdd_operator.kube.client import API_CONNECTIONS, KubeApi, load_api_client
from pdd_operator.metrics import OperatorMetrics
from pdd_operator.reconcile import ClusterView, Reconciler
from pdd_operator.rendering.context import OperatorSettings
from pdd_operator.status.drift import LiveDigests

log = logging.getLogger(__name__)


@dataclass
class OperatorRuntime:
    config: OperatorConfig
    kube: KubeApi
    metrics: OperatorMetrics
    settings: OperatorSettings
    fleet_watch: FleetWatch
    fleet: FleetCache
    # The children's owned-fields digests, reused across their status-only events.
    digests: LiveDigests = field(default_factory=LiveDigests)
    # Which child and pod events change what a pass reads (the others trigger none).
    changes: ChangeFilter = field(default_factory=ChangeFilter)
    _reconciler: Reconciler | None = None
    last_view: IndexView | None = None
    # A handler's context: kopf.event() finds kopf's event queue through context variables
    # that only handlers have, and the resync task runs outside them.
    handler_context: contextvars.Context | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @classmethod
    def start(cls, config: OperatorConfig) -> OperatorRuntime:
        settings = OperatorSettings(sidecar_image=config.sidecar_image)
        kube = KubeApi(load_api_client(config.kubeconfig), settings.field_manager)
        metrics = OperatorMetrics()
        if config.metrics_port:
            metrics.serve(config.metrics_port)
        # API calls run in threads (asyncio.to_thread); the default pool has cpu+4 threads,
        # which serialises the applies of many deployments behind each other.
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(max_workers=API_CONNECTIONS, thread_name_prefix="pdd-api")
        )
        state = FleetState()
        fleet_watch = FleetWatch(kube, state, config.namespaces)
        fleet_watch.start()
        runtime = cls(
            config=config,
            kube=kube,
            metrics=metrics,
            settings=settings,
            fleet_watch=fleet_watch,
            fleet=FleetCache(state),
        )
        runtime.tasks.append(asyncio.create_task(runtime.resync_forever()))
        return runtime

    async def resync_forever(self) -> None:
        """Level-triggered safety net: reconcile every PDDeployment each resync period."""
        while True:
            await asyncio.sleep(self.config.resync_seconds)
            view = self.last_view
            if view is None:
                continue
            await self.fleet_watch.synced()
            for key in list(view.indexes["pdd_index"].keys()):
                pass_ = self.reconciler(view).reconcile(key)
                try:
                    await asyncio.create_task(pass_, context=self.handler_context)
                except Exception:  # one bad object must not stop the loop
                    log.exception("resync of %s/%s failed", *key)

    def remember_view(self, view: IndexView) -> None:
        self.last_view = view
        if self.handler_context is None:
            self.handler_context = contextvars.copy_context()

    def reconciler(self, view: ClusterView) -> Reconciler:
        if self._reconciler is None:
            self._reconciler = Reconciler(
                self.kube,
                view,
                self.settings,
                _kopf_event,
                self.metrics,
                max_concurrent=self.config.max_concurrent_passes,
                token_recheck_s=self.config.resync_seconds,
            )
        self._reconciler.view = view
        return self._reconciler

    async def stop(self) -> None:
        self.fleet_watch.stop()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def _kopf_event(body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    import kopf

    # The PDDeployment as the index holds it: a plain copy of the watched object's raw body.
    raw = cast(kopf.RawBody, dict(body))
    kopf.event(kopf.Body(raw), type=type_, reason=reason, message=message[:1000])
