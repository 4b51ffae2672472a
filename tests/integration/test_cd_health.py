"""Health as the CD tools compute it, with their own code, of what the real operator writes.

`hack/health` (built here from the Go module proxy) runs kstatus (sigs.k8s.io/cli-utils: what
Flux's health checks use) and docs/gitops.md's Argo CD health script through gopher-lua (as
Argo CD runs it), and the real kubectl answers `kubectl wait --for=condition=Ready`. They are
fed the PDDeployments the API server returns at each stage. The table they produce is the one
docs/gitops.md shows, so the docs cannot drift from what the tools do.

The first test runs before this module's operator starts: the object nobody has seen.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch

from helpers.factories import small_pdd_body
from helpers.health_tool import health_tool as build_health_tool
from helpers.operator_proc import OperatorProcess, install_crd
from helpers.waits import wait_for
from pdd_contract.labels import LABEL_ROLE
from pdd_localcluster import LocalControlPlane
from pdd_localcluster.controlplane import resolve_bin_dir
from pdd_localcluster.nodesim import NodeSimulator

ROOT = Path(__file__).resolve().parents[2]
GITOPS = ROOT / "docs" / "gitops.md"
GROUP, VERSION, PLURAL = "pdd.dev", "v1alpha1", "pddeployments"
# A finalizer of the user's (a backup tool's, say) that keeps a deleted object visible.
HOLD = "example.com/hold"
TABLE_START, TABLE_END = "<!-- cd-health-table: start -->", "<!-- cd-health-table: end -->"
ROWS: dict[str, dict[str, str]] = {}


@pytest.fixture(scope="module")
def health_tool() -> Path:
    """hack/health built once per source (`make test` builds it before pytest starts)."""
    return build_health_tool()


@pytest.fixture(scope="module")
def argo_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The health check docs/gitops.md tells Argo CD users to install, as they copy it."""
    text = GITOPS.read_text()
    block = text.split("resource.customizations.health.pdd.dev_PDDeployment: |\n", 1)[1]
    lines = []
    for line in block.splitlines():
        if line.startswith("```"):
            break
        lines.append(line[4:])  # the YAML block scalar's indentation
    path = tmp_path_factory.mktemp("argo") / "health.lua"
    path.write_text("\n".join(lines) + "\n")
    return path


