"""kopf registrations: the operator's start and stop, and the PDDeployment's one handler.

kopf watches PDDeployments only. Children, pods, Nodes and scale targets come from the
operator's own informers (informers/listwatch.py), which trigger passes themselves: kopf's
per-object handling of those many objects was the operator's cost at scale.

No change-detecting handlers (on.create/update/resume) and no timers: those make kopf write
annotations and finalizers onto PDDeployments. An event handler plus a resync task keep the
operator level-triggered and write-free when nothing changed.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from pdd_operator.api import v1alpha1 as api
from pdd_operator.config import OperatorConfig
from pdd_operator.handlers.runtime import OperatorRuntime
from pdd_operator.kube.client import load_configuration

log = logging.getLogger(__name__)


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
    # kopf runs one worker per PDDeployment; the reconciler bounds its own passes instead.
    settings.queueing.worker_limit = config.worker_limit or None
    settings.persistence.diffbase_storage = NoDiffBase()
    # Built by the cli before the election: the metrics (served by a standby too) and the
    # Lease's fence, which every write passes (None without election).
    memo["runtime"] = OperatorRuntime.start(config, memo["metrics"], memo["fence"])


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


@kopf.on.event(api.GROUP, api.VERSION, api.PLURAL)
async def on_pddeployment(
    type: str | None, namespace: str | None, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any
) -> None:
    runtime: OperatorRuntime = memo["runtime"]
    runtime.remember_handler_context()
    key = (namespace or "", name)  # PDDeployments are namespaced
    if type == "DELETED":
        runtime.pdds.pop(key, None)
    else:
        runtime.pdds[key] = _plain(body)
    await runtime.watches.synced()
    version = body.get("metadata", {}).get("resourceVersion", "")
    await runtime.reconciler.deployment_changed(key, version)


def _plain(body: kopf.Body) -> dict[str, Any]:
    """A detached copy: kopf reuses the body object across events."""
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": dict(body.get("metadata", {})),
        "spec": body.get("spec", {}),
        "status": body.get("status", {}),
    }
