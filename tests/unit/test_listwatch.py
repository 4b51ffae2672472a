"""How an informer lists a collection (informers/listwatch.py): page by page, each page read by
the sink before the next is asked for, and a failed page leaving the sink as it was. The API
server is a stand-in answering pages here; tests/integration/test_fleet_watch.py lists from a
real one."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, cast

import pytest

from pdd_operator.informers.fleet import FleetState
from pdd_operator.informers.listwatch import Collection, Watches
from pdd_operator.kube.client import KubeApi
from pdd_operator.kube.decoding import WHOLE, Decoding

NODES = [f"n{i}" for i in range(5)]


class PagedList:
    """Answers list_page from NODES, `size` per page; `fail_at` raises on that page."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.pages_asked = 0
        self.fail_at = fail_at

    def list_page(
        self,
        path: str,
        limit: int,
        token: str = "",
        selectors: Iterable[Any] = (),
        decoding: Decoding = WHOLE,
    ) -> dict[str, Any]:
        self.pages_asked += 1
        if self.pages_asked == self.fail_at:
            raise ConnectionError("the API server went away mid-list")
        start = int(token or 0)
        names = NODES[start : start + limit]
        more = start + limit < len(NODES)
        return {
            "apiVersion": "v1",
            "kind": "NodeList",
            "metadata": {"resourceVersion": "42", "continue": str(start + limit) if more else ""},
            "items": [{"metadata": {"name": n}, "status": {}} for n in names],
        }


class SeenWhen:
    """A sink that notes how many pages had been asked for when it read each item."""

    def __init__(self, api: PagedList) -> None:
        self.api = api
        self.seen: list[tuple[str, int]] = []

    def reset(self, bodies: Iterable[Mapping[str, Any]]) -> None:
        self.seen = [(b["metadata"]["name"], self.api.pages_asked) for b in bodies]

    def apply(self, event_type: str, body: Mapping[str, Any]) -> None:
        raise AssertionError("not watched here")

    def __len__(self) -> int:
        return len(self.seen)


def watches(api: PagedList) -> Watches:
    result = Watches(cast(KubeApi, api))
    result.PAGE = 2
    return result


def test_each_page_is_read_before_the_next_is_asked_for() -> None:
    api = PagedList()
    sink = SeenWhen(api)
    version = watches(api)._relist(Collection("nodes", "/api/v1/nodes", (), sink))
    assert version == "42"
    assert sink.seen == [("n0", 1), ("n1", 1), ("n2", 2), ("n3", 2), ("n4", 3)]


def test_a_page_that_fails_leaves_the_store_as_it_was() -> None:
    state = FleetState()
    state.nodes.apply("ADDED", {"metadata": {"name": "before"}, "status": {}})
    api = PagedList(fail_at=2)
    with pytest.raises(ConnectionError):
        watches(api)._relist(Collection("nodes", "/api/v1/nodes", (), state.nodes))
    assert [n["metadata"]["name"] for n in state.nodes.values()] == ["before"]
    watches(PagedList())._relist(Collection("nodes", "/api/v1/nodes", (), state.nodes))
    assert [n["metadata"]["name"] for n in state.nodes.values()] == NODES


class StopsEarly(SeenWhen):
    def reset(self, bodies: Iterable[Mapping[str, Any]]) -> None:
        self.seen = [(b["metadata"]["name"], 0) for _, b in zip(range(3), bodies, strict=False)]


def test_a_store_that_stops_reading_the_list_part_way_is_an_error_not_a_silent_gap() -> None:
    api = PagedList()
    with pytest.raises(RuntimeError, match="stopped reading"):
        watches(api)._relist(Collection("nodes", "/api/v1/nodes", (), StopsEarly(api)))
