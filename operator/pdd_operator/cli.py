"""`pdd-operator`: run the operator, generate its manifests."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

from pdd_operator.config import ConfigError, OperatorConfig, add_arguments


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "run":
        try:
            config = OperatorConfig.from_sources(vars(args), os.environ)
        except ConfigError as err:
            parser.error(str(err))
        return _run(config)
    if args.command == "generate":
        from pdd_operator.generate import generate_all

        return generate_all(args.root, check=args.check)
    if args.command == "render":
        return _render(args.file, args.nodes)
    parser.error(f"unknown command {args.command}")
    return 2


def run_config(argv: list[str], env: Mapping[str, str]) -> OperatorConfig:
    """The configuration `pdd-operator run ARGV` starts with, given these variables."""
    args = _parser().parse_args(["run", *argv])
    return OperatorConfig.from_sources(vars(args), env)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pdd-operator")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="run the operator (kopf)",
        description="Each option can also be set by its environment variable; a flag wins.",
    )
    add_arguments(run)
    gen = sub.add_parser("generate", help="write the generated files (CRDs, chart CRDs, docs)")
    gen.add_argument("--root", default=".")
    gen.add_argument("--check", action="store_true", help="fail when a generated file drifted")
    render = sub.add_parser(
        "render",
        help="print every child the operator would create for a PDDeployment (no cluster)",
        description="Plan and render as the operator does, and print the children as YAML.",
    )
    render.add_argument("-f", "--file", action="append", required=True, help="YAML file or -")
    render.add_argument("--nodes", help="the cluster's Nodes (kubectl get nodes -o yaml)")
    return parser


def _render(files: list[str], nodes_file: str | None) -> int:
    import yaml

    from pdd_operator import manifest_yaml
    from pdd_operator.offline import RenderError, render_documents

    try:
        documents = [doc for path in files for doc in _yaml_documents(path)]
        nodes = _yaml_documents(nodes_file) if nodes_file else None
        rendered = render_documents(documents, nodes)
    except (OSError, yaml.YAMLError, RenderError) as err:
        print(f"pdd-operator render: {err}", file=sys.stderr)
        return 2
    for item in rendered:
        sys.stdout.write(f"# PDDeployment {item.name}: placement {item.placement}\n")
        sys.stdout.write(
            manifest_yaml.dump_all(item.children, explicit_start=True, sort_keys=False)
        )
    return 0


def _yaml_documents(path: str) -> list[Any]:
    import yaml

    text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()  # noqa: SIM115
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def _run(config: OperatorConfig) -> int:
    logging.basicConfig(
        level=logging.DEBUG if config.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not config.verbose:
        # kopf logs "Handler 'on_pod' succeeded." for every watch event: thousands of lines a
        # minute on a busy cluster. Its warnings and handler failures still get through.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    _collect_cycles_less_often()
    # Imported only now: `generate` and `topology scan` need neither kopf nor the handlers.
    # Before the election, so that a standby that takes over has nothing left to import.
    import kopf

    import pdd_operator.handlers.operator  # noqa: F401  (registers the handlers)
    from pdd_operator.leadership import elect
    from pdd_operator.metrics import OperatorMetrics

    metrics = OperatorMetrics()
    if config.metrics_port:  # a standby's too: its Service and scrapes see every replica
        metrics.serve(config.metrics_port)
    leader = elect(config, metrics)
    try:
        kopf.run(
            # The Lease elects the one replica that runs kopf (leadership.py), so kopf's own
            # peering is off.
            standalone=True,
            clusterwide=not config.namespaces,
            namespaces=config.namespaces,
            liveness_endpoint=config.liveness or None,
            # The process-wide memo: the startup handler finds these here.
            memo=kopf.Memo(config=config, metrics=metrics, fence=leader.fence if leader else None),
        )
    finally:
        if leader is not None:  # kopf has stopped and its API threads are done
            leader.release()
    return 0


def _collect_cycles_less_often() -> None:
    """Python's cycle collector runs after every 700 new container objects by default, and
    every JSON object the informers decode is one: a page of 500 pods makes hundreds of
    thousands, and each full collection walks everything the operator keeps. On the lists of
    a restart at 1,000 deployments that was about half the operator's CPU (bench/list_cost.py,
    docs/benchmarks-operator.md). Cycles (asyncio's, exceptions') are still collected, less
    often."""
    gc.set_threshold(10_000, 10, 10)


if __name__ == "__main__":
    sys.exit(main())
