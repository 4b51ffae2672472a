"""The operator's configuration: defaults, variables, flags, and which one wins."""

from __future__ import annotations

import os
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from pdd_operator.cli import main, run_config
from pdd_operator.config import ConfigError, OperatorConfig, options
from pdd_operator.rendering.context import OperatorSettings

INSTALL_DOC = Path(__file__).resolve().parents[2] / "docs" / "install.md"

DEFAULTS = {
    "kubeconfig": None,
    "namespaces": (),
    "sidecar_image": OperatorSettings().sidecar_image,
    "router_image": OperatorSettings().router_image,
    "image_pull_secrets": (),
    "metrics_scraper_namespaces": (),
    "metrics_scraper_pod_labels": (),
    "metrics_port": 8081,
    "liveness": "http://0.0.0.0:8080/healthz",
    "resync_seconds": 300.0,
    "leader_election_lease": "",
    "leader_election_namespace": "",
    "verbose": False,
    "worker_limit": 0,
    "max_concurrent_passes": 64,
    "coalesce_seconds": 1.0,
    "coalesce_max_seconds": 3.0,
    "name_guard_policy": "",
}

# option -> (its variable's value, what it becomes, a flag for it, what the flag becomes)
SOURCES: dict[str, tuple[str, Any, list[str], Any]] = {
    "kubeconfig": ("/env/kubeconfig", "/env/kubeconfig", ["--kubeconfig", "/f"], "/f"),
    "namespaces": ("team-a, team-b", ("team-a", "team-b"), ["--namespace", "c"], ("c",)),
    "sidecar_image": ("r.example/s:1", "r.example/s:1", ["--sidecar-image", "x:2"], "x:2"),
    "router_image": ("r.example/r:1", "r.example/r:1", ["--router-image", "m/r:2"], "m/r:2"),
    "image_pull_secrets": ("a, b.c", ("a", "b.c"), ["--image-pull-secret", "d"], ("d",)),
    "metrics_scraper_namespaces": (
        "monitoring, obs",
        ("monitoring", "obs"),
        ["--metrics-scraper-namespace", "prom"],
        ("prom",),
    ),
    "metrics_scraper_pod_labels": (
        "app.kubernetes.io/name=prometheus, team=obs",
        (("app.kubernetes.io/name", "prometheus"), ("team", "obs")),
        ["--metrics-scraper-pod-label", "app=prom"],
        (("app", "prom"),),
    ),
    "metrics_port": ("9090", 9090, ["--metrics-port", "0"], 0),
    "liveness": ("", "", ["--liveness", "http://127.0.0.1:1/h"], "http://127.0.0.1:1/h"),
    "resync_seconds": ("60", 60.0, ["--resync-seconds", "2.5"], 2.5),
    "leader_election_lease": ("pdd", "pdd", ["--leader-election-lease", "x"], "x"),
    "leader_election_namespace": ("ns", "ns", ["--leader-election-namespace", "o"], "o"),
    "verbose": ("true", True, ["--verbose"], True),
    "worker_limit": ("8", 8, ["--worker-limit", "16"], 16),
    "max_concurrent_passes": ("4", 4, ["--max-concurrent-passes", "128"], 128),
    "coalesce_seconds": ("0", 0.0, ["--coalesce-seconds", "2"], 2.0),
    "coalesce_max_seconds": ("3", 3.0, ["--coalesce-max-seconds", "0.5"], 0.5),
    "name_guard_policy": ("a", "a", ["--name-guard-policy", "pdd-child-names"], "pdd-child-names"),
}


def test_every_option_is_tested() -> None:
    names = [f.name for f in fields(OperatorConfig)]
    assert names == list(DEFAULTS) == list(SOURCES)


def test_defaults_without_flags_or_variables() -> None:
    config = run_config([], {})
    assert config == OperatorConfig()
    assert {f.name: getattr(config, f.name) for f in fields(config)} == DEFAULTS


@pytest.mark.parametrize("name", list(SOURCES))
def test_a_variable_sets_its_option(name: str) -> None:
    option = next(o for o in options() if o.name == name)
    value, expected, _, _ = SOURCES[name]
    config = run_config([], {option.env: value})
    assert getattr(config, name) == expected
    assert config == OperatorConfig(**{name: expected})  # and nothing else


@pytest.mark.parametrize("name", list(SOURCES))
def test_a_flag_wins_over_its_variable(name: str) -> None:
    option = next(o for o in options() if o.name == name)
    value, _, flag, from_flag = SOURCES[name]
    assert from_flag != DEFAULTS[name]
    assert getattr(run_config(flag, {option.env: value}), name) == from_flag
    assert getattr(run_config(flag, {}), name) == from_flag


