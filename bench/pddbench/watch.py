"""Client-side watches with receive timestamps: when each child appeared, when each
StatefulSet became fully ready, when each PDDeployment reported Ready."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from pdd_localcluster.kubejson import KubeJson, watch_events
from pdd_operator.api.names import ANNOTATION_APPLIED_HASH

log = logging.getLogger(__name__)
Json = dict[str, Any]

STS = "/apis/apps/v1/namespaces/{ns}/statefulsets"
PDB = "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets"
PDD = "/apis/pdd.dev/v1alpha1/namespaces/{ns}/pddeployments"


@dataclass
class ObjState:
    first_seen: float = 0.0
    ready: bool = False
    ready_since: float = 0.0  # when it last became ready
    first_ready: float = 0.0
    events: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def sts_ready(obj: Json) -> bool:
    spec, st, meta = obj.get("spec", {}), obj.get("status", {}), obj.get("metadata", {})
    want = int(spec.get("replicas", 1))
    return (
        int(st.get("observedGeneration", 0)) >= int(meta.get("generation", 0))
        and int(st.get("readyReplicas", 0)) == want
        and int(st.get("updatedReplicas", 0)) == want
        and int(st.get("replicas", 0)) == want
        and st.get("currentRevision", "") == st.get("updateRevision", "")
    )


def sts_domain(obj: Json) -> str:
    """The node-affinity domain (label=value) the pod template asks for, "" when none."""
    spec = obj.get("spec", {}).get("template", {}).get("spec", {})
    na = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    terms = [
        p.get("preference", {})
        for p in na.get("preferredDuringSchedulingIgnoredDuringExecution") or []
    ]
    terms += (na.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get(
        "nodeSelectorTerms"
    ) or []
    for term in terms:
        for expr in term.get("matchExpressions") or []:
            if expr.get("key") in ("nvidia.com/gpu.clique", "topology.kubernetes.io/rack"):
                return f"{expr['key']}={','.join(expr.get('values') or [])}"
    return ""


def status_diff(old: Json, new: Json) -> list[str]:
    """Paths of the status fields that differ; conditions by type (`conditions.Ready.reason`)."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if key == "conditions":
            ca = {c.get("type"): c for c in a or []}
            cb = {c.get("type"): c for c in b or []}
            for t in sorted(set(ca) | set(cb), key=str):
                x, y = ca.get(t) or {}, cb.get(t) or {}
                out += [
                    f"conditions.{t}.{f}" for f in sorted(set(x) | set(y)) if x.get(f) != y.get(f)
                ]
        elif isinstance(a, dict) and isinstance(b, dict):
            out += [f"{key}.{f}" for f in sorted(set(a) | set(b)) if a.get(f) != b.get(f)]
        else:
            out.append(key)
    return out


def pdd_ready(obj: Json) -> bool:
    st = obj.get("status") or {}
    if st.get("observedGeneration") != obj.get("metadata", {}).get("generation"):
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or []
    )


