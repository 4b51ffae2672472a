"""How each engine's connector moves the KV, per release and pod namespaces: the connector the
vLLM adapter picks, the direction and NIXL threads the KV-path check repeats (read from the
engines' sources, see engines/vllm.py and engines/sglang.py), and the router mode that goes
with them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from helpers.factories import make_pdd
from pdd_operator.engines.base import KvPattern, RouterDiscovery
from pdd_operator.engines.registry import adapter_for
from pdd_operator.engines.sglang import NIXL_BACKEND_PARAMS
from pdd_operator.rendering.children import render_children
from pdd_operator.rendering.context import RenderContext

V033, V011 = "vllm/vllm-openai:v0.33.0", "vllm/vllm-openai:v0.11.0"
HOST_PID = {"podTemplate": {"spec": {"hostPID": True}}}


def vllm_spec(image: str, host_pid: bool, connector: str | None = None) -> Any:
    roles = {"prefill": HOST_PID, "decode": HOST_PID} if host_pid else {}
    kv = {"kvTransfer": {"connector": connector}} if connector else {}
    return make_pdd({"engine": {"image": image}, **roles, **kv}).spec


@pytest.mark.parametrize(
    ("image", "host_pid", "connector", "pattern"),
    [
        # Separate pods: the KV leaves by RDMA or TCP, where vLLM pulls.
        (V033, False, "NixlConnector", KvPattern("READ", 4)),
        # A shared PID namespace (cuda_ipc) on a release with the push connector: WRITE.
        (V033, True, "NixlPushConnector", KvPattern("WRITE", 4)),
        # 0.11.0 has no push connector; its NixlConnector asks NIXL for 8 threads.
        (V011, True, "NixlConnector", KvPattern("READ", 8)),
    ],
)
def test_auto_picks_the_push_connector_where_it_was_measured_faster(
    image: str, host_pid: bool, connector: str, pattern: KvPattern
) -> None:
    spec = vllm_spec(image, host_pid)
    adapter = adapter_for("vllm")
    assert spec.kvTransfer.connector == "auto"
    assert adapter.connector(spec) == connector  # type: ignore[attr-defined]
    assert adapter.kv_pattern(spec) == pattern


@pytest.mark.parametrize("connector", ["NixlConnector", "NixlPushConnector"])
def test_a_named_connector_is_rendered_as_named(connector: str) -> None:
    pdd = make_pdd({"engine": {"image": V033}, "kvTransfer": {"connector": connector}})
    children = render_children(pdd, RenderContext())
    for role in ("prefill", "decode"):
        sts = next(c for c in children if c["metadata"]["name"] == f"llama-{role}")
        engine = next(c for c in sts["spec"]["template"]["spec"]["containers"]
                      if c["name"] == "engine")  # fmt: skip
        args = engine["args"]
        config = json.loads(args[args.index("--kv-transfer-config") + 1])
        assert config["kv_connector"] == connector
        annotations = sts["spec"]["template"]["metadata"]["annotations"]
        assert annotations["smg.ai/kv-connector"] == connector
        preflight = sts["spec"]["template"]["spec"]["initContainers"][0]
        env = {e["name"]: e.get("value") for e in preflight["env"]}
        assert env["PDD_KV_OPERATION"] == ("WRITE" if "Push" in connector else "READ")
    # vllm-router's `nixl` mode reads pull or push from the prefill's answer.
    launch = adapter_for("vllm").router(pdd.spec, discovery=_discovery())
    assert launch.args[launch.args.index("--kv-connector") + 1] == "nixl"


def _discovery() -> RouterDiscovery:
    return RouterDiscovery("default", (("role", "prefill"),), (("role", "decode"),), 8000)


@pytest.mark.parametrize(
    ("image", "threads", "split"),
    [("lmsysorg/sglang:v0.5.23", 8, 1), ("lmsysorg/sglang:v0.5.4", 0, 0)],
)
def test_sglang_writes_with_its_releases_nixl_threads(image: str, threads: int, split: int) -> None:
    spec = make_pdd({"engine": {"type": "sglang", "image": image}}).spec
    adapter = adapter_for("sglang")
    assert adapter.kv_pattern(spec) == KvPattern("WRITE", threads, split)
    env = {e["name"]: e["value"] for e in adapter.launch(spec, "prefill").env}
    if split:
        assert json.loads(env[NIXL_BACKEND_PARAMS]) == {"split_batch_size": "1"}
    else:  # 0.5.4 reads no such variable
        assert NIXL_BACKEND_PARAMS not in env


def test_the_users_nixl_backend_params_win() -> None:
    mine = {"name": NIXL_BACKEND_PARAMS, "value": '{"num_threads":"2"}'}
    spec = make_pdd({"engine": {"type": "sglang", "image": "lmsysorg/sglang:v0.5.23",
                                "env": [mine]}}).spec  # fmt: skip
    adapter = adapter_for("sglang")
    assert adapter.kv_pattern(spec).split_batch == 0
    assert all(e["name"] != NIXL_BACKEND_PARAMS for e in adapter.launch(spec, "prefill").env)
