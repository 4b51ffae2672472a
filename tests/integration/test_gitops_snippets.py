"""docs/gitops.md's manifests, as a user copies them, accepted by the API server they go to.

Every document of every ```yaml block is applied with the real kubectl, `apply --dry-run=server
--validate=strict`, after the CRDs of the kinds it names are installed: Argo CD's and Flux's own
(hack/fetch-cd-crds.sh takes them from those projects' Go modules), ours for a PDDeployment.
Strict field validation refuses an unknown field and the CRD's structural schema a wrong type,
so a misspelt or misplaced field fails here instead of at the reader's first sync.

The CD tools' CRDs are deleted when the module ends: the control plane is shared.
"""

from __future__ import annotations

import copy
import re
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from helpers.operator_proc import install_crd
from pdd_localcluster import LocalControlPlane
from pdd_localcluster.controlplane import resolve_bin_dir
from pdd_operator.api import v1alpha1 as api

ROOT = Path(__file__).resolve().parents[2]
GITOPS = ROOT / "docs" / "gitops.md"
FETCH_CD_CRDS = ROOT / "hack" / "fetch-cd-crds.sh"
FENCE = re.compile(r"^```(\S*)\s*$")
MANIFEST_KEY = re.compile(r"^(apiVersion|kind):", re.MULTILINE)
# API groups whose schemas come from the CD tools' CRDs (Argo CD's and Flux's).
CD_GROUP_SUFFIXES = ("argoproj.io", "fluxcd.io")
Kubectl = Callable[..., subprocess.CompletedProcess[str]]


@dataclass(frozen=True)
class FencedBlock:
    line: int  # of the block's first line (after the fence) in the markdown
    info: str
    body: str


@dataclass(frozen=True)
class Snippet:
    line: int  # of the document's first line in docs/gitops.md
    text: str

    @property
    def obj(self) -> dict[str, Any]:
        obj: dict[str, Any] = yaml.safe_load(self.text)
        return obj

    @property
    def group_version(self) -> tuple[str, str]:
        group, _, version = self.obj["apiVersion"].rpartition("/")
        return group, version

    @property
    def is_cd_kind(self) -> bool:
        return self.group_version[0].endswith(CD_GROUP_SUFFIXES)

    @property
    def id(self) -> str:
        return f"L{self.line}-{self.obj['kind']}/{self.obj['metadata']['name']}"


def fenced_blocks(markdown: str) -> list[FencedBlock]:
    blocks, opened, body = [], None, []
    for number, line in enumerate(markdown.splitlines(), start=1):
        fence = FENCE.match(line)
        if opened is None and fence:
            opened, body = (number + 1, fence.group(1)), []
        elif opened is not None and line == "```":
            blocks.append(FencedBlock(opened[0], opened[1], "\n".join(body) + "\n"))
            opened = None
        elif opened is not None:
            body.append(line)
    return blocks


def documents(block: FencedBlock) -> list[Snippet]:
    """The block's YAML documents, each with the line it starts on."""
    snippets, start, lines = [], block.line, []
    for offset, line in enumerate(block.body.splitlines()):
        if line.strip() == "---":
            snippets.append(Snippet(start, "\n".join(lines) + "\n"))
            start, lines = block.line + offset + 1, []
        else:
            lines.append(line)
    snippets.append(Snippet(start, "\n".join(lines) + "\n"))
    return [s for s in snippets if s.obj is not None]


YAML_BLOCKS = [b for b in fenced_blocks(GITOPS.read_text()) if b.info == "yaml"]
SNIPPETS = [s for block in YAML_BLOCKS for s in documents(block)]


@pytest.fixture(scope="module")
def kubectl(control_plane: LocalControlPlane) -> Kubectl:
    binary = resolve_bin_dir() / "kubectl"

    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        argv = [str(binary), "--kubeconfig", str(control_plane.kubeconfig), *args]
        return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=120)

    return run


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"kubectl {' '.join(result.args[3:])}: {result.stderr.strip()}"
    return result.stdout


@dataclass(frozen=True)
class UpstreamCRD:
    path: Path
    crd: dict[str, Any]

    @property
    def served_versions(self) -> list[str]:
        return [v["name"] for v in self.crd["spec"]["versions"] if v.get("served")]