def test_variables_of_other_programs_are_not_read() -> None:
    # PDD_RESYNC_SECONDS of the sidecar is the same name: the operator reads its own only in
    # its own container, so an unrelated variable changes nothing.
    assert run_config([], {"PDD_SIDECAR_PORT": "1", "HOME": "/root"}) == OperatorConfig()


def test_an_empty_kubeconfig_variable_means_none() -> None:
    assert run_config([], {"KUBECONFIG": ""}).kubeconfig is None


def test_the_namespace_flag_repeats() -> None:
    config = run_config(["--namespace", "a", "--namespace", "b"], {"PDD_NAMESPACES": "c"})
    assert config.namespaces == ("a", "b")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PDD_METRICS_PORT": "http"}, "PDD_METRICS_PORT: 'http' is not a whole number"),
        ({"PDD_METRICS_PORT": "70000"}, r"PDD_METRICS_PORT: 70000 is out of range \(0..65535\)"),
        ({"PDD_RESYNC_SECONDS": "0"}, "PDD_RESYNC_SECONDS: 0 must be above 0"),
        ({"PDD_RESYNC_SECONDS": "nan"}, "PDD_RESYNC_SECONDS: 'nan' is not a finite number"),
        ({"PDD_COALESCE_SECONDS": "-1"}, "PDD_COALESCE_SECONDS: -1 must be at least 0"),
        ({"PDD_MAX_CONCURRENT_PASSES": "0"}, "PDD_MAX_CONCURRENT_PASSES: 0 is out of range"),
        ({"PDD_VERBOSE": "maybe"}, "PDD_VERBOSE: 'maybe' is not true or false"),
        ({"PDD_IMAGE_PULL_SECRETS": "ok,Reg_Cred"}, "PDD_IMAGE_PULL_SECRETS: 'Reg_Cred' is not"),
        (
            {"PDD_METRICS_SCRAPER_NAMESPACES": "monitoring,Prom.NS"},
            "PDD_METRICS_SCRAPER_NAMESPACES: 'Prom.NS' is not a namespace name",
        ),
        (
            {"PDD_METRICS_SCRAPER_POD_LABELS": "app"},
            "PDD_METRICS_SCRAPER_POD_LABELS: 'app' is not a label key=value",
        ),
    ],
)
def test_a_bad_variable_is_refused_with_its_name(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        run_config([], env)


def test_a_repeated_flag_is_checked_like_its_variable() -> None:
    with pytest.raises(ConfigError, match="--image-pull-secret: 'Reg_Cred' is not a Secret"):
        run_config(["--image-pull-secret", "ok", "--image-pull-secret", "Reg_Cred"], {})


def test_a_bad_variable_under_a_good_flag_is_never_read() -> None:
    assert run_config(["--metrics-port", "1"], {"PDD_METRICS_PORT": "x"}).metrics_port == 1


def test_bad_values_stop_the_command_with_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as flag_exit:
        main(["run", "--metrics-port", "-1"])
    assert flag_exit.value.code == 2
    assert "--metrics-port: -1 is out of range (0..65535)" in capsys.readouterr().err
    monkeypatch.setenv("PDD_WORKER_LIMIT", "lots")
    with pytest.raises(SystemExit) as env_exit:
        main(["run"])
    assert env_exit.value.code == 2
    assert "PDD_WORKER_LIMIT: 'lots' is not a whole number" in capsys.readouterr().err


def test_building_the_configuration_writes_no_variable() -> None:
    before = dict(os.environ)
    run_config(["--kubeconfig", "/k", "--metrics-port", "1", "--sidecar-image", "s:1"], before)
    assert dict(os.environ) == before


def _shown(value: Any) -> str:
    if value is None or value == ():
        return "none"
    if value == "":
        return '`""`'
    if isinstance(value, bool):
        return "off"
    if isinstance(value, float):
        return f"`{value:g}`"
    return f"`{value}`"


def test_docs_list_every_option_with_its_flag_variable_and_default() -> None:
    text = INSTALL_DOC.read_text()
    rows = {
        m.group(1): (m.group(2), m.group(3))
        for m in re.finditer(r"^\| `(--[a-z-]+)` \| `([A-Z_]+)` \| ([^|]+?) \|", text, re.M)
    }
    expected = {o.flag: (o.env, _shown(o.default)) for o in options()}
    assert rows == expected
