"""The operator's own informers: list a collection, then follow its watch, in a thread each.

kopf handles every watched object as a task of its own and, for an index, waits for all of
them before any handler runs; that per-object machinery was the operator's cost on the kinds
with many objects (thousands of Nodes and pods, eleven children per deployment): on 2,000 nodes
with a kubelet's ordinary traffic no PDDeployment was ever reconciled. Here one thread per
collection decodes each event once into a sink that keeps what the reconciler reads.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pdd_operator.kube.client import KubeApi, WatchExpired, api_error_message, api_status
from pdd_operator.kube.decoding import WHOLE, Decoding

log = logging.getLogger(__name__)


class Sink(Protocol):
    """What keeps a collection. `reset` reads `bodies` once, to the end, before it replaces
    anything: the list is fetched while it reads, and may fail part-way."""

    def reset(self, bodies: Iterable[Mapping[str, Any]]) -> None: ...
    def apply(self, event_type: str, body: Mapping[str, Any]) -> None: ...
    def __len__(self) -> int: ...


@dataclass(frozen=True)
class Collection:
    what: str  # for log lines
    path: str
    selectors: tuple[tuple[str, str], ...]
    sink: Sink
    decoding: Decoding = WHOLE  # PODS where the sink reads only what kube.decoding keeps


# A kind the API server does not serve (a CRD not installed, an alpha API off) or does not let
# the operator read: looked for again after this long.
ABSENT_RECHECK_S = 60.0


class Watches:
    """Informers for a set of collections; `synced` once every one was listed."""

    # Every collection is listed at once at start, a page of each in memory while it is
    # summarised: on a restart at 1,000 deployments pages of 500 took the lists' peak RSS to
    # 330 MiB, pages of 100 to 150 MiB, in the same time (bench/list_cost.py).
    PAGE = 100
    WATCH_TIMEOUT_S = 300

    def __init__(self, kube: KubeApi) -> None:
        self.kube = kube
        self.collections: list[Collection] = []
        self._stop = threading.Event()
        self._listed: set[str] = set()
        self._lock = threading.Lock()
        self._ready = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    def add(self, collections: Iterable[Collection]) -> None:
        self.collections.extend(collections)

    def start(self) -> None:
        """Start the threads; call from the event loop."""
        self._loop = asyncio.get_running_loop()
        for collection in self.collections:
            threading.Thread(
                target=self._follow,
                args=(collection,),
                name=f"pdd-watch-{collection.what}",
                daemon=True,
            ).start()

    async def synced(self) -> None:
        """Until every collection was listed once (a pass on half a picture acts wrongly)."""
        await self._ready.wait()

    def is_synced(self) -> bool:
        return self._ready.is_set()

    def stop(self) -> None:
        self._stop.set()

    def _follow(self, collection: Collection) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                version = self._relist(collection)
                failures = 0
                while not self._stop.is_set():
                    version = self._watch(collection, version)
            except WatchExpired:
                log.info("the watch of %s expired; listing them again", collection.what)
            except Exception as err:
                if api_status(err).code in (403, 404):
                    self._absent(collection, err)
                    continue
                failures += 1
                delay = min(2.0**failures, 30.0)
                log.warning(
                    "watching %s failed (%s); listing again in %.0fs",
                    collection.what,
                    api_error_message(err),
                    delay,
                )
                self._stop.wait(delay)

    def _absent(self, collection: Collection, err: Exception) -> None:
        """Not served, or not ours to read: nothing of it to wait for (a kind that appears
        later is picked up at the next look)."""
        if api_status(err).code == 403:
            log.warning("may not list %s (%s)", collection.what, api_error_message(err))
        collection.sink.reset(())
        self._mark_listed(collection)
        self._stop.wait(ABSENT_RECHECK_S)

    def _relist(self, collection: Collection) -> str:
        started = time.monotonic()
        listing = _Listing(self.kube, collection, self.PAGE)
        collection.sink.reset(listing)
        if not listing.complete:  # the watch would go on from a version it never read up to
            raise RuntimeError(f"the store of {collection.what} stopped reading its list")
        log.info(
            "listed %d %s in %.1fs (%d kept)",
            listing.count,
            collection.what,
            time.monotonic() - started,
            len(collection.sink),
        )
        self._mark_listed(collection)
        return listing.version

    def _mark_listed(self, collection: Collection) -> None:
        with self._lock:
            self._listed.add(collection.what)
            done = len(self._listed) == len(self.collections)
        if done and self._loop is not None and not self._ready.is_set():
            self._loop.call_soon_threadsafe(self._ready.set)

    def _watch(self, collection: Collection, version: str) -> str:
        """Follow one watch until the API server ends it; the version to go on from."""
        events = self.kube.watch(
            collection.path,
            version,
            self.WATCH_TIMEOUT_S,
            collection.selectors,
            collection.decoding,
        )
        for event in events:
            kind, body = event.get("type"), event.get("object") or {}
            if kind != "BOOKMARK":
                collection.sink.apply(str(kind), body)
            version = str((body.get("metadata") or {}).get("resourceVersion") or version)
            if self._stop.is_set():
                break
        return version


class _Listing:
    """A collection's list as one stream of items, asked for page by page while a sink reads
    it: each page is summarised before the next is fetched, so a list of thousands of large
    objects is never held whole (a restart at 1,000 deployments lists 6,000 pods of 18 KB,
    and holding them all took the operator's RSS to 1 GiB). A failing page ends the stream
    with its error, before the sink replaced anything."""

    def __init__(self, kube: KubeApi, collection: Collection, page_size: int) -> None:
        self._kube = kube
        self._collection = collection
        self._page_size = page_size
        self.version = ""  # the list's resourceVersion
        self.count = 0
        self.complete = False  # read to its last page

    def __iter__(self) -> Iterator[dict[str, Any]]:
        path, selectors = self._collection.path, self._collection.selectors
        token = ""
        while True:
            page = self._kube.list_page(
                path, self._page_size, token, selectors, self._collection.decoding
            )
            meta = page.get("metadata") or {}
            self.version = str(meta.get("resourceVersion") or self.version)
            token = str(meta.get("continue") or "")
            items = _typed_items(page)
            del page
            self.count += len(items)
            yield from items
            if not token:
                self.complete = True
                return


def _typed_items(page: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A list's items, each with the apiVersion and kind that a list leaves out (its own
    `kind` is the item's plus "List") and a watch event's object carries."""
    api_version = page.get("apiVersion", "")
    kind = str(page.get("kind", "")).removesuffix("List")
    items = [item for item in page.get("items") or [] if isinstance(item, dict)]
    for item in items:
        item.setdefault("apiVersion", api_version)
        item.setdefault("kind", kind)
    return items
