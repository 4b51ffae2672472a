"""The routers each engine pairs with, checked against the pinned routers' own ``--help``.

tests/fixtures/routers/ holds the verbatim help of vllm-router 0.1.17 and smg 1.13.0 (its
README says how it was captured). Every flag the operator renders must be one the pinned
router declares, with as many values as the router takes and a value among its choices, so a
flag renamed or dropped upstream fails here before it fails in a cluster.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from helpers.factories import make_pdd
from pdd_operator.api import names
from pdd_operator.api.v1alpha1 import DEFAULT_ROUTER_IMAGE, PDDeployment
from pdd_operator.engines.registry import ENGINES
from pdd_operator.engines.sglang import BOOTSTRAP_PORT_ANNOTATION
from pdd_operator.engines.vllm import SMG_KV_CONNECTOR_ANNOTATION
from pdd_operator.rendering.children import render_children
from pdd_operator.rendering.context import RenderContext
from pdd_operator.rendering.roles import engine_revision

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures" / "routers"

# engine type -> (package, pinned version, console script, help fixture of what runs)
ROUTERS = {
    "vllm": ("vllm-router", "0.1.17", "vllm-router", "vllm-router-0.1.17.help.txt"),
    # The sglang-router 0.3.2 fixture is the legacy name; smg is what the image installs.
    "sglang": ("smg", "1.13.0", "smg", "smg-1.13.0.launch.help.txt"),
}


@dataclass(frozen=True)
class Option:
    """One option of an argparse help text: how many values it takes, and its choices."""

    min_values: int
    max_values: int | None  # None: any number
    choices: tuple[str, ...] = ()


# An option's line in argparse help: two spaces, the option (with its aliases), then its
# metavar up to two spaces or the end. Example lines in the description are indented deeper.
_OPTION_LINE = re.compile(r"^  (-[^ ].*?)(?:  |$)")


def parse_help(text: str) -> dict[str, Option]:
    options: dict[str, Option] = {}
    for line in text.splitlines():
        match = _OPTION_LINE.match(line)
        if not match:
            continue
        for spelling in match.group(1).split(", "):
            flag, _, metavar = spelling.partition(" ")
            options[flag] = _arity(metavar)
    return options


def _arity(metavar: str) -> Option:
    if not metavar:
        return Option(0, 0)
    if metavar.startswith("{"):
        return Option(1, 1, tuple(metavar.strip("{}").split(",")))
    if metavar.startswith("["):  # nargs="*": "[X ...]"
        return Option(0, None)
    if metavar.endswith("...]"):  # nargs="+": "X [X ...]"
        return Option(1, None)
    return Option(1, 1)


def check_args(args: list[str], options: dict[str, Option]) -> dict[str, list[str]]:
    """Parse ``args`` the way argparse would with ``options``; returns flag -> values and
    fails on an unknown flag, a wrong number of values or a value outside the choices."""
    parsed: dict[str, list[str]] = {}
    i = 0
    while i < len(args):
        flag = args[i]
        assert flag.startswith("--"), f"{flag!r} is not a flag (a value too many before it?)"
        assert flag in options, f"{flag} is not an option of the pinned router"
        option = options[flag]
        values: list[str] = []
        i += 1
        while i < len(args) and not args[i].startswith("--"):
            if option.max_values is not None and len(values) == option.max_values:
                break
            values.append(args[i])
            i += 1
        assert len(values) >= option.min_values, f"{flag} needs a value"
        if option.choices:
            assert values[0] in option.choices, f"{flag} {values[0]} not in {option.choices}"
        assert flag not in parsed, f"{flag} given twice"
        parsed[flag] = values
    return parsed


def router_pdd(engine: str, spec_patch: dict[str, Any] | None = None) -> PDDeployment:
    patch: dict[str, Any] = {"engine": {"type": engine, "image": "example.com/engine:1"}}
    patch["router"] = {"image": DEFAULT_ROUTER_IMAGE}
    return make_pdd({**patch, **(spec_patch or {})})


def find(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


def router_container(pdd: PDDeployment, ctx: RenderContext | None = None) -> dict[str, Any]:
    deployment = find(render_children(pdd, ctx or RenderContext()), "Deployment", "llama-router")
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def rendered_flags(engine: str, spec_patch: dict[str, Any] | None = None) -> dict[str, list[str]]:
    _, _, script, fixture = ROUTERS[engine]
    container = router_container(router_pdd(engine, spec_patch))
    assert container["command"] == [script]
    args = list(container["args"])
    if engine == "sglang":
        # smg's router is its `launch` subcommand (smg-1.13.0.help.txt lists the two).
        top = (FIXTURES / "smg-1.13.0.help.txt").read_text()
        assert "{launch,serve}" in top
        assert args.pop(0) == "launch"
    return check_args(args, parse_help((FIXTURES / fixture).read_text()))


def test_the_help_parser_reads_what_the_fixtures_declare() -> None:
    # The parser itself: a flag, a choice, a list and a valued option of each fixture.
    vllm = parse_help((FIXTURES / "vllm-router-0.1.17.help.txt").read_text())
    assert vllm["--service-discovery"] == Option(0, 0)
    assert vllm["--kv-connector"].choices == ("nixl", "mooncake", "moriio")
    assert vllm["--prefill-selector"] == Option(1, None)
    assert vllm["--host"] == Option(1, 1)
    assert "--help" in vllm and "-h" in vllm
    assert "--pd-disaggregation" not in vllm  # smg's spelling; vllm-router says --vllm-pd-...
    smg = parse_help((FIXTURES / "smg-1.13.0.launch.help.txt").read_text())
    assert smg["--disable-tokenizer-autoload"] == Option(0, 0)
    assert "--vllm-pd-disaggregation" not in smg
    with pytest.raises(AssertionError, match="not an option"):
        check_args(["--no-such-flag"], vllm)
    with pytest.raises(AssertionError, match="not in"):
        check_args(["--kv-connector", "lmcache"], vllm)
    with pytest.raises(AssertionError, match="not a flag"):
        check_args(["--service-discovery", "yes"], vllm)


@pytest.mark.parametrize("engine", sorted(ROUTERS))
def test_every_rendered_flag_is_one_the_pinned_router_declares(engine: str) -> None:
    flags = rendered_flags(engine)
    pdd = router_pdd(engine)
    assert flags["--host"] == ["0.0.0.0"]  # vllm-router binds 127.0.0.1 otherwise
    assert flags["--port"] == [str(pdd.spec.router.port)]
    assert flags["--prometheus-host"] == ["0.0.0.0"]
    assert flags["--prometheus-port"] == ["29000"]
    assert flags["--request-timeout-secs"] == ["1800"]
    assert "--service-discovery" in flags
    assert flags["--service-discovery-namespace"] == ["team-a"]
    assert flags["--service-discovery-port"] == [str(pdd.spec.engine.port)]


@pytest.mark.parametrize("engine", sorted(ROUTERS))
def test_every_policy_the_api_offers_is_a_choice_of_the_pinned_router(engine: str) -> None:
    """spec.router.policy, prefillPolicy and decodePolicy render as the router's own flags,
    each value among the choices its --help declares (check_args)."""
    for policy in ENGINES[engine].router_policies:
        router = {"image": DEFAULT_ROUTER_IMAGE, "policy": policy}
        router |= {"prefillPolicy": policy, "decodePolicy": policy}
        flags = rendered_flags(engine, {"router": router})
        assert flags["--policy"] == flags["--prefill-policy"] == [policy]
        assert flags["--decode-policy"] == [policy]


@pytest.mark.parametrize("engine", sorted(ROUTERS))
def test_without_a_policy_the_router_keeps_its_default(engine: str) -> None:
    flags = rendered_flags(engine)
    assert not {"--policy", "--prefill-policy", "--decode-policy"} & set(flags)
    router = {"image": DEFAULT_ROUTER_IMAGE, "decodePolicy": "round_robin"}
    flags = rendered_flags(engine, {"router": router})
    assert flags["--decode-policy"] == ["round_robin"]
    assert "--policy" not in flags and "--prefill-policy" not in flags


def test_vllm_router_runs_vllm_pd_mode_with_the_nixl_connector() -> None:
    flags = rendered_flags("vllm")
    assert "--vllm-pd-disaggregation" in flags
    assert flags["--kv-connector"] == ["nixl"]


def test_smg_runs_pd_mode_without_fetching_a_tokenizer() -> None:
    flags = rendered_flags("sglang")
    assert "--pd-disaggregation" in flags
    assert "--disable-tokenizer-autoload" in flags


@pytest.mark.parametrize("engine", sorted(ROUTERS))
def test_selectors_are_the_roles_labels_plus_the_engine_revision(engine: str) -> None:
    flags = rendered_flags(engine)
    revision = engine_revision(router_pdd(engine).spec)
    for role in ("prefill", "decode"):
        assert sorted(flags[f"--{role}-selector"]) == sorted(
            [
                f"{names.LABEL_DEPLOYMENT}=llama",
                f"{names.LABEL_ROLE}={role}",
                f"{names.LABEL_REVISION}={revision}",
            ]
        )


@pytest.mark.parametrize("engine", sorted(ROUTERS))
def test_the_selected_revision_is_the_one_the_engine_pods_carry(engine: str) -> None:
    pdd = router_pdd(engine, {"decode": {"replicas": 4, "args": ["--x"]}})
    objs = render_children(pdd, RenderContext())
    flags = rendered_flags(engine, {"decode": {"replicas": 4, "args": ["--x"]}})
    for role in ("prefill", "decode"):
        labels = find(objs, "StatefulSet", f"llama-{role}")["spec"]["template"]["metadata"][
            "labels"
        ]
        pairs = dict(v.split("=", 1) for v in flags[f"--{role}-selector"])
        assert pairs.items() <= labels.items()
    # A new engine build is a new revision, and the router follows it.
    upgraded = router_pdd(engine, {"engine": {"type": engine, "image": "example.com/engine:2"}})
    assert engine_revision(upgraded.spec) != engine_revision(pdd.spec)
    new_args = router_container(upgraded)["args"]
    assert f"{names.LABEL_REVISION}={engine_revision(upgraded.spec)}" in new_args


def test_a_rollout_step_does_not_restart_the_router() -> None:
    # Partitions move one pod per step; the router selects the spec's revision throughout
    # (rendering.router.router_discovery), so its Deployment is the same at every step.
    pdd = router_pdd("vllm")
    steady = find(render_children(pdd, RenderContext()), "Deployment", "llama-router")
    rolling = RenderContext(partitions={"prefill": 2, "decode": 3})
    during = find(render_children(pdd, rolling), "Deployment", "llama-router")
    assert during == steady
    strategy = steady["spec"]["strategy"]["rollingUpdate"]
    assert strategy["maxUnavailable"] == 0  # old router pods serve until new ones are Ready


@pytest.mark.parametrize("engine", sorted(ROUTERS))
def test_the_router_pairs_the_revision_the_rollout_says_and_carries_it(engine: str) -> None:
    """During a rollout the home router keeps pairing the old revision
    (RenderContext.router_revision); its pods carry the revision they pair, which the
    rollout reads to know when the old routers are gone."""
    pdd = router_pdd(engine)
    pinned = RenderContext(router_revision="old0000000")
    deployment = find(render_children(pdd, pinned), "Deployment", "llama-router")
    template = deployment["spec"]["template"]
    assert template["metadata"]["labels"][names.LABEL_REVISION] == "old0000000"
    args = template["spec"]["containers"][0]["args"]
    assert args.count(f"{names.LABEL_REVISION}=old0000000") == 2  # prefill and decode
    steady = find(render_children(pdd, RenderContext()), "Deployment", "llama-router")
    revision = engine_revision(pdd.spec)
    assert steady["spec"]["template"]["metadata"]["labels"][names.LABEL_REVISION] == revision


@pytest.mark.parametrize("engine", sorted(ROUTERS))
def test_the_router_may_only_list_and_watch_pods_in_its_namespace(engine: str) -> None:
    objs = render_children(router_pdd(engine), RenderContext())
    account = names.router_account_name("llama")
    role = find(objs, "Role", account)
    assert role["metadata"]["namespace"] == "team-a"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]
    binding = find(objs, "RoleBinding", account)
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": account,
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": "team-a"}
    ]
    assert find(objs, "ServiceAccount", account)["metadata"]["ownerReferences"]
    assert not [o for o in objs if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    pod = find(objs, "Deployment", "llama-router")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account


@pytest.mark.parametrize("engine", sorted(ROUTERS))
def test_probes_metrics_port_resources_and_replicas(engine: str) -> None:
    pdd = router_pdd(
        engine,
        {
            "router": {
                "image": DEFAULT_ROUTER_IMAGE,
                "replicas": 3,
                "port": 9000,
                "metricsPort": 9100,
                "resources": {"requests": {"cpu": "2"}, "limits": {"memory": "4Gi"}},
            }
        },
    )
    objs = render_children(pdd, RenderContext())
    deployment = find(objs, "Deployment", "llama-router")
    assert deployment["spec"]["replicas"] == 3
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == DEFAULT_ROUTER_IMAGE
    assert container["readinessProbe"]["httpGet"] == {"path": "/readiness", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/liveness", "port": "http"}
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "http": 9000,
        "metrics": 9100,
    }
    assert container["resources"] == {"requests": {"cpu": "2"}, "limits": {"memory": "4Gi"}}
    assert "9100" in container["args"] and "9000" in container["args"]
    service = find(objs, "Service", "llama-router")
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {
        "http": 9000,
        "metrics": 9100,
    }


def test_the_default_resources_are_the_crds() -> None:
    container = router_container(router_pdd("vllm"))
    assert container["resources"] == {
        "requests": {"cpu": "500m", "memory": "512Mi"},
        "limits": {"memory": "2Gi"},
    }


def test_the_pod_template_merges_over_the_routers() -> None:
    patch = {
        "router": {
            "image": DEFAULT_ROUTER_IMAGE,
            "podTemplate": {
                "metadata": {"labels": {"team": "a"}},
                "spec": {
                    "nodeSelector": {"pool": "cpu"},
                    "containers": [{"name": "router", "env": [{"name": "RUST_LOG", "value": "d"}]}],
                },
            },
        }
    }
    objs = render_children(router_pdd("vllm", patch), RenderContext())
    template = find(objs, "Deployment", "llama-router")["spec"]["template"]
    assert template["metadata"]["labels"]["team"] == "a"
    assert template["metadata"]["labels"][names.LABEL_ROLE] == "router"  # kept
    assert template["spec"]["nodeSelector"] == {"pool": "cpu"}
    container = template["spec"]["containers"][0]
    assert container["command"] == ["vllm-router"]  # kept
    assert {"name": "RUST_LOG", "value": "d"} in container["env"]


def test_a_custom_router_command_replaces_the_engines_router() -> None:
    patch = {
        "router": {
            "image": "example.com/my-router:1",
            "command": ["my-router", "serve"],
            "args": ["--listen", ":8000"],
        }
    }
    objs = render_children(router_pdd("vllm", patch), RenderContext())
    container = find(objs, "Deployment", "llama-router")["spec"]["template"]["spec"]["containers"][
        0
    ]
    assert container["image"] == "example.com/my-router:1"
    assert (container["command"], container["args"]) == (
        ["my-router", "serve"],
        ["--listen", ":8000"],
    )
    # Its probes and metrics are its own business (a podTemplate can add them).
    assert "readinessProbe" not in container and "livenessProbe" not in container
    assert [p["name"] for p in container["ports"]] == ["http"]


def test_a_custom_engine_runs_the_users_router_image_as_is() -> None:
    pdd = make_pdd(
        {
            "engine": {"type": "custom", "image": "example.com/engine:1"},
            "router": {"image": "example.com/my-router:1", "args": ["--pd"]},
            "kvTransfer": {"metadataExchange": {"mode": "sidecar"}},
        }
    )
    container = router_container(pdd)
    assert "command" not in container  # the image's entrypoint
    assert container["args"] == ["--pd"]


def test_user_args_follow_the_engines_router_flags() -> None:
    container = router_container(
        router_pdd("sglang", {"router": {"args": ["--log-level", "debug"]}})
    )
    assert container["args"][-2:] == ["--log-level", "debug"]
    assert container["args"][0] == "launch"


def test_engine_pods_carry_what_their_router_reads() -> None:
    sglang = render_children(
        router_pdd("sglang", {"kvTransfer": {"bootstrapPort": 9123}}), RenderContext()
    )
    prefill = find(sglang, "StatefulSet", "llama-prefill")["spec"]["template"]["metadata"]
    decode = find(sglang, "StatefulSet", "llama-decode")["spec"]["template"]["metadata"]
    assert prefill["annotations"][BOOTSTRAP_PORT_ANNOTATION] == "9123"
    assert BOOTSTRAP_PORT_ANNOTATION not in decode["annotations"]  # no bootstrap server there
    vllm = render_children(router_pdd("vllm"), RenderContext())
    for role in ("prefill", "decode"):
        meta = find(vllm, "StatefulSet", f"llama-{role}")["spec"]["template"]["metadata"]
        assert meta["annotations"][SMG_KV_CONNECTOR_ANNOTATION] == "NixlConnector"


def test_the_pins_agree_fixtures_dev_dependencies_constraints_and_image() -> None:
    """The versions whose help is recorded are the ones tests install and the image ships."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    dev = pyproject["project"]["optional-dependencies"]["dev"]
    constraints = (ROOT / "hack" / "constraints.txt").read_text().splitlines()
    dockerfile = (ROOT / "Dockerfile").read_text()
    for package, version, _, fixture in ROUTERS.values():
        pin = f"{package}=={version}"
        assert pin in dev
        assert pin in constraints
        assert pin in dockerfile
        assert (FIXTURES / fixture).is_file()
    assert f"pdd-router:{pyproject['project']['version']}" in DEFAULT_ROUTER_IMAGE


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_an_autoscaled_router_stays_ready_with_no_engine_pod_and_a_scale_step_keeps_it(
    engine: str,
) -> None:
    # Both upstream routers answer /readiness 503 with no workers: at zero the router would
    # leave its Service. Autoscaled, its readiness is the process serving at all.
    autoscaling = {"decode": {"minReplicas": 0, "maxReplicas": 4}, "follower": "prefill"}
    pdd = router_pdd(engine, {"autoscaling": autoscaling})
    container = router_container(pdd)
    assert container["readinessProbe"]["httpGet"]["path"] == "/liveness"
    # ... once its discovery has had time to find the workers that are there.
    assert container["readinessProbe"]["initialDelaySeconds"] >= 5
    at_zero = pdd.model_copy(
        update={
            "spec": pdd.spec.model_copy(
                update={
                    "prefill": pdd.spec.prefill.model_copy(update={"replicas": 0}),
                    "decode": pdd.spec.decode.model_copy(update={"replicas": 0}),
                }
            )
        }
    )
    assert router_container(at_zero) == container  # no router restart at a scaling step