@pytest.fixture(scope="module")
def cd_crds() -> dict[tuple[str, str], UpstreamCRD]:
    """Argo CD's and Flux's CRDs at the versions hack/fetch-cd-crds.sh pins, by (group, kind)."""
    fetched = subprocess.run(
        ["bash", str(FETCH_CD_CRDS)], capture_output=True, text=True, timeout=900
    )
    assert fetched.returncode == 0, f"{FETCH_CD_CRDS.name}: {fetched.stderr.strip()}"
    directory = Path(fetched.stdout.strip().splitlines()[-1])
    by_kind = {}
    for path in sorted(directory.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        by_kind[crd["spec"]["group"], crd["spec"]["names"]["kind"]] = UpstreamCRD(path, crd)
    return by_kind


def _upstream_crd_of(
    snippet: Snippet, cd_crds: dict[tuple[str, str], UpstreamCRD]
) -> UpstreamCRD | None:
    return cd_crds.get((snippet.group_version[0], snippet.obj["kind"]))


@pytest.fixture(scope="module")
def snippet_apis(
    kubectl: Kubectl, api_client: client.ApiClient, cd_crds: dict[tuple[str, str], UpstreamCRD]
) -> Iterator[None]:
    """The CRDs and namespaces the snippets need, installed; the CD tools' CRDs and the
    namespaces made here removed afterwards, so other modules see the plane they expect."""
    if any(s.group_version[0] == api.GROUP for s in SNIPPETS):
        install_crd(api_client)
    needed = {crd.path: crd for s in SNIPPETS if (crd := _upstream_crd_of(s, cd_crds))}
    names = [crd.crd["metadata"]["name"] for crd in needed.values()]
    made = _create_missing_namespaces(
        api_client, {s.obj["metadata"].get("namespace") for s in SNIPPETS}
    )
    try:
        for path in needed:
            # Server-side: Argo CD's Application CRD is larger than the annotation that
            # client-side apply would copy it into.
            _ok(kubectl("apply", "--server-side", "-f", str(path)))
        _ok(
            kubectl(
                "wait", "--for=condition=Established", "--timeout=60s", *[f"crd/{n}" for n in names]
            )
        )
        yield
    finally:
        if names:
            _ok(kubectl("delete", "crd", "--timeout=60s", *names))
        if made:
            kubectl("delete", "namespace", "--wait=false", *made)


def _create_missing_namespaces(api_client: client.ApiClient, wanted: set[str | None]) -> list[str]:
    core = client.CoreV1Api(api_client)
    made = []
    for name in sorted(n for n in wanted if n):
        try:
            core.create_namespace({"metadata": {"name": name}})
            made.append(name)
        except ApiException as err:
            if err.status != 409:
                raise
    return made


def dry_run_apply(kubectl: Kubectl, manifest: str) -> subprocess.CompletedProcess[str]:
    return kubectl("apply", "--dry-run=server", "--validate=strict", "-f", "-", stdin=manifest)


def test_every_manifest_block_of_the_doc_is_validated() -> None:
    """A manifest this module does not find is a manifest nobody checks: one fenced as ```yml
    or without a language, or a fence indented under a list item, would be skipped silently."""
    text = GITOPS.read_text()
    assert len(YAML_BLOCKS) == text.count("```yaml"), "a ```yaml fence not at a line's start"
    manifest_blocks = [b.line for b in fenced_blocks(text) if MANIFEST_KEY.search(b.body)]
    assert manifest_blocks == [b.line for b in YAML_BLOCKS], "manifests fenced other than ```yaml"
    for block in YAML_BLOCKS:
        docs = documents(block)
        assert docs, f"the yaml block at line {block.line} holds no document"
        for doc in docs:
            assert {"apiVersion", "kind"} <= doc.obj.keys(), f"line {doc.line}: not a manifest"
    assert len(SNIPPETS) == sum(b.body.count("\n---\n") + 1 for b in YAML_BLOCKS)


@pytest.mark.parametrize("snippet", SNIPPETS, ids=lambda s: s.id)
def test_the_api_server_accepts_the_snippet(
    snippet: Snippet,
    kubectl: Kubectl,
    cd_crds: dict[tuple[str, str], UpstreamCRD],
    snippet_apis: None,
) -> None:
    crd = _upstream_crd_of(snippet, cd_crds)
    if snippet.is_cd_kind:
        group, version = snippet.group_version
        assert crd is not None, f"{FETCH_CD_CRDS.name} fetches no CRD of {snippet.obj['kind']}"
        assert version in crd.served_versions, (
            f"{crd.path.name} serves {group} {crd.served_versions}, the doc uses {version}"
        )
    _ok(dry_run_apply(kubectl, snippet.text))


def _with_unknown_field(obj: dict[str, Any]) -> tuple[dict[str, Any], str]:
    broken = copy.deepcopy(obj)
    broken["spec"]["notAField"] = True
    return broken, 'unknown field "spec.notAField"'


def _with_a_list_for_a_string(obj: dict[str, Any]) -> tuple[dict[str, Any], str]:
    broken = copy.deepcopy(obj)
    key = next(k for k, v in broken["spec"].items() if isinstance(v, str))
    broken["spec"][key] = [broken["spec"][key]]
    return broken, f"spec.{key} in body must be of type string"


def _first_of_each_cd_kind() -> list[Snippet]:
    """One snippet per kind whose schema comes from a CD tool's CRD."""
    firsts: dict[str, Snippet] = {}
    for s in SNIPPETS:
        if s.is_cd_kind:
            firsts.setdefault(s.obj["kind"], s)
    return list(firsts.values())


@pytest.mark.parametrize(
    "breakage",
    [_with_unknown_field, _with_a_list_for_a_string],
    ids=["unknown-field", "list-for-a-string"],
)
@pytest.mark.parametrize("snippet", _first_of_each_cd_kind(), ids=lambda s: s.id)
def test_a_broken_copy_of_a_snippet_is_refused(
    snippet: Snippet,
    breakage: Callable[[dict[str, Any]], tuple[dict[str, Any], str]],
    kubectl: Kubectl,
    snippet_apis: None,
) -> None:
    """The validation above bites: the same kinds, one field wrong, are refused, and for the
    reason injected."""
    broken, reason = breakage(snippet.obj)
    result = dry_run_apply(kubectl, yaml.safe_dump(broken))
    assert result.returncode != 0, f"accepted: {broken}"
    assert reason in result.stderr, result.stderr
