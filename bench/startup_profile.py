"""Profile the operator's start-up on the bench fleet (py-spy), the gap `make bench` reports as
"operator ready ... s after start".

    .venv/bin/python bench/startup_profile.py [--scale full|small] [--seconds 45]

Starts the control plane from the bench's fleet snapshot (as `make bench` does), starts the
operator with its shipped settings, records it with py-spy for `--seconds`, and writes
bench/results/<scale>/startup_profile.json (summary by frame) next to the raw profile under
bench/results/raw/<scale>/.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(REPO / "operator"), str(BENCH), str(REPO / "tests")]

from kubernetes import config as kconfig  # noqa: E402
from pddbench.analysis import summarize_profile  # noqa: E402
from pddbench.cluster import BenchCluster  # noqa: E402
from pddbench.scale import OPERATOR_USER  # noqa: E402

from helpers.operator_proc import OperatorProcess, install_crd  # noqa: E402


def main() -> int:
    from run import SCALES  # bench/run.py: the fleets

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--scale", choices=sorted(SCALES), default="full")
    ap.add_argument("--seconds", type=int, default=45)
    args = ap.parse_args()
    fleet = SCALES[args.scale]["fleet"]
    raw_dir = BENCH / "results" / "raw" / args.scale
    raw_dir.mkdir(parents=True, exist_ok=True)
    raw = raw_dir / "startup-profile.txt"
    with BenchCluster(REPO / ".tmp" / "bench", fleet, controller_qps=400, log=print) as cl:
        assert cl.cp is not None
        admin = kconfig.new_client_from_config(config_file=str(cl.cp.kubeconfig))
        install_crd(admin)
        admin.close()
        t0 = time.monotonic()
        op = OperatorProcess(
            cl.kubeconfig_for(OPERATOR_USER), raw_dir / "startup-profile-operator.log", 300.0
        ).start()
        assert op.proc is not None
        spy = [str(REPO / ".venv" / "bin" / "py-spy"), "record", "--pid", str(op.proc.pid)]
        spy += ["--rate", "50", "--format", "raw", "-o", str(raw), "--duration", str(args.seconds)]
        subprocess.run(spy, check=True)
        op.kill()
    summary = {
        "command": " ".join([".venv/bin/python", "bench/startup_profile.py", *sys.argv[1:]]),
        "nodes": fleet.nodes,
        "seconds_from_operator_start": round(time.monotonic() - t0, 1),
        **summarize_profile(raw.read_text(), top=30),
    }
    out = BENCH / "results" / args.scale / "startup_profile.json"
    out.write_text(json.dumps(summary, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
