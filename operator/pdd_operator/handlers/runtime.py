"""Process-wide objects of a running operator (kept in kopf's memo, not in globals)."""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pdd_operator.handlers.view import FleetCache
from pdd_operator.kube.client import API_CONNECTIONS, KubeApi, load_api_client
from pdd_operator.metrics import OperatorMetrics
from pdd_operator.reconcile import Reconciler
from pdd_operator.rendering.context import OperatorSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RuntimeConfig:
    kubeconfig: str | None = None
    sidecar_image: str = OperatorSettings.sidecar_image
    resync_seconds: float = 300.0
    metrics_port: int = 0  # 0: no metrics server
    worker_limit: int = 64

    @classmethod
    def from_env(cls) -> RuntimeConfig:
        env = os.environ
        return cls(
            kubeconfig=env.get("PDD_KUBECONFIG") or None,
            sidecar_image=env.get("PDD_SIDECAR_IMAGE", OperatorSettings.sidecar_image),
            resync_seconds=float(env.get("PDD_RESYNC_SECONDS", "300")),
            metrics_port=int(env.get("PDD_METRICS_PORT", "0")),
            worker_limit=int(env.get("PDD_WORKER_LIMIT", "64")),
        )


def runtime_settings() -> RuntimeConfig:
    return RuntimeConfig.from_env()


@dataclass
class OperatorRuntime:
    config: RuntimeConfig
    kube: KubeApi
    metrics: OperatorMetrics
    settings: OperatorSettings
    fleet: FleetCache = field(default_factory=FleetCache)
    _reconciler: Reconciler | None = None
    last_view: Any = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @classmethod
    def start(cls, config: RuntimeConfig) -> OperatorRuntime:
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
        runtime = cls(config=config, kube=kube, metrics=metrics, settings=settings)
        runtime.tasks.append(asyncio.create_task(runtime.resync_forever()))
        return runtime

    async def resync_forever(self) -> None:
        """Level-triggered safety net: reconcile every PDDeployment each resync period."""
        while True:
            await asyncio.sleep(self.config.resync_seconds)
            view = self.last_view
            if view is None:
                continue
            for key in list(view.indexes["pdd_index"].keys()):
                try:
                    await self.reconciler(view).reconcile(key)
                except Exception:  # one bad object must not stop the loop
                    log.exception("resync of %s/%s failed", *key)

    def remember_view(self, view: Any) -> None:
        self.last_view = view

    def reconciler(self, view: Any) -> Reconciler:
        if self._reconciler is None:
            self._reconciler = Reconciler(self.kube, view, self.settings, _kopf_event, self.metrics)
        self._reconciler.view = view
        return self._reconciler

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def _kopf_event(body: Any, type_: str, reason: str, message: str) -> None:
    import kopf

    kopf.event(dict(body), type=type_, reason=reason, message=message[:1000])
