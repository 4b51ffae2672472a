"""The operator's configuration: one frozen object, built once at start-up.

Every option can be given as a command-line flag or as an environment variable; a flag wins
over its variable, a variable over the default. `OperatorConfig` below is the one table of
options and defaults: the `run` command's flags, the variables read, the defaults and their
checks all come from it. The result is handed to the running operator through kopf's memo;
nothing reads `os.environ` after start-up. docs/install.md lists the options.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from pdd_operator.rendering.context import OperatorSettings


class ConfigError(ValueError):
    """An option's value is unusable; the message names the flag or variable and the fix."""


@dataclass(frozen=True)
class Option:
    """One option of `pdd-operator run`, as the flag, the variable and the default."""

    name: str  # the OperatorConfig field
    flag: str
    env: str
    default: Any
    parse: Callable[[str], Any]
    help: str
    switch: bool = False  # a flag without a value (--verbose)
    repeat: bool = False  # a flag given once per value; its variable is comma-separated


def _option(
    default: Any,
    *,
    env: str,
    help: str,
    parse: Callable[[str], Any] = str,
    flag: str = "",
    switch: bool = False,
    repeat: bool = False,
) -> Any:
    spec = {
        "env": env,
        "help": help,
        "parse": parse,
        "flag": flag,
        "switch": switch,
        "repeat": repeat,
    }
    return field(default=default, metadata={"option": spec})


def _integer(text: str, low: int, high: int | None = None) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ConfigError(f"{text!r} is not a whole number") from None
    if value < low or (high is not None and value > high):
        bounds = f"{low}..{high}" if high is not None else f"at least {low}"
        raise ConfigError(f"{value} is out of range ({bounds})")
    return value


