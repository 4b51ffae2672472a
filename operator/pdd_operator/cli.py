"""`pdd-operator`: run the operator, generate its manifests, scan a node's topology."""

from __future__ import annotations

import argparse
import logging
import os
import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] == ["topology", "scan"]:
        from pdd_operator.topology.cli import scan_main

        return scan_main(argv[2:])
    parser = argparse.ArgumentParser(prog="pdd-operator")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the operator (kopf)")
    run.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    run.add_argument("--namespace", action="append", default=[], help="watch only these")
    run.add_argument("--sidecar-image", default=os.environ.get("PDD_SIDECAR_IMAGE"))
    run.add_argument(
        "--metrics-port", type=int, default=int(os.environ.get("PDD_METRICS_PORT", "8081"))
    )
    run.add_argument(
        "--liveness", default=os.environ.get("PDD_LIVENESS", "http://0.0.0.0:8080/healthz")
    )
    run.add_argument(
        "--resync-seconds", type=float, default=float(os.environ.get("PDD_RESYNC_SECONDS", "300"))
    )
    run.add_argument(
        "--peering",
        default=os.environ.get("PDD_PEERING", ""),
        help="kopf peering name (one active replica); empty: standalone",
    )
    run.add_argument("--verbose", action="store_true")
    gen = sub.add_parser("generate", help="write the generated files (CRDs, chart CRDs, docs)")
    gen.add_argument("--root", default=".")
    gen.add_argument("--check", action="store_true", help="fail when a generated file drifted")
    sub.add_parser("topology", help="topology scan --sysfs-root DIR --procfs-root DIR")
    args = parser.parse_args(argv)
    if args.command == "run":
        return _run(args)
    if args.command == "generate":
        from pdd_operator.generate import generate_all

        return generate_all(args.root, check=args.check)
    parser.error("use: pdd-operator topology scan --sysfs-root DIR --procfs-root DIR")
    return 2


def _run(args: argparse.Namespace) -> int:
    os.environ["PDD_RESYNC_SECONDS"] = str(args.resync_seconds)
    os.environ["PDD_METRICS_PORT"] = str(args.metrics_port)
    if args.sidecar_image:
        os.environ["PDD_SIDECAR_IMAGE"] = args.sidecar_image
    if args.kubeconfig:
        os.environ["PDD_KUBECONFIG"] = args.kubeconfig
        os.environ["KUBECONFIG"] = args.kubeconfig
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        # kopf logs "Handler 'on_pod' succeeded." for every watch event: thousands of lines a
        # minute on a busy cluster. Its warnings and handler failures still get through.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    # Imported only now: the kubernetes client reads KUBECONFIG when it is first imported.
    import kopf

    import pdd_operator.handlers.operator  # noqa: F401  (registers the handlers)

    kopf.run(
        standalone=not args.peering,
        peering_name=args.peering or None,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=args.liveness or None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