def judge(tool: Path, script: Path, obj: dict[str, Any]) -> dict[str, str]:
    out = subprocess.run(
        [str(tool), str(script)], input=json.dumps(obj) + "\n",
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    verdict: dict[str, str] = json.loads(out)
    return verdict


def kubectl_wait_ready(plane: LocalControlPlane, namespace: str, name: str) -> str:
    kubectl = resolve_bin_dir() / "kubectl"
    result = subprocess.run(
        [str(kubectl), "--kubeconfig", str(plane.kubeconfig), "-n", namespace, "wait",
         "--for=condition=Ready", "--timeout=2s", f"pdd/{name}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return "returns" if result.returncode == 0 else "keeps waiting"


def record(stage: str, verdict: dict[str, str], wait: str) -> None:
    ROWS[stage] = {"kstatus": verdict["kstatus"], "argo": verdict["argo"], "wait": wait}


def get(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name
    )
    return obj


def create(api: client.ApiClient, body: dict[str, Any]) -> None:
    ns = body["metadata"]["namespace"]
    client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)


def test_before_any_operator_has_seen_it_a_pdddeployment_is_in_progress(
    control_plane: LocalControlPlane,
    api_client: client.ApiClient,
    namespace: str,
    health_tool: Path,
    argo_script: Path,
) -> None:
    install_crd(api_client)
    create(api_client, small_pdd_body("unseen", namespace))
    obj = get(api_client, namespace, "unseen")
    verdict = judge(health_tool, argo_script, obj)
    # Without the CRD's status default kstatus says Current: Flux's `wait: true` would call
    # the release healthy with the operator down.
    assert verdict["kstatus"] == "InProgress", verdict
    assert verdict["argo"] == "Progressing", verdict
    wait = kubectl_wait_ready(control_plane, namespace, "unseen")
    assert wait == "keeps waiting"
    record("created, no operator has seen it", verdict, wait)


def test_ready_a_new_generation_and_a_refused_spec_as_the_tools_see_them(
    operator: OperatorProcess,
    control_plane: LocalControlPlane,
    api_client: client.ApiClient,
    namespace: str,
    health_tool: Path,
    argo_script: Path,
) -> None:
    create(api_client, small_pdd_body("serving", namespace))

    def ready() -> dict[str, Any] | None:
        obj = get(api_client, namespace, "serving")
        conditions = {c["type"]: c["status"] for c in obj.get("status", {}).get("conditions", [])}
        current = obj.get("status", {}).get("observedGeneration") == obj["metadata"]["generation"]
        return obj if current and conditions.get("Ready") == "True" else None

    obj = wait_for(ready, 120, what="Ready")
    verdict = judge(health_tool, argo_script, obj)
    assert (verdict["kstatus"], verdict["argo"]) == ("Current", "Healthy"), verdict
    wait = kubectl_wait_ready(control_plane, namespace, "serving")
    assert wait == "returns"
    record("Ready", verdict, wait)

    # What the API server returns right after a spec change, before the operator's next
    # status write: the same status, one generation behind.
    changed = {
        **obj,
        "metadata": {**obj["metadata"], "generation": obj["metadata"]["generation"] + 1},
    }
    verdict = judge(health_tool, argo_script, changed)
    assert (verdict["kstatus"], verdict["argo"]) == ("InProgress", "Progressing"), verdict
    record("spec changed, not yet observed", verdict, "(as before the change)")

    # The change for real: a new pod template, so the StatefulSets roll. The first status the
    # operator writes for the new generation, while pods of the old revision still serve.
    objects = client.CustomObjectsApi(api_client)
    template = {"metadata": {"annotations": {"example.com/restarted": "1"}}}
    patched = objects.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        "serving",
        {"spec": {"decode": {"podTemplate": template}}},
    )
    rolling = first_status_of_generation(api_client, namespace, patched)
    verdict = judge(health_tool, argo_script, rolling)
    assert verdict["kstatus"] == "InProgress", verdict
    # kubectl wait reads only the Ready condition: taken from the captured object, since a
    # later `kubectl wait` would see a later state (one decode here: it is being replaced).
    ready = {c["type"]: c["status"] for c in rolling["status"]["conditions"]}.get("Ready")
    record("new revision rolling out", verdict, "returns" if ready == "True" else "keeps waiting")

    # A spec the API server admits but the operator refuses: a podTemplate that sets a label
    # the operator selects on.
    template = {"metadata": {"labels": {LABEL_ROLE: "mine"}}}
    create(api_client, small_pdd_body("refused", namespace, decode={"podTemplate": template}))

    def stalled() -> dict[str, Any] | None:
        obj = get(api_client, namespace, "refused")
        conditions = {c["type"]: c["status"] for c in obj.get("status", {}).get("conditions", [])}
        return obj if conditions.get("Stalled") == "True" else None

    obj = wait_for(stalled, 60, what="Stalled")
    verdict = judge(health_tool, argo_script, obj)
    assert (verdict["kstatus"], verdict["argo"]) == ("Failed", "Degraded"), verdict
    wait = kubectl_wait_ready(control_plane, namespace, "refused")
    assert wait == "keeps waiting"
    record("refused spec (Stalled=True)", verdict, wait)


def conditions_of(obj: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in obj.get("status", {}).get("conditions", [])}


def observed(obj: dict[str, Any]) -> bool:
    return bool(obj.get("status", {}).get("observedGeneration") == obj["metadata"]["generation"])


def test_rolling_out_scaled_to_zero_degraded_and_deleting_as_the_tools_see_them(
    operator: OperatorProcess,
    control_plane: LocalControlPlane,
    api_client: client.ApiClient,
    node_sim: NodeSimulator,
    namespace: str,
    health_tool: Path,
    argo_script: Path,
) -> None:
    """Every status the operator writes between creation and Ready, as a watch sees them;
    then an autoscaled deployment at zero, a preflight failure, and a deletion."""
    objects = client.CustomObjectsApi(api_client)
    stream = watch.Watch()
    events = stream.stream(
        objects.list_namespaced_custom_object,
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        timeout_seconds=120,
    )
    autoscaling = {
        "decode": {"minReplicas": 0, "maxReplicas": 2},
        "prefill": {"minReplicas": 1, "maxReplicas": 2},
        "follower": "prefill",
        "ratio": {"prefill": 1, "decode": 1},
    }
    create(api_client, small_pdd_body("rolling", namespace, autoscaling=autoscaling))
    rolling_out = None
    for event in events:
        obj = event["object"]
        if obj["metadata"]["name"] != "rolling" or not observed(obj):
            continue
        if conditions_of(obj).get("Ready") == "True":
            break
        rolling_out = rolling_out or obj
    stream.stop()
    assert rolling_out is not None, "no status was written between creation and Ready"
    verdict = judge(health_tool, argo_script, rolling_out)
    assert (verdict["kstatus"], verdict["argo"]) == ("InProgress", "Progressing"), verdict
    record("placed, pods starting (Reconciling=True)", verdict, "keeps waiting")

    # Night: the autoscaler sets the decode scale target to 0 (prefill follows to 0).
    objects.patch_namespaced_custom_object_scale(
        GROUP, VERSION, namespace, "pddrolescalers", "rolling-decode", {"spec": {"replicas": 0}}
    )

    def at_zero() -> dict[str, Any] | None:
        obj = get(api_client, namespace, "rolling")
        conditions = conditions_of(obj)
        settled = conditions.get("Reconciling") == "False"  # the last pods are gone
        return obj if conditions.get("ScaledToZero") == "True" and settled else None

    obj = wait_for(at_zero, 90, what="ScaledToZero=True, Reconciling=False")
    verdict = judge(health_tool, argo_script, obj)
    # Zero by the autoscaler's choice is not a fault: no CD tool may page anyone for it.
    assert verdict["kstatus"] == "Current" and verdict["argo"] in ("Healthy", "Suspended"), verdict
    record(
        "scaled to zero by its autoscaler",
        verdict,
        kubectl_wait_ready(control_plane, namespace, "rolling"),
    )

    # The preflight init container fails on every node (a missing prerequisite).
    def preflight(pod: dict[str, Any], node: Any) -> tuple[int, str] | None:
        return 3, f"rdma-ports: no ACTIVE RDMA port on {node.name}; fix the NIC or its driver"

    with node_sim.using_init_outcome(preflight):
        create(api_client, small_pdd_body("failing", namespace))

        def degraded() -> dict[str, Any] | None:
            obj = get(api_client, namespace, "failing")
            return obj if conditions_of(obj).get("Degraded") == "True" else None

        obj = wait_for(degraded, 90, what="Degraded=True")
    verdict = judge(health_tool, argo_script, obj)
    assert verdict["argo"] == "Degraded" and verdict["kstatus"] in ("Failed", "InProgress"), verdict
    wait = kubectl_wait_ready(control_plane, namespace, "failing")
    assert wait == "keeps waiting"
    record("preflight failed (Degraded=True)", verdict, wait)

    # Deleting: what the API server returns while the object still exists with a deletion
    # timestamp (a finalizer of the user's holds it, as a backup tool's would).
    objects.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        "rolling",
        {"metadata": {"finalizers": [HOLD]}},
    )
    objects.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "rolling")
    obj = get(api_client, namespace, "rolling")
    assert obj["metadata"].get("deletionTimestamp"), obj["metadata"]
    verdict = judge(health_tool, argo_script, obj)
    assert verdict["kstatus"] == "Terminating", verdict
    record("deleting", verdict, "(until it is gone)")
    objects.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "rolling", {"metadata": {"finalizers": None}}
    )


