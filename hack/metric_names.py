"""Pin the metric names the engines and routers export, for the dashboards' query check
(tests/chart/test_dashboards.py), as the engine parser fixtures pin their flags.

    hack/metric_names.py engine vllm 0.33.0 DIR   # DIR: the release's wheel, unpacked
    hack/metric_names.py routers                  # runs the pinned routers here

Engines (no GPU here): every literal `vllm:...`/`sglang:...` name in the release's Python
source, as its metrics modules register them (`pip download --no-deps vllm==X`, unzip).
Routers: vllm-router and smg as the request path runs them (tests/helpers/refengine: the
reference engine behind each, a served request and a refused one), their /metrics scraped:
each series name with its label names. Written to tests/fixtures/metrics/.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "metrics"
ENGINE_NAME = {
    "vllm": re.compile(r'"(vllm:[a-z][a-z0-9_]*)"'),
    "sglang": re.compile(r'"(sglang:[a-z][a-z0-9_]*)"'),
}
PACKAGE = {"vllm": "vllm", "sglang": "sglang"}


def engine_names(engine: str, unpacked: Path) -> list[str]:
    pattern = ENGINE_NAME[engine]
    found: set[str] = set()
    for path in (unpacked / PACKAGE[engine]).rglob("*.py"):
        found |= set(pattern.findall(path.read_text(errors="replace")))
    return sorted(found)


def write(name: str, body: dict[str, object]) -> None:
    FIXTURES.mkdir(parents=True, exist_ok=True)
    path = FIXTURES / f"{name}.json"
    path.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")
    print(f"wrote {path.relative_to(ROOT)}")


def series(text: str) -> dict[str, list[str]]:
    """Each sample's metric name with the label names it carries."""
    found: dict[str, set[str]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, rest = line.partition("{")
        name = name.split(" ")[0]
        labels = (
            set(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', rest.split("}")[0])) if rest else set()
        )
        found.setdefault(name, set()).update(labels)
    return {name: sorted(labels) for name, labels in sorted(found.items())}


def router_series() -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(ROOT / "operator"))
    from helpers.refengine import http, running
    from integration.test_refengine_routers import PROMPT, _start_pair, _start_router

    for engine, release, distribution in (
        ("vllm", "0.33.0", "vllm-router"),
        ("sglang", "0.5.23", "smg"),
    ):
        with tempfile.TemporaryDirectory() as tmp, running(Path(tmp)) as procs:
            prefill, decode, bootstrap = _start_pair(procs, engine, release)
            router = _start_router(procs, engine, prefill, decode, bootstrap)
            ok = {"model": "tiny", "prompt": PROMPT, "max_tokens": 3}
            assert http("POST", f"{router}/v1/completions", ok, timeout=60)[0] == 200
            http("POST", f"{router}/v1/completions", {**ok, "max_tokens": "x"}, timeout=60)
            decode_engine = next(p for p in procs.started if p.name == f"{engine}-decode-0")
            decode_engine.terminate()  # a request the router cannot finish: its error series
            decode_engine.wait_stopped()
            http("POST", f"{router}/v1/completions", ok, timeout=60)
            text = http("GET", procs.router_metrics[router])[1].decode()
        version = importlib.metadata.version(distribution)
        write(
            f"{distribution}-{version}",
            {
                "component": distribution,
                "version": version,
                "source": "its /metrics after a served request, a refused one and one whose "
                "decode is gone (hack/metric_names.py)",
                "series": series(text),
            },
        )


def main(argv: list[str]) -> None:
    if argv[:1] == ["engine"] and len(argv) == 4:
        engine, version, unpacked = argv[1], argv[2], Path(argv[3])
        names = engine_names(engine, unpacked)
        source = "the literal metric names in the release's Python source (hack/metric_names.py)"
        write(
            f"{engine}-{version}",
            {"component": engine, "version": version, "source": source, "names": names},
        )
    elif argv == ["routers"]:
        router_series()
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
