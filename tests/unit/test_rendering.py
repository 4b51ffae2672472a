from __future__ import annotations

import json
from typing import Any

import pytest

from helpers.factories import make_pdd
from pdd_operator.api import names
from pdd_operator.api.v1alpha1 import DEFAULT_ROUTER_IMAGE, PDDeployment
from pdd_operator.planning.placement import Placement
from pdd_operator.rendering.children import render_children
from pdd_operator.rendering.context import OperatorSettings, RenderContext
from pdd_operator.rendering.roles import engine_revision, render_affinity


def kinds(objs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(o["kind"], o["metadata"]["name"]) for o in objs]


def find(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


def container(sts: dict[str, Any], name: str) -> dict[str, Any]:
    spec = sts["spec"]["template"]["spec"]
    return next(c for c in spec["containers"] + spec.get("initContainers", []) if c["name"] == name)


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


def test_children_of_a_default_vllm_deployment(pdd: PDDeployment) -> None:
    objs = render_children(pdd, RenderContext())
    assert ("StatefulSet", "llama-prefill") in kinds(objs)
    assert ("StatefulSet", "llama-decode") in kinds(objs)
    assert ("Service", "llama-prefill") in kinds(objs)
    assert ("Deployment", "llama-router") in kinds(objs)
    assert ("NetworkPolicy", "llama-kv-transfer") in kinds(objs)
    for obj in objs:
        ref = obj["metadata"]["ownerReferences"][0]
        assert ref["uid"] == "uid-1" and ref["controller"] is True
        assert obj["metadata"]["annotations"][names.ANNOTATION_APPLIED_HASH]
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "pdd-operator"


def test_vllm_engine_gets_nixl_connector_and_side_channel(pdd: PDDeployment) -> None:
    sts = find(render_children(pdd, RenderContext()), "StatefulSet", "llama-decode")
    engine = container(sts, "engine")
    args = engine["args"]
    config = json.loads(args[args.index("--kv-transfer-config") + 1])
    assert config["kv_connector"] == "NixlConnector"
    assert config["kv_role"] == "kv_consumer"  # kv_both is deprecated from vLLM 0.23.0
    assert "kv_connector_extra_config" not in config  # vLLM reads no role from there
    assert args[args.index("--tensor-parallel-size") + 1] == "2"
    env = env_of(engine)
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600"
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert engine["command"][:2] == ["/bin/sh", "-c"]  # sources the preflight env file
    assert sts["spec"]["replicas"] == 4


def test_sglang_adapter_sets_disaggregation_flags() -> None:
    pdd = make_pdd({"engine": {"image": "lmsysorg/sglang:v0.5.0", "type": "sglang"}})
    sts = find(render_children(pdd, RenderContext()), "StatefulSet", "llama-prefill")
    args = container(sts, "engine")["args"]
    assert args[args.index("--disaggregation-mode") + 1] == "prefill"
    assert args[args.index("--disaggregation-transfer-backend") + 1] == "nixl"
    assert args[args.index("--disaggregation-bootstrap-port") + 1] == "8998"


@pytest.mark.parametrize(("engine", "flag"), [("vllm", "--block-size"), ("sglang", "--page-size")])
def test_kv_block_size_becomes_the_engines_flag(engine: str, flag: str) -> None:
    pdd = make_pdd({"engine": {"type": engine, "kvBlockSize": 128}})
    for role in ("prefill", "decode"):
        sts = find(render_children(pdd, RenderContext()), "StatefulSet", f"llama-{role}")
        args = container(sts, "engine")["args"]
        assert args[args.index(flag) + 1] == "128"
    unknown = make_pdd({"engine": {"type": engine}, "model": {"name": "my-org/finetune"}})
    default = find(render_children(unknown, RenderContext()), "StatefulSet", "llama-decode")
    assert flag not in container(default, "engine")["args"]


@pytest.mark.parametrize(
    ("engine", "flags"),
    [
        # Llama-3.1-8B at TP 2: 2 KiB a token; 0.33 takes 256-token blocks and keeps prefix
        # hits at 16 tokens, 0.11.0's parser stops at 128
        (
            {"image": "vllm/vllm-openai:v0.33.0"},
            ["--block-size", "256", "--prefix-match-unit", "16"],
        ),
        ({"image": "vllm/vllm-openai:v0.11.0"}, ["--block-size", "128"]),
        # SGLang: K and V apart, 1 KiB each a token at TP 2
        ({"type": "sglang", "image": "lmsysorg/sglang:v0.5.23"}, ["--page-size", "256"]),
    ],
)
def test_the_chosen_block_is_rendered_before_the_users_args(
    engine: dict[str, str], flags: list[str]
) -> None:
    pdd = make_pdd({"engine": {**engine, "args": ["--seed", "1"]}})
    args = container(find(render_children(pdd, RenderContext()), "StatefulSet", "llama-decode"),
                     "engine")["args"]  # fmt: skip
    start = args.index(flags[0])
    assert args[start : start + len(flags)] == flags
    assert start < args.index("--seed")


RDMA = {"resourceName": "rdma/rdma_shared_device_a"}


@pytest.mark.parametrize(("scatter_gather", "value"), [(None, "y"), (False, "n")])
def test_nixl_scatter_gather_reaches_engine_preflight_and_sidecar(
    scatter_gather: bool | None, value: str
) -> None:
    ucx = {} if scatter_gather is None else {"scatterGather": scatter_gather}
    # With RDMA: there the offload has a lane (without, it stays off: the test below).
    pdd = make_pdd(
        {"kvTransfer": {"ucx": ucx, "metadataExchange": {"mode": "sidecar"}, "rdma": RDMA}}
    )
    sts = find(render_children(pdd, RenderContext()), "StatefulSet", "llama-decode")
    for name in ("engine", "preflight", "nixl-sidecar"):
        assert env_of(container(sts, name))["NIXL_UCX_SGL_ENABLE"] == value


def test_preflight_checks_the_kv_path_at_the_engines_descriptor_size(pdd: PDDeployment) -> None:
    preflight = container(
        find(render_children(pdd, RenderContext()), "StatefulSet", "llama-prefill"), "preflight"
    )
    env = env_of(preflight)
    # Llama-3.1-8B at TP 2 on vLLM 0.11.0: 128-token blocks (the operator's choice, that
    # release's largest) x 4 KV heads x 128 x 2 bytes x (K and V) per descriptor, READ with
    # that connector's 8 NIXL threads at NIXL's own split
    assert env["PDD_VERIFY_TRANSFER"] == "true"
    assert env["PDD_KV_DESCRIPTOR_BYTES"] == str(128 * 4 * 128 * 2 * 2)
    assert (env["PDD_KV_OPERATION"], env["PDD_KV_NIXL_THREADS"]) == ("READ", "8")
    assert env["PDD_KV_NIXL_SPLIT_BATCH"] == "0"
    assert {"name": "preflight-tmp", "mountPath": "/tmp"} in preflight["volumeMounts"]
    off = make_pdd({"kvTransfer": {"verification": {"enabled": False}}})
    preflight = container(
        find(render_children(off, RenderContext()), "StatefulSet", "llama-prefill"), "preflight"
    )
    assert env_of(preflight)["PDD_VERIFY_TRANSFER"] == "false"
    assert "PDD_KV_DESCRIPTOR_BYTES" not in env_of(preflight)


def test_custom_engine_gets_env_only() -> None:
    pdd = make_pdd({"engine": {"image": "example.com/engine:1", "type": "custom"}})
    engine = container(
        find(render_children(pdd, RenderContext()), "StatefulSet", "llama-prefill"), "engine"
    )
    assert "args" not in engine and "command" not in engine
    assert env_of(engine)["PDD_ROLE"] == "prefill"


def test_shm_is_a_memory_emptydir_of_the_requested_size() -> None:
    pdd = make_pdd({"kvTransfer": {"sharedMemorySize": "32Gi"}})
    sts = find(render_children(pdd, RenderContext()), "StatefulSet", "llama-prefill")
    shm = next(v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}


def test_router_disabled_renders_no_router() -> None:
    pdd = make_pdd({"router": {"enabled": False}})
    assert not [
        o for o in render_children(pdd, RenderContext()) if "router" in o["metadata"]["name"]
    ]


def test_rdma_settings_reach_the_pod() -> None:
    pdd = make_pdd(
        {"kvTransfer": {"rdma": {"resourceName": "rdma/hca", "count": 2, "networks": ["rdma-a"]}}}
    )
    sts = find(render_children(pdd, RenderContext()), "StatefulSet", "llama-prefill")
    template = sts["spec"]["template"]
    engine = container(sts, "engine")
    assert engine["resources"]["limits"]["rdma/hca"] == "2"
    assert engine["resources"]["requests"]["rdma/hca"] == "2"
    assert engine["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    assert env_of(engine)["UCX_TLS"] == "rc_x,ud_x,sm,self,cuda_copy,cuda_ipc"
    assert template["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] == "rdma-a"
    assert container(sts, "preflight")["resources"]["limits"]["nvidia.com/gpu"] == "2"


def test_explicit_ucx_transports_and_nic_map() -> None:
    pdd = make_pdd(
        {
            "kvTransfer": {
                "ucx": {"transports": ["rc", "cuda_copy"]},
                "nicSelection": {
                    "mode": "explicit",
                    "map": [{"gpu": 1, "devices": "mlx5_1:1"}, {"gpu": 0, "devices": "mlx5_0:1"}],
                },
            }
        }
    )
    engine = container(
        find(render_children(pdd, RenderContext()), "StatefulSet", "llama-prefill"), "engine"
    )
    env = env_of(engine)
    assert env["UCX_TLS"] == "rc,cuda_copy"
    assert env["PDD_NIC_MAP"] == "0=mlx5_0:1;1=mlx5_1:1"


def test_pod_template_patch_merges_containers_by_name() -> None:
    patch = {
        "spec": {
            "containers": [{"name": "engine", "imagePullPolicy": "Always"}],
            "priorityClassName": "inference",
        }
    }
    pdd = make_pdd({"prefill": {"replicas": 1, "podTemplate": patch}})
    sts = find(render_children(pdd, RenderContext()), "StatefulSet", "llama-prefill")
    engine = container(sts, "engine")
    assert engine["imagePullPolicy"] == "Always"
    assert engine["image"] == "vllm/vllm-openai:v0.11.0"  # untouched fields stay
    assert sts["spec"]["template"]["spec"]["priorityClassName"] == "inference"


def test_user_env_overrides_rendered_env() -> None:
    pdd = make_pdd(
        {
            "engine": {
                "image": "vllm/vllm-openai:v0.11.0",
                "env": [{"name": "UCX_TLS", "value": "tcp"}],
            }
        }
    )
    engine = container(
        find(render_children(pdd, RenderContext()), "StatefulSet", "llama-prefill"), "engine"
    )
    assert env_of(engine)["UCX_TLS"] == "tcp"


@pytest.mark.parametrize(
    "mode,key",
    [
        ("required", "requiredDuringSchedulingIgnoredDuringExecution"),
        ("preferred", "preferredDuringSchedulingIgnoredDuringExecution"),
    ],
)
def test_placement_becomes_node_affinity(mode: str, key: str) -> None:
    placement = Placement(
        mode=mode,
        level="nvidia.com/gpu.clique",
        domain="clique-a",
        node_requirements=(("pdd.dev/gpudirect", ("dmabuf",)),),
    )
    affinity = render_affinity(placement)["nodeAffinity"]
    assert key in affinity
    text = json.dumps(affinity)
    assert "clique-a" in text and "dmabuf" in text


def test_no_placement_no_affinity() -> None:
    assert render_affinity(Placement()) == {}


def test_revision_changes_with_the_engine_image_not_with_replicas() -> None:
    base = make_pdd()
    scaled = make_pdd({"decode": {"replicas": 8}})
    upgraded = make_pdd({"engine": {"image": "vllm/vllm-openai:v0.12.0"}})
    assert engine_revision(base.spec) == engine_revision(scaled.spec)
    assert engine_revision(base.spec) != engine_revision(upgraded.spec)


def test_rendering_is_deterministic(pdd: PDDeployment) -> None:
    assert render_children(pdd, RenderContext()) == render_children(pdd, RenderContext())


def test_dra_mode_renders_claim_templates_with_pcie_root_constraints() -> None:
    pdd = make_pdd({"topology": {"dra": {"enabled": True}}})
    objs = render_children(pdd, RenderContext())
    claim = find(objs, "ResourceClaimTemplate", "llama-prefill-gpu-nic")
    devices = claim["spec"]["spec"]["devices"]
    assert [r["name"] for r in devices["requests"]] == ["gpu-0", "nic-0", "gpu-1", "nic-1"]
    assert devices["constraints"] == [
        {"requests": ["gpu-0", "nic-0"], "matchAttribute": "resource.kubernetes.io/pcieRoot"},
        {"requests": ["gpu-1", "nic-1"], "matchAttribute": "resource.kubernetes.io/pcieRoot"},
    ]
    sts = find(objs, "StatefulSet", "llama-prefill")
    assert "nvidia.com/gpu" not in container(sts, "engine")["resources"]["limits"]
    assert (
        sts["spec"]["template"]["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
        == "llama-prefill-gpu-nic"
    )


def test_sidecar_gets_the_engine_ucx_env_side_channel_and_scratch_space(pdd: PDDeployment) -> None:
    sts = find(render_children(pdd, RenderContext()), "StatefulSet", "llama-decode")
    sidecar = container(sts, "nixl-sidecar")
    env = env_of(sidecar)
    assert env["UCX_TLS"] == env_of(container(sts, "engine"))["UCX_TLS"]
    # vLLM 0.11.0 (the fixture's image) listens once per GPU worker: TP 2, two ports.
    assert env["PDD_SIDE_CHANNEL"] == "vllm" and env["PDD_SIDE_CHANNEL_PORTS"] == "5600,5601"
    assert env["PDD_PROBER_POD"] == "llama-prefill-0"
    mounts = {m["mountPath"] for m in sidecar["volumeMounts"]}
    assert {"/tmp", "/dev/shm", "/var/run/pdd/token"} <= mounts
    assert sidecar["securityContext"]["readOnlyRootFilesystem"] is True
    assert sidecar["resources"]["limits"]["memory"] == "512Mi"


def test_no_sidecar_when_the_engine_exchanges_metadata_itself() -> None:
    pdd = make_pdd({"kvTransfer": {"metadataExchange": {"mode": "engine"}}})
    objs = render_children(pdd, RenderContext())
    sts = find(objs, "StatefulSet", "llama-prefill")
    assert [c["name"] for c in sts["spec"]["template"]["spec"]["containers"]] == ["engine"]
    # The router's own ServiceAccount and Role (pod discovery) stay; the sidecar's go.
    sidecar_access = [
        o
        for o in objs
        if o["kind"] in ("Role", "ServiceAccount")
        and o["metadata"]["labels"]["app.kubernetes.io/component"] != "router"
    ]
    assert not sidecar_access
    # The engines' own side channels carry the NIXL metadata then: still fenced off.
    assert ("NetworkPolicy", "llama-kv-transfer") in kinds(objs)


@pytest.mark.parametrize(("mode", "mounted"), [("sidecar", True), ("engine", False)])
def test_the_engine_gets_the_sidecar_token_file_its_env_names(mode: str, mounted: bool) -> None:
    pdd = make_pdd({"kvTransfer": {"metadataExchange": {"mode": mode}}})
    sts = find(render_children(pdd, RenderContext()), "StatefulSet", "llama-prefill")
    engine = container(sts, "engine")
    mounts = {m["mountPath"]: m for m in engine["volumeMounts"]}
    token_file = env_of(engine).get("PDD_SIDECAR_TOKEN_FILE")
    assert ("/var/run/pdd/token" in mounts) is mounted and bool(token_file) is mounted
    if mounted:
        assert token_file.startswith("/var/run/pdd/token/")
        assert mounts["/var/run/pdd/token"]["readOnly"] is True


def test_the_engine_revision_of_each_spec_object_is_its_own() -> None:
    """Worked out once per spec object: a later spec that happens to get a freed object's id
    still gets its own revision, the same as a copy of it would."""
    revisions = []
    for i in range(64):
        spec = make_pdd({"model": {"name": f"org/model-{i}"}}).spec
        revision = engine_revision(spec)
        assert revision == engine_revision(spec.model_copy(deep=True))
        revisions.append(revision)
        del spec  # frees the id for a later spec
    assert len(set(revisions)) == 64


def _preflight_env(spec: dict[str, Any]) -> dict[str, str]:
    sts = find(render_children(make_pdd(spec), RenderContext()), "StatefulSet", "llama-prefill")
    return env_of(container(sts, "preflight"))


HOST_PID = {"podTemplate": {"spec": {"hostPID": True}}}
HOST_PID_IPC = {"podTemplate": {"spec": {"hostPID": True, "hostIPC": True}}}


@pytest.mark.parametrize(
    ("spec", "operation", "boundary", "sgl"),
    [
        # vLLM's NixlConnector: decode READs; separate pods with RDMA keep the offload.
        ({"engine": {"type": "vllm"}, "kvTransfer": {"rdma": RDMA}}, "READ", "pod", "y"),
        ({"engine": {"type": "sglang"}, "kvTransfer": {"rdma": RDMA}}, "WRITE", "pod", "y"),
        # No RDMA, separate pods: the only lane is TCP emulation, which has no protocol for
        # the offload (every WRITE fails: docs/benchmarks.md), so it is left off.
        ({"engine": {"type": "sglang"}, "kvTransfer": {"rdma": {"resourceName": ""}}},
         "WRITE", "pod", "n"),
        # Both roles in the host's PID namespace: cuda_ipc and the offload work; the pods keep
        # their own IPC and mount namespaces, and so does the check's peer.
        ({"engine": {"type": "sglang"}, "kvTransfer": {"rdma": {"resourceName": ""}},
          "prefill": HOST_PID, "decode": HOST_PID}, "WRITE", "host-pid", "y"),
        # hostIPC as well: only the mount namespaces apart.
        ({"engine": {"type": "vllm"}, "kvTransfer": {"rdma": {"resourceName": ""}},
          "prefill": HOST_PID_IPC, "decode": HOST_PID_IPC}, "READ", "host-pid-ipc", "y"),
        # hostPID on one role only still leaves a boundary between them.
        ({"engine": {"type": "vllm"}, "kvTransfer": {"rdma": {"resourceName": ""}},
          "prefill": HOST_PID}, "READ", "pod", "n"),
    ],
)  # fmt: skip
def test_the_kv_check_moves_the_engines_direction_across_the_pods_boundary(
    spec: dict[str, Any], operation: str, boundary: str, sgl: str
) -> None:
    env = _preflight_env(spec)
    assert (env["PDD_KV_OPERATION"], env["PDD_KV_PEER_BOUNDARY"]) == (operation, boundary)
    assert env["NIXL_UCX_SGL_ENABLE"] == sgl


@pytest.mark.parametrize(
    ("spec", "forced"),
    [
        # Separate PID namespaces: cuda_ipc cannot reach the peer at all; nothing to force.
        ({"engine": {"type": "vllm"}, "kvTransfer": {"rdma": {"resourceName": ""}}}, None),
        ({"engine": {"type": "vllm"}, "prefill": HOST_PID}, None),
        # A shared PID namespace: the pull (READ) takes cuda_ipc only with get forced on.
        ({"engine": {"type": "vllm"}, "prefill": HOST_PID, "decode": HOST_PID}, "y"),
        ({"engine": {"type": "sglang"}, "prefill": HOST_PID_IPC, "decode": HOST_PID_IPC}, "y"),
        # The user's own value wins, and is rendered once.
        ({"engine": {"type": "vllm"}, "prefill": HOST_PID, "decode": HOST_PID,
          "kvTransfer": {"ucx": {"extraEnv": [
              {"name": "UCX_CUDA_IPC_ENABLE_GET_ZCOPY", "value": "n"}]}}}, "n"),
    ],
)  # fmt: skip
def test_cuda_ipc_get_is_forced_on_where_the_roles_share_a_pid_namespace(
    spec: dict[str, Any], forced: str | None
) -> None:
    sts = find(render_children(make_pdd(spec), RenderContext()), "StatefulSet", "llama-prefill")
    for name in ("preflight", "engine"):
        env = container(sts, name)["env"]
        values = [e["value"] for e in env if e["name"] == "UCX_CUDA_IPC_ENABLE_GET_ZCOPY"]
        assert values == ([forced] if forced else []), name


MIRROR = OperatorSettings(
    sidecar_image="mirror.example/pdd/pdd-sidecar:0.1.0",
    router_image="mirror.example/pdd/pdd-router:0.1.0",
    image_pull_secrets=("regcred",),
)


def pod_specs(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The pod spec of every workload rendered, by the workload's name."""
    workloads = [o for o in objs if o["kind"] in ("StatefulSet", "Deployment")]
    return {o["metadata"]["name"]: o["spec"]["template"]["spec"] for o in workloads}


def test_a_mirror_supplies_every_image_of_ours_and_its_pull_secret() -> None:
    """One setting per image moves the sidecar and the default router to a private registry,
    and every rendered pod pulls with the operator's Secrets; the engine image stays the
    spec's."""
    pdd = make_pdd({"router": {"image": DEFAULT_ROUTER_IMAGE}})
    objs = render_children(pdd, RenderContext(settings=MIRROR))
    specs = pod_specs(objs)
    assert set(specs) == {"llama-prefill", "llama-decode", "llama-router"}
    for spec in specs.values():
        assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    router = find(objs, "Deployment", "llama-router")
    assert container(router, "router")["image"] == "mirror.example/pdd/pdd-router:0.1.0"
    prefill = find(objs, "StatefulSet", "llama-prefill")
    for injected in ("nixl-sidecar", "preflight"):
        assert container(prefill, injected)["image"] == MIRROR.sidecar_image
    assert container(prefill, "engine")["image"] == pdd.spec.engine.image


def test_a_router_image_of_the_spec_is_kept_and_pull_secrets_add_to_the_pod_templates() -> None:
    pdd = make_pdd(
        {
            "router": {
                "image": "team.example/router:2",
                "podTemplate": {"spec": {"imagePullSecrets": [{"name": "team"}]}},
            }
        }
    )
    objs = render_children(pdd, RenderContext(settings=MIRROR))
    router = find(objs, "Deployment", "llama-router")
    assert container(router, "router")["image"] == "team.example/router:2"
    pulls = router["spec"]["template"]["spec"]["imagePullSecrets"]
    assert pulls == [{"name": "regcred"}, {"name": "team"}]


def test_without_pull_secrets_no_pod_names_any() -> None:
    for spec in pod_specs(render_children(make_pdd(), RenderContext())).values():
        assert "imagePullSecrets" not in spec