def _number(text: str, positive: bool) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ConfigError(f"{text!r} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ConfigError(f"{text!r} is not a finite number")
    if value < 0 or (positive and value == 0):
        raise ConfigError(f"{value:g} must be {'above' if positive else 'at least'} 0")
    return value


def _port(text: str) -> int:
    return _integer(text, 0, 65535)


def _count(text: str) -> int:
    return _integer(text, 0)


def _positive_count(text: str) -> int:
    return _integer(text, 1)


def _seconds(text: str) -> float:
    return _number(text, positive=True)


def _delay(text: str) -> float:
    return _number(text, positive=False)


def _optional_path(text: str) -> str | None:
    return text or None


def _flag_value(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise ConfigError(f"{text!r} is not true or false")


def _namespace_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


# A Secret's name: a DNS subdomain (lowercase alphanumerics, '-' and '.', at most 253).
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _secret_names(text: str) -> tuple[str, ...]:
    return _names(text, _SUBDOMAIN, 253, "a Secret name (lowercase letters, digits, '-' and '.')")


_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def _namespace_names(text: str) -> tuple[str, ...]:
    what = "a namespace name (lowercase letters, digits and '-', at most 63)"
    return _names(text, _LABEL, 63, what)


# A label key (an optional DNS-subdomain prefix and a name) and value, as Kubernetes takes them.
_LABEL_KEY = re.compile(
    r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


def _label_pairs(text: str) -> tuple[tuple[str, str], ...]:
    pairs = []
    for item in _namespace_list(text):
        key, sep, value = item.partition("=")
        if not sep or not _LABEL_KEY.fullmatch(key) or not _LABEL_VALUE.fullmatch(value):
            raise ConfigError(f"{item!r} is not a label key=value such as app=prometheus")
        pairs.append((key, value))
    return tuple(pairs)


def _names(text: str, pattern: re.Pattern[str], longest: int, what: str) -> tuple[str, ...]:
    """The comma-separated names in ``text``, each refused unless it is ``what``."""
    names = _namespace_list(text)
    for name in names:
        if len(name) > longest or not pattern.fullmatch(name):
            raise ConfigError(f"{name!r} is not {what}")
    return names


@dataclass(frozen=True)
class OperatorConfig:
    kubeconfig: str | None = _option(
        None,
        env="KUBECONFIG",
        parse=_optional_path,
        help="kubeconfig file; unset: the pod's ServiceAccount, else ~/.kube/config",
    )
    namespaces: tuple[str, ...] = _option(
        (),
        env="PDD_NAMESPACES",
        flag="--namespace",
        parse=_namespace_list,
        repeat=True,
        help="reconcile only these namespaces (the flag once per namespace, the variable "
        "comma-separated); none: all namespaces",
    )
    sidecar_image: str = _option(
        OperatorSettings.sidecar_image,
        env="PDD_SIDECAR_IMAGE",
        help="image of the preflight init container and the NIXL sidecar in rendered pods",
    )
    router_image: str = _option(
        OperatorSettings.router_image,
        env="PDD_ROUTER_IMAGE",
        help="the router image of a PDDeployment whose spec.router.image is the default "
        f"({OperatorSettings.router_image}): a private registry's copy of it",
    )
    image_pull_secrets: tuple[str, ...] = _option(
        (),
        env="PDD_IMAGE_PULL_SECRETS",
        flag="--image-pull-secret",
        parse=_secret_names,
        repeat=True,
        help="Secrets every rendered pod pulls its images with (the flag once per Secret, the "
        "variable comma-separated); each must exist in the PDDeployment's namespace",
    )
    metrics_scraper_namespaces: tuple[str, ...] = _option(
        (),
        env="PDD_METRICS_SCRAPER_NAMESPACES",
        flag="--metrics-scraper-namespace",
        parse=_namespace_names,
        repeat=True,
        help="namespaces whose pods may scrape the engines' and routers' /metrics through "
        "the NetworkPolicies the operator renders (where Prometheus runs; the flag once per "
        "namespace, the variable comma-separated); none: no scraper is admitted",
    )
    metrics_scraper_pod_labels: tuple[tuple[str, str], ...] = _option(
        (),
        env="PDD_METRICS_SCRAPER_POD_LABELS",
        flag="--metrics-scraper-pod-label",
        parse=_label_pairs,
        repeat=True,
        help="key=value labels the scraper's pods carry (e.g. app.kubernetes.io/name="
        "prometheus): only those pods of the metrics-scraper namespaces are admitted (the "
        "flag once per label, the variable comma-separated); none: every pod there",
    )
    metrics_port: int = _option(
        8081,
        env="PDD_METRICS_PORT",
        parse=_port,
        help="port of the Prometheus metrics (pdd_operator_*); 0: no metrics server",
    )
    liveness: str = _option(
        "http://0.0.0.0:8080/healthz",
        env="PDD_LIVENESS",
        help="kopf's liveness endpoint; empty: none",
    )
    resync_seconds: float = _option(
        300.0,
        env="PDD_RESYNC_SECONDS",
        parse=_seconds,
        help="period of the level-triggered resync of every PDDeployment",
    )
    leader_election_lease: str = _option(
        "",
        env="PDD_LEADER_ELECTION_LEASE",
        help="the coordination.k8s.io Lease that elects the one replica that reconciles; the "
        "others wait as standbys and take over when it goes; empty: no election (run one "
        "replica only)",
    )
    leader_election_namespace: str = _option(
        "",
        env="PDD_LEADER_ELECTION_NAMESPACE",
        help="the namespace of that Lease; empty: the pod's own, else default",
    )
    verbose: bool = _option(
        False,
        env="PDD_VERBOSE",
        parse=_flag_value,
        switch=True,
        help="debug logging, with kopf's line per handled event",
    )
    worker_limit: int = _option(
        0,
        env="PDD_WORKER_LIMIT",
        parse=_count,
        help="kopf's workers, one per PDDeployment handled at once; 0: unlimited",
    )
    max_concurrent_passes: int = _option(
        64,
        env="PDD_MAX_CONCURRENT_PASSES",
        parse=_positive_count,
        help="reconcile passes in flight at once",
    )
    # A deployment's pods are created, bound, started and made ready one after another over
    # seconds; a pass per step cost a pass per tenth of a second at 0.3 s, and with the cores
    # busy, the extra passes made the whole fleet Ready later (docs/benchmarks-operator.md).
    coalesce_seconds: float = _option(
        1.0,
        env="PDD_COALESCE_SECONDS",
        parse=_delay,
        help="a pass triggered by child or pod events waits until none came for this long, so "
        "that one pass answers a burst of them",
    )
    coalesce_max_seconds: float = _option(
        3.0,
        env="PDD_COALESCE_MAX_SECONDS",
        parse=_delay,
        help="the longest such a pass waits after the burst's first event",
    )
    name_guard_policy: str = _option(
        "",
        env="PDD_NAME_GUARD_POLICY",
        help="the ValidatingAdmissionPolicy (and binding of the same name) that refuses to make "
        "an existing object a PDDeployment's child, as the chart installs it; while it is in "
        "force a new child's name is not looked up before the apply; empty: look up each",
    )

    @classmethod
    def from_sources(cls, flags: Mapping[str, Any], env: Mapping[str, str]) -> OperatorConfig:
        """Flags (parsed by `add_arguments`; None: not given) over variables over defaults."""
        values: dict[str, Any] = {}
        for option in options():
            given = flags.get(option.name)
            if given is not None:
                values[option.name] = _repeated(option, given) if option.repeat else given
            elif option.env in env:
                try:
                    values[option.name] = option.parse(env[option.env])
                except ConfigError as err:
                    raise ConfigError(f"{option.env}: {err}") from None
        return cls(**values)


def _repeated(option: Option, given: list[str]) -> Any:
    """A flag given once per value, checked as its comma-separated variable would be."""
    try:
        return option.parse(",".join(given))
    except ConfigError as err:
        raise ConfigError(f"{option.flag}: {err}") from None


def options() -> tuple[Option, ...]:
    """The options in declaration order."""
    result = []
    for f in fields(OperatorConfig):
        spec = f.metadata["option"]
        result.append(
            Option(
                name=f.name,
                flag=spec["flag"] or "--" + f.name.replace("_", "-"),
                env=spec["env"],
                default=f.default,
                parse=spec["parse"],
                help=spec["help"],
                switch=spec["switch"],
                repeat=spec["repeat"],
            )
        )
    return tuple(result)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of every option, each defaulting to None (not given) so that `from_sources`
    can tell a flag from its variable."""
    for option in options():
        help_text = f"{option.help} (env {option.env})"
        if option.switch:
            parser.add_argument(
                option.flag, dest=option.name, action="store_const", const=True, help=help_text
            )
        else:
            parser.add_argument(
                option.flag,
                dest=option.name,
                action="append" if option.repeat else "store",
                type=str if option.repeat else _for_argparse(option.parse),
                help=help_text,
            )


def _for_argparse(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ConfigError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    return convert
