"""The images, built and run (issue 40): `hack/images.sh` builds every Dockerfile target
(cached by what goes into each), each image's programs run as the chart runs its containers
(user 65532, read-only root file system, no capabilities), and the operator runs from its own
image against the local control plane, with the chart's args and security settings and only
the rights of the chart's ServiceAccount (manifests/ applied, `kubectl apply -k manifests/`),
until a PDDeployment is Ready and a request through its router returns tokens.

The engine and router pods are run by the local cluster's pod runtime, once per engine (vLLM
behind vllm-router, SGLang behind smg): the preflight, sidecar and router containers from the
built images' own root filesystems (their ENV, ENTRYPOINT and files, as the user the rendered
securityContext names, on a read-only root where it asks for one), the engine as the
reference engine (the test double of a GPU image, a process of this machine's venv).
"""

from __future__ import annotations

import copy
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.dynamic import DynamicClient

from chart.support import apply, manifest_documents, wait_crd_established
from helpers.operator_image import (
    ROOT,
    OperatorContainer,
    build_images,
    engine,
    engine_env,
    mounted_token,
    operator_container,
    run_image,
)
from helpers.running_pods import OwnNodes, ready_router_url, refengine_pdd, running_nodes
from helpers.traffic import complete
from helpers.waits import wait_for
from pdd_localcluster import LocalControlPlane
from pdd_localcluster.runtime import PodRuntime
from pdd_localcluster.runtime.images import built_images, repository

GROUP, VERSION, PLURAL = "pdd.dev", "v1alpha1", "pddeployments"
NODES = OwnNodes("pdd.test/operator-image", ("oi-0",))
OPERATOR_NS, OPERATOR_SA = "pdd-system", "pdd-operator"
# Cluster-wide objects of manifests/ that change what other users may do: removed afterwards,
# so that the modules after this one run without them, as before it.
ADMISSION_KINDS = ("ValidatingAdmissionPolicyBinding", "ValidatingAdmissionPolicy")
READY_S = 240.0
PULL_SECRET = "regcred"


@pytest.fixture(scope="module")
def image_table() -> str:
    table = build_images()
    print(f"\n{table}")
    return table


@pytest.fixture(scope="module")
def images(image_table: str) -> dict[str, str]:
    """Target -> the image tag the table lists (and the chart names)."""
    rows = [line.split()[0] for line in image_table.splitlines()[1:] if line.strip()]
    return {row.rsplit("/", 1)[1].split(":")[0].removeprefix("pdd-"): row for row in rows}


@pytest.fixture(scope="module")
def installed(api_client: client.ApiClient) -> Iterator[list[dict[str, Any]]]:
    """manifests/ applied as `kubectl apply -k manifests/` would, the operator's Deployment
    and the agent's DaemonSet left out (this test runs the operator's container itself, and
    the agent is not what it is about)."""
    dynamic = DynamicClient(api_client)
    docs = [d for d in manifest_documents() if d["kind"] not in ("Deployment", "DaemonSet")]
    for doc in docs:
        apply(dynamic, doc)
        if doc["kind"] == "CustomResourceDefinition":
            wait_crd_established(api_client, doc["metadata"]["name"])
    yield [d for d in manifest_documents() if d["kind"] == "Deployment"]
    for kind in ADMISSION_KINDS:
        for doc in docs:
            if doc["kind"] == kind:
                resource = dynamic.resources.get(api_version=doc["apiVersion"], kind=kind)
                dynamic.delete(resource, name=doc["metadata"]["name"])


@pytest.fixture(scope="module")
def operator_from_image(
    images: dict[str, str],
    installed: list[dict[str, Any]],
    control_plane: LocalControlPlane,
    api_client: client.ApiClient,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorContainer]:
    [deployment] = copy.deepcopy(installed)
    # What the chart renders for `--set imagePullSecrets[0].name=regcred` (tests/chart's
    # test_chart_lint checks that rendering): every pod the operator renders names it.
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    container["args"].append(f"--image-pull-secret={PULL_SECRET}")
    token = mounted_token(
        api_client, control_plane, OPERATOR_NS, OPERATOR_SA, tmp_path_factory.mktemp("sa")
    )
    with operator_container(deployment, token, control_plane) as container:
        assert container.image == images["operator"]
        yield container