class Watcher:
    """One thread per watched collection; state keyed by object name; times in
    time.monotonic()."""

    def __init__(self, kubeconfig: str, namespace: str, pdds: bool) -> None:
        self.kube = KubeJson(kubeconfig, pool_size=6)
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.sts: dict[str, ObjState] = {}
        self.pdb: dict[str, ObjState] = {}
        self.pdd: dict[str, ObjState] = {}
        self.sts_template_changes = 0
        self.sts_domain_changes = 0  # the template's node-affinity domain moved
        self.sts_partition_changes = 0
        # While set: which status fields change between successive PDDeployment versions.
        self.record_status_churn = False
        self.status_churn: dict[str, int] = {}
        self.errors = 0
        self._synced: dict[str, threading.Event] = {}
        self._threads: list[threading.Thread] = []
        self._responses: dict[str, Any] = {}
        targets = [("sts", STS, self._on_sts), ("pdb", PDB, self._on_pdb)]
        if pdds:
            targets.append(("pdd", PDD, self._on_pdd))
        for name, path, handler in targets:
            self._synced[name] = threading.Event()
            self._threads.append(
                threading.Thread(
                    target=self._loop,
                    args=(name, path.format(ns=namespace), handler),
                    name=f"watch-{name}",
                    daemon=True,
                )
            )

    def start(self) -> Watcher:
        for t in self._threads:
            t.start()
        for name, ev in self._synced.items():
            if not ev.wait(30):
                raise TimeoutError(f"watch {name} did not sync")
        return self

    def stop(self) -> None:
        self.stop_event.set()
        for resp in list(self._responses.values()):
            with contextlib.suppress(Exception):
                resp.shutdown()
        for t in self._threads:
            t.join(5)
        self.kube.close()

    def _loop(self, name: str, path: str, handler: Any) -> None:
        while not self.stop_event.is_set():
            try:
                items, rv = self.kube.list_all(path, {})
                now = time.monotonic()
                for obj in items:
                    handler(obj, now)
                self._synced[name].set()
                while not self.stop_event.is_set():
                    resp = self.kube.open_watch(
                        path, {"resourceVersion": rv, "timeoutSeconds": 300}, 330
                    )
                    self._responses[name] = resp
                    try:
                        for event in watch_events(resp):
                            now = time.monotonic()
                            obj = event.get("object") or {}
                            if event.get("type") == "ERROR":
                                raise RuntimeError(obj.get("message", "watch error"))
                            rv = obj.get("metadata", {}).get("resourceVersion", rv)
                            if event.get("type") in ("ADDED", "MODIFIED"):
                                handler(obj, now)
                    finally:
                        resp.release_conn()
            except Exception as err:
                if self.stop_event.is_set():
                    return
                self.errors += 1
                log.warning("watch %s: %s; re-listing", name, err)
                time.sleep(0.5)

    def _state(self, table: dict[str, ObjState], name: str, now: float) -> ObjState:
        st = table.get(name)
        if st is None:
            st = table[name] = ObjState(first_seen=now)
        st.events += 1
        return st

    def _set_ready(self, st: ObjState, ready: bool, now: float) -> None:
        if ready and not st.ready:
            st.ready_since = now
            if not st.first_ready:
                st.first_ready = now
        st.ready = ready

    def _on_sts(self, obj: Json, now: float) -> None:
        name = obj["metadata"]["name"]
        with self.lock:
            st = self._state(self.sts, name, now)
            gen = int(obj["metadata"].get("generation", 1))
            if gen > st.extra.get("generation", gen):
                self.sts_template_changes += 1
            st.extra["generation"] = gen
            domain = sts_domain(obj)
            if "domain" in st.extra and domain != st.extra["domain"]:
                self.sts_domain_changes += 1
            st.extra["domain"] = domain
            rolling = (obj.get("spec", {}).get("updateStrategy") or {}).get("rollingUpdate") or {}
            partition = rolling.get("partition", 0)
            if "partition" in st.extra and partition != st.extra["partition"]:
                self.sts_partition_changes += 1
            st.extra["partition"] = partition
            st.extra["hash"] = (obj["metadata"].get("annotations") or {}).get(
                ANNOTATION_APPLIED_HASH, ""
            )
            self._set_ready(st, sts_ready(obj), now)

    def _on_pdb(self, obj: Json, now: float) -> None:
        with self.lock:
            self._state(self.pdb, obj["metadata"]["name"], now)

    def _on_pdd(self, obj: Json, now: float) -> None:
        with self.lock:
            st = self._state(self.pdd, obj["metadata"]["name"], now)
            status = obj.get("status") or {}
            if self.record_status_churn and "status" in st.extra:
                for path in status_diff(st.extra["status"], status):
                    self.status_churn[path] = self.status_churn.get(path, 0) + 1
            st.extra["status"] = status
            st.extra["placement"] = (obj.get("status") or {}).get("placement") or {}
            self._set_ready(st, pdd_ready(obj), now)

    # ------------------------------------------------------------------ per deployment

    def deployment_times(
        self, instance: str, pdb_roles: tuple[str, ...] = ("prefill", "decode")
    ) -> dict[str, float | None]:
        """children: both StatefulSets and both PDBs exist; ready: both StatefulSets fully
        ready now (the time of the later one's last transition); pdd_ready: its condition."""
        with self.lock:
            sts = [self.sts.get(f"{instance}-{r}") for r in ("prefill", "decode")]
            pdb = [self.pdb.get(f"{instance}-{r}") for r in pdb_roles]
            created = None
            if all(sts) and all(pdb):
                created = max(s.first_seen for s in [*sts, *pdb] if s)
            ready = None
            if all(s and s.ready for s in sts):
                ready = max(s.ready_since for s in sts if s)
            pdd = self.pdd.get(instance)
            pdd_ready_t = pdd.ready_since if pdd and pdd.ready else None
            return {"children": created, "ready": ready, "pdd_ready": pdd_ready_t}
