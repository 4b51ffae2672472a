"""`pdd-operator`: run the operator, generate its manifests."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping

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
    return parser


def _run(config: OperatorConfig) -> int:
    logging.basicConfig(
        level=logging.DEBUG if config.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not config.verbose:
        # kopf logs "Handler 'on_pod' succeeded." for every watch event: thousands of lines a
        # minute on a busy cluster. Its warnings and handler failures still get through.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    # Imported only now: `generate` and `topology scan` need neither kopf nor the handlers.
    import kopf

    import pdd_operator.handlers.operator  # noqa: F401  (registers the handlers)

    kopf.run(
        standalone=not config.peering,
        peering_name=config.peering or None,
        clusterwide=not config.namespaces,
        namespaces=config.namespaces,
        liveness_endpoint=config.liveness or None,
        # The process-wide memo: the startup handler finds the configuration here.
        memo=kopf.Memo(config=config),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