# The table's rows in a deployment's life, whatever order the tests ran in.
STAGES = (
    "created, no operator has seen it",
    "placed, pods starting (Reconciling=True)",
    "Ready",
    "spec changed, not yet observed",
    "new revision rolling out",
    "scaled to zero by its autoscaler",
    "refused spec (Stalled=True)",
    "preflight failed (Degraded=True)",
    "deleting",
)


def in_order() -> list[tuple[str, dict[str, str]]]:
    return sorted(ROWS.items(), key=lambda item: STAGES.index(item[0]))


def first_status_of_generation(
    api: client.ApiClient, namespace: str, patched: dict[str, Any]
) -> dict[str, Any]:
    """The object as the operator's first status write for `patched`'s generation left it
    (a watch from the patch's resourceVersion sees every write)."""
    name, generation = patched["metadata"]["name"], patched["metadata"]["generation"]
    stream = watch.Watch()
    events = stream.stream(
        client.CustomObjectsApi(api).list_namespaced_custom_object,
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        resource_version=patched["metadata"]["resourceVersion"],
        timeout_seconds=99,
    )
    try:
        for event in events:
            obj: dict[str, Any] = event["object"]
            status = obj.get("status", {})
            if obj["metadata"]["name"] == name and status.get("observedGeneration") == generation:
                return obj
    finally:
        stream.stop()
    raise AssertionError(f"no status written for generation {generation} of {name}")


def test_the_table_in_docs_gitops_is_what_the_tools_said() -> None:
    if set(ROWS) != set(STAGES):
        pytest.fail(f"the stages before did not all run: {sorted(ROWS)}")
    lines = [
        "| stage | kstatus (Flux) | Argo CD health | `kubectl wait --for=condition=Ready` |",
        "|---|---|---|---|",
        *(f"| {stage} | {r['kstatus']} | {r['argo']} | {r['wait']} |" for stage, r in in_order()),
    ]
    table = "\n".join(lines)
    text = GITOPS.read_text()
    match = re.search(re.escape(TABLE_START) + r"\n(.*?)\n" + re.escape(TABLE_END), text, re.S)
    assert match is not None, f"docs/gitops.md lacks the {TABLE_START} block"
    assert match.group(1) == table, f"docs/gitops.md's table is out of date; it is now:\n{table}"
