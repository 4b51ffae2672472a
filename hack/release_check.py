"""Refuse a release whose versions disagree.

One release is one version, written in several places: the Python package
(pyproject.toml), the chart (Chart.yaml `version` and `appVersion`), the images' OCI label
(Dockerfile), every default image reference the operator, its CRDs, the chart, the rendered
manifests, the examples and the docs carry (`ghcr.io/pdd-dev/pdd-<operator|sidecar|router>:TAG`),
and the git tag being released (`v<version>`). The release workflow runs this before it
builds anything; `make test` runs it on the tree (tests/unit/test_release_check.py).

    python hack/release_check.py              # the tree agrees with itself
    python hack/release_check.py --tag v0.2.0 # ... and with the tag being released
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The images a release publishes (Dockerfile targets operator, sidecar, router).
RELEASED_IMAGES = ("pdd-operator", "pdd-sidecar", "pdd-router")
IMAGE_REFERENCE = re.compile(
    r"ghcr\.io/pdd-dev/(?P<image>" + "|".join(RELEASED_IMAGES) + r"):(?P<tag>[A-Za-z0-9._-]+)"
)
# What ships or tells users what to pull; tests/ pins tags of its own on purpose.
SHIPPED = ("operator", "crds", "charts", "manifests", "examples", "docs", "README.md", "Dockerfile")
SHIPPED_SUFFIXES = {".py", ".yaml", ".yml", ".md", ".json", ".tpl", ".txt", ""}
DOCKERFILE_VERSION = re.compile(r'org\.opencontainers\.image\.version="(?P<version>[^"]+)"')
CHART_FIELD = re.compile(r'^(?P<key>version|appVersion):\s*"?(?P<value>[^"\s]+)"?\s*$', re.M)


@dataclass(frozen=True)
class Reference:
    """One image reference with a tag, where it stands."""

    path: str
    line: int
    image: str
    tag: str


def project_version(root: Path) -> str:
    with (root / "pyproject.toml").open("rb") as f:
        return str(tomllib.load(f)["project"]["version"])


def chart_fields(root: Path) -> dict[str, str]:
    text = (root / "charts" / "pdd-operator" / "Chart.yaml").read_text()
    return {m["key"]: m["value"] for m in CHART_FIELD.finditer(text)}


def dockerfile_versions(root: Path) -> list[str]:
    return [m["version"] for m in DOCKERFILE_VERSION.finditer((root / "Dockerfile").read_text())]


def shipped_files(root: Path) -> list[Path]:
    found: list[Path] = []
    for entry in SHIPPED:
        path = root / entry
        candidates = sorted(path.rglob("*")) if path.is_dir() else [path]
        found += [p for p in candidates if p.is_file() and p.suffix in SHIPPED_SUFFIXES]
    return [p for p in found if "__pycache__" not in p.parts]


def image_references(root: Path) -> list[Reference]:
    references = []
    for path in shipped_files(root):
        text = path.read_text(errors="replace")
        for number, line in enumerate(text.splitlines(), start=1):
            for match in IMAGE_REFERENCE.finditer(line):
                relative = str(path.relative_to(root))
                references.append(Reference(relative, number, match["image"], match["tag"]))
    return references


def disagreements(root: Path, tag: str | None = None) -> list[str]:
    """Every place whose version is not the package's, each as a line that says where."""
    version = project_version(root)
    problems = []
    if tag is not None and tag != f"v{version}":
        problems.append(f"the tag {tag} is not v{version} (pyproject.toml's version)")
    for key, value in sorted(chart_fields(root).items()):
        if value != version:
            problems.append(f"charts/pdd-operator/Chart.yaml: {key} {value}, not {version}")
    for found in dockerfile_versions(root) or ["(none)"]:
        if found != version:
            problems.append(f"Dockerfile: org.opencontainers.image.version {found}, not {version}")
    for ref in image_references(root):
        if ref.tag != version:
            problems.append(f"{ref.path}:{ref.line}: {ref.image}:{ref.tag}, not :{version}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tag", help="the git tag being released, e.g. v0.2.0")
    parser.add_argument("--root", type=Path, default=ROOT)
    args = parser.parse_args(argv)
    problems = disagreements(args.root, args.tag)
    version = project_version(args.root)
    if problems:
        print(f"release check: {len(problems)} place(s) disagree with {version}:")
        print("\n".join(f"  {p}" for p in problems))
        print("Bump them together (pyproject.toml, Chart.yaml, Dockerfile, the default images),")
        print("then `make generate` for crds/, the chart's CRDs, manifests/ and docs/api.md.")
        return 1
    count = len(image_references(args.root))
    print(
        f"release check: {version} everywhere (pyproject.toml, Chart.yaml version and "
        f"appVersion, Dockerfile, {count} image references)"
        + (f", tag {args.tag}" if args.tag else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
