"""Pods as a watch keeps them, for what a test asks many times a second: which router pod is
ready before every request of steady traffic, which revision each pod address had. Listing
the pods for each answer cost the test process and the API server about a third of a core
through a request-path test (profiled with py-spy, most of it decoding pod lists); a watch
sends each change once. It is the same view an informer gives a controller: a list, then the
changes since its resourceVersion, listed again when the server says that version is gone."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from kubernetes import client, watch

from helpers.waits import wait_for

# The server ends each watch after this long; the loop then watches on from the version it
# reached. Short, so that stop() ends the thread soon after.
WATCH_WINDOW_S = 5
SYNC_TIMEOUT_S = 30.0

PodSeen = Callable[[Any], None]


class PodWatch:
    """The pods of `namespace` that match `label_selector`, kept current by a watch thread.
    `on_pod` is called with every pod the list and the watch deliver (deleted ones too)."""

    def __init__(
        self,
        core: client.CoreV1Api,
        namespace: str,
        label_selector: str = "",
        on_pod: PodSeen | None = None,
    ) -> None:
        self._core, self._namespace, self._selector = core, namespace, label_selector
        self._on_pod = on_pod
        self._pods: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> PodWatch:
        self._thread.start()
        wait_for(self._synced.is_set, SYNC_TIMEOUT_S, interval=0.05, what="the first pod list")
        return self

    def stop(self) -> None:
        self._stop.set()

    def pods(self) -> list[Any]:
        with self._lock:
            return list(self._pods.values())

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._watch_from(self._relist())
            except Exception:  # a dropped connection or an expired version: list again
                self._stop.wait(0.2)

    def _relist(self) -> str:
        listed = self._core.list_namespaced_pod(self._namespace, label_selector=self._selector)
        with self._lock:
            self._pods = {pod.metadata.name: pod for pod in listed.items}
        for pod in listed.items:
            self._seen(pod)
        self._synced.set()
        return str(listed.metadata.resource_version)

    def _watch_from(self, version: str) -> None:
        while not self._stop.is_set():
            stream = watch.Watch().stream(
                self._core.list_namespaced_pod,
                self._namespace,
                label_selector=self._selector,
                resource_version=version,
                timeout_seconds=WATCH_WINDOW_S,
            )
            for event in stream:
                if event["type"] == "ERROR":  # the version expired: _run lists again
                    return
                pod = event["object"]
                version = pod.metadata.resource_version
                with self._lock:
                    if event["type"] == "DELETED":
                        self._pods.pop(pod.metadata.name, None)
                    else:
                        self._pods[pod.metadata.name] = pod
                self._seen(pod)

    def _seen(self, pod: Any) -> None:
        if self._on_pod is not None:
            self._on_pod(pod)


@contextmanager
def watching_pods(
    core: client.CoreV1Api, namespace: str, label_selector: str = "", on_pod: PodSeen | None = None
) -> Iterator[PodWatch]:
    pods = PodWatch(core, namespace, label_selector, on_pod).start()
    try:
        yield pods
    finally:
        pods.stop()
