"""spec.kvCache.offload.cpu: the prefill pods' CPU tier of the KV cache, sized per engine as each
release counts it, the pod's memory raised to match, and KVCacheOffloaded saying what was
rendered or why not. The rendered command lines pass each release's own parser in
tests/unit/engines/test_engine_parsers.py ("cpu-offload" cases)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from helpers.factories import make_pdd
from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.planning.kv_offload import raised_quantity
from pdd_operator.rendering.children import render_children
from pdd_operator.rendering.context import RenderContext
from pdd_operator.status.conditions import event_for
from pdd_operator.status.spec_conditions.kv_offload import condition as kv_offload_condition

GI = 1 << 30
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"  # 32 layers, 8 KV heads of 128 (known shape)


def pdd(engine: str, version: str, cpu: str | None = "64Gi", **patch: Any) -> PDDeployment:
    spec: dict[str, Any] = {
        "engine": {"type": engine, "version": version, "image": "registry.example/e:1"},
        "model": {"name": LLAMA_8B},
        "prefill": {"gpusPerInstance": 2},
        **patch,
    }
    if cpu is not None:
        spec["kvCache"] = {"offload": {"cpu": cpu}}
    return make_pdd(spec)


def engine_pod(obj: PDDeployment, role: str) -> dict[str, Any]:
    for child in render_children(obj, RenderContext()):
        name = child["metadata"]["name"]
        # one StatefulSet per role, or per instance of a multi-node role (the first here)
        if child["kind"] == "StatefulSet" and name.endswith((role, f"{role}-0")):
            return dict(child["spec"]["template"]["spec"])
    raise AssertionError(f"no {role} StatefulSet")


def engine_container(obj: PDDeployment, role: str) -> dict[str, Any]:
    return next(c for c in engine_pod(obj, role)["containers"] if c["name"] == "engine")


def kv_transfer_config(obj: PDDeployment, role: str) -> dict[str, Any]:
    args = engine_container(obj, role)["args"]
    return dict(json.loads(args[args.index("--kv-transfer-config") + 1]))


def shm_size(obj: PDDeployment, role: str) -> str:
    volumes = engine_pod(obj, role)["volumes"]
    return str(
        next(v for v in volumes if v["emptyDir"].get("medium") == "Memory")["emptyDir"]["sizeLimit"]
    )


def test_vllm_prefill_gets_an_offloading_connector_beside_nixl_sized_in_bytes() -> None:
    config = kv_transfer_config(pdd("vllm", "0.33.0"), "prefill")
    assert config["kv_connector"] == "MultiConnector"
    assert config["kv_role"] == "kv_producer"
    nixl, offload = config["kv_connector_extra_config"]["connectors"]
    assert nixl == {"kv_connector": "NixlConnector", "kv_role": "kv_producer"}
    assert offload["kv_connector"] == "OffloadingConnector"
    assert offload["kv_connector_extra_config"] == {"cpu_bytes_to_use": 64 * GI}


def test_vllm_decode_keeps_the_nixl_connector_alone() -> None:
    config = kv_transfer_config(pdd("vllm", "0.33.0"), "decode")
    assert config == {"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}


def test_vllm_data_parallel_engines_of_a_pod_share_its_tier() -> None:
    layout = {"gpusPerInstance": 8, "parallelism": {"tensor": 4, "data": 2}}
    obj = pdd("vllm", "0.33.0", cpu="200Gi", prefill=layout, decode=layout)
    offload = kv_transfer_config(obj, "prefill")["kv_connector_extra_config"]["connectors"][1]
    assert offload["kv_connector_extra_config"] == {"cpu_bytes_to_use": 100 * GI}


def test_vllm_before_0_14_counts_the_tier_in_blocks_of_the_models_kv() -> None:
    obj = pdd("vllm", "0.11.0")
    args = engine_container(obj, "prefill")["args"]
    block_tokens = int(args[args.index("--block-size") + 1])
    # Llama 3.1 8B at TP 2: 32 layers x (8 / 2 KV heads) x 128 x 2 bytes x K and V, per rank,
    # times the 2 ranks of the engine.
    per_token = 32 * 4 * 128 * 2 * 2 * 2
    offload = kv_transfer_config(obj, "prefill")["kv_connector_extra_config"]["connectors"][1]
    expected = 64 * GI // (block_tokens * per_token)
    assert offload["kv_connector_extra_config"] == {"num_cpu_blocks": expected}
    assert expected > 0


def test_vllm_before_0_14_without_the_models_shape_renders_no_tier_and_says_why() -> None:
    obj = pdd("vllm", "0.11.0", model={"name": "example/unknown-model"})
    assert kv_transfer_config(obj, "prefill")["kv_connector"] == "NixlConnector"
    assert "memory" not in engine_container(obj, "prefill")["resources"]["requests"]
    (condition,) = kv_offload_condition([], obj.spec, 1, "now")
    assert (condition.status, condition.reason) == ("False", "OffloadNotRendered")
    assert "set spec.model.kvCache, or run vLLM 0.14.0 or later" in condition.message
    event = event_for(condition)
    assert event is not None and event.type == "Warning"


def test_sglang_prefill_gets_a_hierarchical_cache_per_gpu_in_decimal_gigabytes() -> None:
    args = engine_container(pdd("sglang", "0.5.23"), "prefill")["args"]
    at = args.index("--enable-hierarchical-cache")
    assert args[at + 1 : at + 3] == ["--hicache-size", str(64 * GI // 2 // 10**9)]
    assert (
        "--enable-hierarchical-cache"
        not in engine_container(pdd("sglang", "0.5.23"), "decode")["args"]
    )


def test_sglang_under_a_gigabyte_per_gpu_renders_no_tier_and_says_how_much_to_give() -> None:
    obj = pdd("sglang", "0.5.4", cpu="1Gi", prefill={"gpusPerInstance": 8})
    assert "--enable-hierarchical-cache" not in engine_container(obj, "prefill")["args"]
    (condition,) = kv_offload_condition([], obj.spec, 1, "now")
    assert condition.status == "False" and "give at least 8G" in condition.message


@pytest.mark.parametrize(("engine", "version"), [("vllm", "0.33.0"), ("sglang", "0.5.23")])
def test_the_prefill_pods_memory_request_and_limit_grow_by_the_tier(
    engine: str, version: str
) -> None:
    resources = {"requests": {"memory": "32Gi"}, "limits": {"memory": "48Gi"}}
    obj = pdd(engine, version, prefill={"gpusPerInstance": 2, "resources": resources})
    prefill = engine_container(obj, "prefill")["resources"]
    assert (prefill["requests"]["memory"], prefill["limits"]["memory"]) == ("96Gi", "112Gi")
    decode = engine_container(obj, "decode")["resources"]
    assert "memory" not in decode["requests"]


def test_without_a_memory_request_the_tier_becomes_one_and_no_limit_is_invented() -> None:
    prefill = engine_container(pdd("vllm", "0.33.0"), "prefill")["resources"]
    assert prefill["requests"]["memory"] == "64Gi"
    assert "memory" not in prefill["limits"]


def test_vllm_0_33_keeps_the_tier_in_dev_shm_which_grows_by_it() -> None:
    assert shm_size(pdd("vllm", "0.33.0"), "prefill") == "80Gi"  # the default 16Gi + 64Gi
    assert shm_size(pdd("vllm", "0.33.0"), "decode") == "16Gi"
    assert shm_size(pdd("vllm", "0.11.0"), "prefill") == "16Gi"  # pinned process memory
    assert shm_size(pdd("sglang", "0.5.23"), "prefill") == "16Gi"


def test_the_condition_says_what_each_prefill_engine_got() -> None:
    (condition,) = kv_offload_condition([], pdd("vllm", "0.33.0").spec, 3, "now")
    assert (condition.status, condition.reason) == ("True", "OffloadRendered")
    assert condition.message.startswith("spec.kvCache.offload.cpu 64Gi: each prefill pod gives")
    assert "cpu_bytes_to_use 68719476736" in condition.message
    assert event_for(condition) is None  # True says nothing new


def test_no_offload_no_condition_and_nothing_changed() -> None:
    obj = pdd("vllm", "0.33.0", cpu=None)
    assert kv_offload_condition([], obj.spec, 1, "now") == []
    assert kv_transfer_config(obj, "prefill")["kv_connector"] == "NixlConnector"


@pytest.mark.parametrize(
    ("given", "extra", "expected"),
    [
        (None, 64 * GI, "64Gi"),
        ("32Gi", GI, "33Gi"),
        ("1G", GI, str(10**9 + GI)),
        ("512Mi", 1 << 29, "1Gi"),
    ],
)
def test_raised_quantity_keeps_a_whole_binary_unit(
    given: str | None, extra: int, expected: str
) -> None:
    assert raised_quantity(given, extra) == expected


def test_a_tier_in_tebibytes_is_sized_as_such() -> None:
    obj = pdd("vllm", "0.33.0", cpu="1Ti")
    offload = kv_transfer_config(obj, "prefill")["kv_connector_extra_config"]["connectors"][1]
    assert offload["kv_connector_extra_config"] == {"cpu_bytes_to_use": 1 << 40}
    assert engine_container(obj, "prefill")["resources"]["requests"]["memory"] == "1024Gi"


def test_a_memory_limit_without_a_request_is_raised_as_the_request_it_stands_for() -> None:
    """Kubernetes takes a limit alone as the request too: the tier is added to it, not put
    in its place (which would schedule the pod with less memory than before)."""
    resources = {"limits": {"memory": "200Gi"}}
    obj = pdd("vllm", "0.33.0", prefill={"gpusPerInstance": 2, "resources": resources})
    prefill = engine_container(obj, "prefill")["resources"]
    assert (prefill["requests"]["memory"], prefill["limits"]["memory"]) == ("264Gi", "264Gi")


def test_vllm_before_0_14_renders_no_tier_too_small_for_one_block() -> None:
    # A shape whose one token takes 1 GiB of KV over the engine's ranks.
    huge = {"name": "example/huge", "kvCache": {"layers": 1024, "kvHeads": 64, "headDim": 4096}}
    obj = pdd("vllm", "0.11.0", cpu="1Gi", model=huge)
    assert kv_transfer_config(obj, "prefill")["kv_connector"] == "NixlConnector"
    (condition,) = kv_offload_condition([], obj.spec, 1, "now")
    assert condition.status == "False" and "0 KV blocks" in condition.message


def test_sglang_0_5_4s_condition_says_its_host_tier_must_exceed_the_gpus_kv_cache() -> None:
    (old,) = kv_offload_condition([], pdd("sglang", "0.5.4").spec, 1, "now")
    (new,) = kv_offload_condition([], pdd("sglang", "0.5.23").spec, 1, "now")
    assert "0.5.4 refuses to start unless" in old.message
    assert "refuses" not in new.message


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_sglang_engines_serve_their_metrics(role: str) -> None:
    assert "--enable-metrics" in engine_container(pdd("sglang", "0.5.23", cpu=None), role)["args"]


# ------------------------------------------------------------------ spec.kvCache.offload.disk

ENGINE_FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "engines"


def with_disk(
    engine: str,
    version: str,
    cpu: str | None = "64Gi",
    storage_class: str | None = None,
    **patch: Any,
) -> PDDeployment:
    disk = {"size": "200Gi", **({"storageClassName": storage_class} if storage_class else {})}
    offload: dict[str, Any] = {"disk": disk, **({"cpu": cpu} if cpu is not None else {})}
    return pdd(engine, version, cpu=None, kvCache={"offload": offload}, **patch)


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container["env"]}


def test_sglang_prefill_keeps_a_capped_file_store_per_rank_on_an_emptydir() -> None:
    obj = with_disk("sglang", "0.5.23")
    engine = engine_container(obj, "prefill")
    assert "--hicache-storage-backend file" in " ".join(engine["args"])
    env = env_of(engine)
    assert env["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] == "/var/cache/pdd-kv-offload"
    # 200Gi over 2 GPUs, 90% of it: room for what the cap does not count
    assert env["SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE"] == str(int(100 * GI * 0.9))
    assert {"name": "kv-offload-disk", "mountPath": "/var/cache/pdd-kv-offload"} in engine[
        "volumeMounts"
    ]
    (volume,) = [v for v in engine_pod(obj, "prefill")["volumes"] if v["name"] == "kv-offload-disk"]
    assert volume == {"name": "kv-offload-disk", "emptyDir": {"sizeLimit": "200Gi"}}
    assert engine["resources"]["requests"]["ephemeral-storage"] == "200Gi"


def test_the_rendered_environment_names_are_the_releases_own() -> None:
    names = set(json.loads((ENGINE_FIXTURES / "sglang-0.5.23.json").read_text())["env"])
    env = env_of(engine_container(with_disk("sglang", "0.5.23"), "prefill"))
    assert {n for n in env if n.startswith("SGLANG_HICACHE")} <= names


def test_a_storage_class_gives_each_prefill_pod_a_claim_of_its_own() -> None:
    obj = with_disk("sglang", "0.5.23", storage_class="local-nvme")
    pod = engine_pod(obj, "prefill")
    (volume,) = [v for v in pod["volumes"] if v["name"] == "kv-offload-disk"]
    assert volume["ephemeral"]["volumeClaimTemplate"]["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": "local-nvme",
        "resources": {"requests": {"storage": "200Gi"}},
    }
    engine = engine_container(obj, "prefill")
    assert "ephemeral-storage" not in engine["resources"]["requests"]


def test_decode_pods_get_no_disk_tier() -> None:
    obj = with_disk("sglang", "0.5.23")
    pod = engine_pod(obj, "decode")
    assert all(v["name"] != "kv-offload-disk" for v in pod["volumes"])
    assert "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR" not in env_of(engine_container(obj, "decode"))


def test_the_condition_tells_both_tiers() -> None:
    (condition,) = kv_offload_condition([], with_disk("sglang", "0.5.23").spec, 1, "now")
    assert (condition.status, condition.reason) == ("True", "OffloadRendered")
    cpu, disk = condition.message.split("; spec.kvCache.offload.disk 200Gi: ")
    assert cpu.startswith("spec.kvCache.offload.cpu 64Gi: each prefill GPU rank keeps")
    assert disk.startswith(f"each prefill GPU rank keeps up to {int(100 * GI * 0.9)} bytes")


@pytest.mark.parametrize(
    ("engine", "version", "cpu", "says"),
    [
        ("sglang", "0.5.4", "64Gi", "use SGLang 0.5.23 or later"),
        ("sglang", "0.5.23", None, "set spec.kvCache.offload.cpu as well"),
        ("vllm", "0.11.0", "64Gi", "run vLLM 0.33.0 or later"),
    ],
)
def test_where_the_disk_tier_is_not_rendered_nothing_of_it_is_and_the_condition_says_why(
    engine: str, version: str, cpu: str | None, says: str
) -> None:
    obj = with_disk(engine, version, cpu=cpu)
    without = pdd(engine, version, cpu=cpu)
    assert engine_container(obj, "prefill") == engine_container(without, "prefill")
    assert engine_pod(obj, "prefill")["volumes"] == engine_pod(without, "prefill")["volumes"]
    conditions = kv_offload_condition([], obj.spec, 1, "now")
    (condition,) = conditions
    assert (condition.status, condition.reason) == ("False", "OffloadNotRendered")
    assert says in condition.message


def test_an_ephemeral_storage_request_and_limit_grow_by_the_emptydir_tier() -> None:
    resources = {"requests": {"ephemeral-storage": "10Gi"}, "limits": {"ephemeral-storage": "50Gi"}}
    obj = with_disk("sglang", "0.5.23", prefill={"gpusPerInstance": 2, "resources": resources})
    got = engine_container(obj, "prefill")["resources"]
    assert got["requests"]["ephemeral-storage"] == "210Gi"
    assert got["limits"]["ephemeral-storage"] == "250Gi"


def test_an_ephemeral_storage_limit_alone_is_raised_as_the_request_it_stands_for() -> None:
    resources = {"limits": {"ephemeral-storage": "50Gi"}}
    obj = with_disk("sglang", "0.5.23", prefill={"gpusPerInstance": 2, "resources": resources})
    got = engine_container(obj, "prefill")["resources"]
    assert got["requests"]["ephemeral-storage"] == got["limits"]["ephemeral-storage"] == "250Gi"


def test_a_latent_models_pages_are_written_by_one_rank_which_gets_the_pods_whole_share() -> None:
    deepseek = {"name": "deepseek-ai/DeepSeek-V3"}
    obj = with_disk("sglang", "0.5.23", model=deepseek)
    env = env_of(engine_container(obj, "prefill"))
    assert env["SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE"] == str(int(200 * GI * 0.9))
    (condition,) = kv_offload_condition([], obj.spec, 1, "now")
    assert "rank 0 of each prefill pod keeps" in condition.message


def test_prefill_instances_over_several_nodes_get_no_disk_tier() -> None:
    layout = {"gpusPerInstance": 8, "nodesPerInstance": 2}
    obj = with_disk("sglang", "0.5.23", prefill=layout, decode=layout)
    (condition,) = kv_offload_condition([], obj.spec, 1, "now")
    assert condition.status == "False" and "spec.prefill.nodesPerInstance" in condition.message


def disk_connector(obj: PDDeployment) -> dict[str, Any]:
    config = kv_transfer_config(obj, "prefill")
    assert config["kv_connector"] == "MultiConnector"
    *_, disk = config["kv_connector_extra_config"]["connectors"]
    assert disk["kv_connector"] == "SimpleCPUOffloadConnector"
    assert disk["kv_role"] == "kv_both"
    return dict(disk["kv_connector_extra_config"])


def test_vllm_prefill_keeps_one_capped_file_per_gpu_worker_behind_the_cpu_tier() -> None:
    obj = with_disk("vllm", "0.33.0")
    nixl, cpu, _ = kv_transfer_config(obj, "prefill")["kv_connector_extra_config"]["connectors"]
    assert (nixl["kv_connector"], cpu["kv_connector"]) == ("NixlConnector", "OffloadingConnector")
    # 200Gi over 2 GPU workers, 90% of each share; Llama 8B's blocks are whole 4 KiB pages
    assert disk_connector(obj) == {
        "kv_offload_backend": "disk",
        "disk_path": "/var/cache/pdd-kv-offload/kv",
        "disk_capacity_bytes": int(100 * GI * 0.9),
        "use_page_cache": False,
    }
    engine = engine_container(obj, "prefill")
    assert {"name": "kv-offload-disk", "mountPath": "/var/cache/pdd-kv-offload"} in engine[
        "volumeMounts"
    ]
    assert engine["resources"]["requests"]["ephemeral-storage"] == "200Gi"
    assert "SimpleCPUOffloadConnector" not in " ".join(engine_container(obj, "decode")["args"])


def test_vllm_disk_tier_alone_joins_the_nixl_connector_in_a_multiconnector() -> None:
    config = kv_transfer_config(with_disk("vllm", "0.33.0", cpu=None), "prefill")
    nixl, disk = config["kv_connector_extra_config"]["connectors"]
    assert config["kv_role"] == nixl["kv_role"] == "kv_producer"
    assert disk["kv_connector"] == "SimpleCPUOffloadConnector"


@pytest.mark.parametrize(
    ("model", "page_cache"),
    [
        (LLAMA_8B, False),
        # a latent of 576 values: a block's region is not whole pages, which O_DIRECT needs
        ("deepseek-ai/DeepSeek-V3", True),
        ("my-org/model-of-unknown-shape", True),
    ],
)
def test_vllm_writes_past_the_page_cache_only_where_every_block_is_whole_pages(
    model: str, page_cache: bool
) -> None:
    obj = with_disk("vllm", "0.33.0", model={"name": model})
    assert disk_connector(obj)["use_page_cache"] is page_cache
    (condition,) = kv_offload_condition([], obj.spec, 1, "now")
    written = "through the page cache" if page_cache else "O_DIRECT"
    assert f"written {written}" in condition.message


def tp8_at_16_token_blocks(*args: str) -> PDDeployment:
    layout = {"gpusPerInstance": 8, "parallelism": {"tensor": 8}}
    engine = {"type": "vllm", "version": "0.33.0", "image": "r/e:1", "kvBlockSize": 16}
    return make_pdd(
        {
            "engine": {**engine, "args": list(args)},
            "model": {"name": LLAMA_8B},
            "prefill": layout,
            "decode": layout,
            "kvCache": {"offload": {"disk": {"size": "200Gi"}}},
        }
    )


def test_an_8_bit_kv_cache_in_the_args_is_counted_before_o_direct_is_chosen() -> None:
    # Llama 8B at TP 8 and 16-token blocks: one KV head of 128 values, 4 KiB a region in
    # bfloat16, 2 KiB in an 8-bit dtype, which O_DIRECT would refuse
    assert disk_connector(tp8_at_16_token_blocks())["use_page_cache"] is False
    fp8 = tp8_at_16_token_blocks("--kv-cache-dtype", "fp8")
    assert disk_connector(fp8)["use_page_cache"] is True


def test_vllm_data_parallel_engines_in_one_pod_get_no_disk_tier() -> None:
    layout = {"gpusPerInstance": 8, "parallelism": {"tensor": 4, "data": 2}}
    obj = with_disk("vllm", "0.33.0", prefill=layout, decode=layout)
    connectors = kv_transfer_config(obj, "prefill")["kv_connector_extra_config"]["connectors"]
    assert [c["kv_connector"] for c in connectors] == ["NixlConnector", "OffloadingConnector"]
    (condition,) = kv_offload_condition([], obj.spec, 1, "now")
    assert condition.status == "False" and "run one engine per pod" in condition.message


def test_vllm_prefill_instances_over_several_nodes_keep_a_disk_tier_per_pod() -> None:
    layout = {"gpusPerInstance": 8, "nodesPerInstance": 2}
    obj = with_disk("vllm", "0.33.0", prefill=layout, decode=layout)
    assert disk_connector(obj)["disk_capacity_bytes"] == int(200 * GI / 8 * 0.9)