@pytest.fixture(scope="module")
def runtime(
    control_plane: LocalControlPlane,
    images: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[PodRuntime]:
    """The nodes' pod runtime, with the sidecar and router images run from their own files."""
    ours = [images["sidecar"], images["router"]]
    table = built_images(ours, engine(), engine_env())
    state = tmp_path_factory.mktemp("oi")
    with running_nodes(control_plane, state, NODES, "127.86", images=table) as rt:
        yield rt


def test_each_image_runs_its_programs_as_the_chart_runs_them(images: dict[str, str]) -> None:
    assert sorted(images) == ["operator", "router", "sidecar"]
    assert "usage" in run_image(images["operator"], ["--help"]).lower()
    for program in ("pdd-sidecar", "pdd-node"):
        assert "usage" in run_image(images["sidecar"], ["--help"], entrypoint=program).lower()
    nixl = "import nixl._api, importlib.metadata as m; print(m.version('nixl'))"
    assert run_image(images["sidecar"], ["-c", nixl], entrypoint="python").strip()
    for router in ("vllm-router", "smg"):
        assert "usage" in run_image(images["router"], ["--help"], entrypoint=router).lower()


TEST_INFRASTRUCTURE = ("pdd_localcluster", "pdd_refengine")


def test_neither_the_wheel_nor_an_image_holds_test_infrastructure(
    images: dict[str, str], tmp_path: Path
) -> None:
    """The local cluster and the reference engine run from the source tree only: the default
    wheel (`pip wheel .`, what the Dockerfile installs) and the images lack them."""
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-2000:]
    [wheel] = tmp_path.glob("pdd_operator-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        packages = {name.split("/", 1)[0] for name in archive.namelist()}
    assert {
        "pdd_operator",
        "pdd_sidecar",
        "pdd_node",
        "pdd_probe",
        "pdd_contract",
        "pdd_kubeconfig",
    } <= packages
    assert not packages & set(TEST_INFRASTRUCTURE), packages
    probe = (
        f"import importlib.util as u; print([m for m in {TEST_INFRASTRUCTURE} if u.find_spec(m)])"
    )
    for target in ("operator", "sidecar"):
        shown = run_image(images[target], ["-c", probe], entrypoint="python")
        assert shown.strip() == "[]", (target, shown)


@pytest.mark.parametrize("engine_type", ["vllm", "sglang"])
def test_the_operator_from_its_image_reconciles_until_a_request_is_served(
    engine_type: str,
    operator_from_image: OperatorContainer,
    api_client: client.ApiClient,
    runtime: PodRuntime,
    images: dict[str, str],
    namespace: str,
) -> None:
    name = f"from-image-{engine_type}"
    body = refengine_pdd(name, engine_type, NODES, replicas=1)
    objects = client.CustomObjectsApi(api_client)
    objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

    def ready() -> bool:
        obj = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        conditions = {c["type"]: c["status"] for c in obj.get("status", {}).get("conditions", [])}
        return conditions.get("Ready") == "True"

    try:
        wait_for(ready, READY_S, what=f"{namespace}/{name} Ready")
        transfer = wait_for(
            lambda: kv_transfer_condition(objects, namespace, name), 120, what="KVTransferVerified"
        )
    except AssertionError as err:
        pytest.fail(f"{err}\noperator container log:\n{operator_from_image.logs}")
    url = ready_router_url(client.CoreV1Api(api_client), namespace, name)
    answer = complete(url, "tiny", "hello " * 20, timeout=20.0)
    assert answer.ok, answer.error
    assert answer.served.get("kv_verified") and answer.kv_bytes > 0, answer
    assert "Traceback" not in operator_from_image.logs
    print(f"\noperator image {operator_from_image.image}: {namespace}/{name} Ready and served")
    print(f"KVTransferVerified: {transfer}")
    # The preflight, unprivileged, may not make the peer's namespaces: it emulates the
    # boundary (pdd_probe.boundary) rather than fail the check.
    assert "ProbeFailed" not in transfer and "boundary emulated" in transfer, transfer
    # The private registry's pull Secret reached every pod the operator rendered.
    pods = (
        client.CoreV1Api(api_client)
        .list_namespaced_pod(namespace, label_selector=f"pdd.dev/deployment={name}")
        .items
    )
    roles = {(p.metadata.labels or {}).get("pdd.dev/role") for p in pods}
    assert {"prefill", "decode", "router"} <= roles, roles
    for pod in pods:
        secrets = [ref.name for ref in pod.spec.image_pull_secrets or []]
        assert PULL_SECRET in secrets, (pod.metadata.name, secrets)
    ran = images_that_ran(runtime, pods, images)
    print("\n".join(f"  {line}" for line in ran))
    assert len(ran) == 5, ran  # the router, and each engine pod's preflight and sidecar


def kv_transfer_condition(objects: client.CustomObjectsApi, namespace: str, name: str) -> str:
    obj = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    for c in obj.get("status", {}).get("conditions", []):
        if c["type"] == "KVTransferVerified":
            return f"{c['status']} {c.get('reason')}: {c.get('message')}"
    return ""


def images_that_ran(
    runtime: PodRuntime, pods: list[client.V1Pod], images: dict[str, str]
) -> list[str]:
    """Each container of our images in `pods`, as it ran: started on the image's own root
    filesystem, as the user its securityContext names, read-only where that asks for it. For
    a container still running this is read from its process: its root holds the image's
    /opt/venv (this machine has none), /proc says its uid, its mount table that `/` is
    read-only; an init container that has ended is shown by what it was started with."""
    ours = {repository(images[t]) for t in ("sidecar", "router")}
    ran = []
    for pod in pods:
        uid = pod.metadata.uid
        for container in [*(pod.spec.init_containers or []), *pod.spec.containers]:
            if repository(container.image) not in ours:
                continue
            started = runtime.started_with(uid, container.name)
            assert started is not None, (pod.metadata.name, container.name)
            context = container.security_context
            assert Path(started["lower_dir"], "opt/venv/pyvenv.cfg").is_file(), started
            assert started["user"][0] == context.run_as_user == 65532, started["user"]
            assert started["read_only_root"] == bool(context.read_only_root_filesystem)
            seen = "started"
            if pid := runtime.pid(uid, container.name):
                assert Path(f"/proc/{pid}/root/opt/venv/pyvenv.cfg").is_file()
                assert process_uid(pid) == 65532
                assert root_read_only(pid) == bool(context.read_only_root_filesystem)
                seen = "running"
            root = "read-only" if started["read_only_root"] else "writable"
            ran.append(
                f"{pod.metadata.name}/{container.name} ({seen}): {container.image} "
                f"as uid {started['user'][0]}, root {root}"
            )
    return ran


def process_uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for {pid}")


def root_read_only(pid: int) -> bool:
    """Whether `/` is mounted read-only as the process sees it (its mountinfo)."""
    roots = [
        line.split()[5]
        for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
        if line.split()[4] == "/"
    ]
    assert roots, f"no / in the mount table of {pid}"
    return "ro" in roots[-1].split(",")  # the last mount on / is the one seen
