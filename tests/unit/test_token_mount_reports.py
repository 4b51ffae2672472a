"""How the operator learns, without reading Secrets, that a sidecar token Secret is gone: the
pods' FailedMount Events, as a kubelet writes them (parsed in status/token.py, kept per
Secret and pod in informers/mount_events.py), and what Degraded says meanwhile."""

from __future__ import annotations

from typing import Any

from pdd_operator.informers.mount_events import MountFailures
from pdd_operator.status.observe import PodSummary
from pdd_operator.status.token import MountFailure, missing_secret, token_mount_problems

TOKEN = "llama-sidecar-token-1a2b3c4d"


def failed_mount(pod: str, when: str, secret: str = TOKEN, **extra: Any) -> dict[str, Any]:
    """A core/v1 Event as the kubelet posts it when a Secret volume cannot be set up."""
    return {
        "metadata": {"name": f"{pod}.1", "namespace": "team-a", "uid": f"ev-{pod}-{when}"},
        "involvedObject": {"kind": "Pod", "namespace": "team-a", "name": pod, "uid": "p"},
        "reason": "FailedMount",
        "type": "Warning",
        "message": f'MountVolume.SetUp failed for volume "sidecar-token" : secret "{secret}" '
        "not found",
        "lastTimestamp": when,
        "count": 1,
        **extra,
    }


def test_a_failed_mount_of_a_missing_secret_names_the_secret_and_the_pod() -> None:
    found = missing_secret(failed_mount("llama-prefill-0", "2026-12-05T10:00:00Z"))
    assert found is not None
    (where, report) = found
    assert where == ("team-a", TOKEN)
    assert (report.pod, report.when) == ("llama-prefill-0", "2026-12-05T10:00:00Z")


def test_other_events_are_not_reports_of_a_missing_secret() -> None:
    configmap = failed_mount("p", "t")
    configmap["message"] = 'MountVolume.SetUp failed for volume "cfg" : configmap "c" not found'
    other = [
        {**failed_mount("p", "t"), "reason": "FailedScheduling"},
        {**failed_mount("p", "t"), "involvedObject": {"kind": "StatefulSet", "name": "p"}},
        configmap,
    ]
    assert [missing_secret(e) for e in other] == [None, None, None]


def test_each_new_report_asks_for_a_pass_once() -> None:
    told: list[tuple[str, str]] = []
    store = MountFailures(lambda ns, secret: told.append((ns, secret)))
    store.reset([])
    first = failed_mount("llama-prefill-0", "2026-12-05T10:00:00Z")
    store.apply("ADDED", first)
    store.apply("MODIFIED", first)  # the same report again (a resync): no new pass
    store.apply("MODIFIED", {**first, "count": 2, "lastTimestamp": "2026-12-05T10:00:09Z"})
    store.apply("DELETED", first)  # an Event's expiry says nothing about the Secret
    assert told == [("team-a", TOKEN), ("team-a", TOKEN)]
    assert [r.when for r in store.of("team-a", TOKEN)] == ["2026-12-05T10:00:09Z"]


def test_each_pods_newest_report_is_kept_newest_first() -> None:
    store = MountFailures()
    store.reset(
        [
            failed_mount("llama-prefill-0", "2026-12-05T10:00:00Z"),
            failed_mount("llama-decode-0", "2026-12-05T10:00:05Z"),
            failed_mount("llama-prefill-0", "2026-12-05T09:00:00Z"),
        ]
    )
    reports = store.of("team-a", TOKEN)
    assert [(r.pod, r.when) for r in reports] == [
        ("llama-decode-0", "2026-12-05T10:00:05Z"),
        ("llama-prefill-0", "2026-12-05T10:00:00Z"),
    ]


def pod(name: str, ready: bool = False) -> PodSummary:
    return PodSummary(name, f"uid-{name}", "prefill", "node-a", ready, "", None)


def test_degraded_names_the_pods_still_waiting_on_a_fresh_report() -> None:
    reports = [
        MountFailure("llama-prefill-0", "2026-12-05T10:00:00Z", "m", "a"),
        MountFailure("llama-prefill-1", "2026-12-05T10:00:00Z", "m", "b"),
        MountFailure("llama-prefill-2", "2026-12-05T09:00:00Z", "m", "c"),  # long ago
    ]
    pods = [pod("llama-prefill-0"), pod("llama-prefill-1", ready=True), pod("llama-prefill-2")]
    problems = token_mount_problems(pods, reports, TOKEN, "2026-12-05T10:00:30Z")
    assert [(p.pod, p.reason) for p in problems] == [("llama-prefill-0", "TokenSecretMissing")]
    assert f"cannot mount the sidecar token Secret {TOKEN}" in problems[0].message
