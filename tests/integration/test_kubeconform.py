"""`pdd-operator render` output as a GitOps pipeline checks it before it reaches a cluster:
kubeconform -strict (hack/fetch-kubeconform.sh builds it from the Go module proxy), against
schemas generated here, offline, from the pinned kube-apiserver's own OpenAPI and from our CRDs.

kubeconform's `-strict` only refuses duplicate keys and picks the `-strict` schema file; the
refusal of a field the API does not know comes from the schema saying
`additionalProperties: false`, as the strict schemas GitOps users download do. So the schemas
are generated closed, and the bite tests show a misspelt field and a bare YAML 1.1 boolean
are refused: kubeconform reads YAML 1.1, where an unquoted `n` is `false`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdd_localcluster.kubejson import KubeJson
from pdd_operator import manifest_yaml
from pdd_operator.api import v1alpha1 as api

ROOT = Path(__file__).resolve().parents[2]
FETCH_KUBECONFORM = ROOT / "hack" / "fetch-kubeconform.sh"
EXAMPLES = sorted(
    p for p in (ROOT / "examples").rglob("*.yaml") if f"kind: {api.KIND}" in p.read_text()
)
CRDS = sorted((ROOT / "crds").glob("*.yaml"))
# APIs an example's render may need that this control plane does not serve, and why (as in
# test_kubectl): the API server publishes no schema for them, so their objects are skipped.
NOT_SERVED_HERE = {
    "scheduling.k8s.io/v1alpha1": "gang: native needs the GenericWorkload and GangScheduling "
    "feature gates (alpha in Kubernetes 1.35)"
}
# One file per group, version and kind; `-strict` looks for the `-strict` variant, so the
# closed schemas written here are the only ones it can find.
SCHEMA_LOCATION = (
    "{{ .Group }}/{{ .ResourceKind }}_{{ .ResourceAPIVersion }}{{ .StrictSuffix }}.json"
)
COMPONENTS_REF = "#/components/schemas/"
DEFINITIONS_REF = "#/definitions/"
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"

Json = dict[str, Any]


# --- the schemas: pure conversions, tested below without a cluster ------------------------


def schema_file(api_version: str, kind: str) -> str:
    """The file SCHEMA_LOCATION names, computed as kubeconform does: Group is the apiVersion's
    first part (`v1` for the core group), ResourceAPIVersion its last."""
    parts = api_version.split("/")
    return f"{parts[0]}/{kind.lower()}_{parts[-1]}-strict.json"


def close_objects(schema: Json) -> Json:
    """`additionalProperties: false` wherever properties are declared and the API does not
    keep unknown fields: there the API server's field validation refuses an unknown one.
    allOf/anyOf/oneOf/not are left as they are: in a structural schema they only restrict
    values (the API server's allOf wraps a $ref, and the referenced schema is closed)."""
    closed = dict(schema)
    if "properties" in closed:
        closed["properties"] = {k: close_objects(v) for k, v in closed["properties"].items()}
        if "additionalProperties" not in closed and not closed.get(
            "x-kubernetes-preserve-unknown-fields"
        ):
            closed["additionalProperties"] = False
    for key in ("items", "additionalProperties"):
        if isinstance(closed.get(key), dict):
            closed[key] = close_objects(closed[key])
    return closed


def repoint_refs(node: Any) -> Any:
    """OpenAPI v3's `#/components/schemas/X` as `#/definitions/X`, the file's own section."""
    if isinstance(node, dict):
        return {
            k: v.replace(COMPONENTS_REF, DEFINITIONS_REF, 1) if k == "$ref" else repoint_refs(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [repoint_refs(v) for v in node]
    return node


def refs_in(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value.removeprefix(COMPONENTS_REF)
            else:
                yield from refs_in(value)
    elif isinstance(node, list):
        for value in node:
            yield from refs_in(value)


def reachable(schema: Json, components: dict[str, Json]) -> set[str]:
    """The names of every component `schema` refers to, directly or through others."""
    found: set[str] = set()
    pending = [schema]
    while pending:
        for name in refs_in(pending.pop()):
            if name not in found:
                found.add(name)
                pending.append(components[name])
    return found


def standalone_strict(schema: Json, components: dict[str, Json]) -> Json:
    """One kind's schema as one self-contained file: its $refs point into its own
    `definitions` (kubeconform loads a single file), every object in it closed."""
    standalone = close_objects(repoint_refs(schema))
    standalone["definitions"] = {
        name: close_objects(repoint_refs(components[name]))
        for name in sorted(reachable(schema, components))
    }
    return standalone


def crd_schema(crd: Json, version: str) -> Json:
    """A CRD version's schema as the API server publishes it: `metadata` is ObjectMeta (the
    CRD itself only says `type: object`)."""
    served = next(v for v in crd["spec"]["versions"] if v["name"] == version)
    schema: Json = json.loads(json.dumps(served["schema"]["openAPIV3Schema"]))
    schema["properties"]["metadata"] = {"$ref": COMPONENTS_REF + OBJECT_META}
    return schema


def kind_schema(document: Json, group: str, version: str, kind: str) -> Json:
    """The component of an OpenAPI v3 document that is the given kind."""
    wanted = {"group": group, "version": version, "kind": kind}
    for schema in document["components"]["schemas"].values():
        if wanted in schema.get("x-kubernetes-group-version-kind", []):
            return dict(schema)
    raise LookupError(f"no schema for {wanted}")


# --- the cluster-facing part -------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    returncode: int
    summary: dict[str, int]
    resources: list[Json]

    def valid_kinds(self) -> Counter[str]:
        return Counter(r["kind"] for r in self.resources if r["status"] == "statusValid")

    def refused(self) -> list[Json]:
        """Invalid or unreadable objects (-verbose also lists the empty document after a
        trailing `---`, with no status of its own)."""
        return [r for r in self.resources if r["status"] in ("statusInvalid", "statusError")]

    def messages(self) -> str:
        return "\n".join(f"{r['kind']}/{r['name']}: {r['msg']}" for r in self.refused())


def render(example: Path) -> str:
    return subprocess.run(
        [sys.executable, "-m", "pdd_operator.cli", "render", "-f", str(example)],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=True,
    ).stdout  # fmt: skip


def documents(text: str) -> list[Json]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


@pytest.fixture(scope="module")
def kubeconform() -> Path:
    fetched = subprocess.run(
        ["bash", str(FETCH_KUBECONFORM)], capture_output=True, text=True, timeout=900
    )
    assert fetched.returncode == 0, f"{FETCH_KUBECONFORM.name}: {fetched.stderr.strip()}"
    return Path(fetched.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def renders() -> dict[Path, str]:
    return {example: render(example) for example in EXAMPLES}


def unserved(text: str) -> set[str]:
    """kubeconform's `-skip` names (apiVersion/kind) of the objects no schema is served for."""
    return {
        f"{doc['apiVersion']}/{doc['kind']}"
        for doc in documents(text)
        if doc["apiVersion"] in NOT_SERVED_HERE
    }


class PublishedOpenAPI:
    """The API server's /openapi/v3 documents, one per group-version, fetched when first
    asked for."""

    def __init__(self, kube: KubeJson) -> None:
        self.kube = kube
        self.paths: dict[str, Json] = kube.request("GET", "/openapi/v3")["paths"]
        self.documents: dict[str, Json] = {}

    @staticmethod
    def path(api_version: str) -> str:
        return ("apis/" if "/" in api_version else "api/") + api_version

    def serves(self, api_version: str) -> bool:
        return self.path(api_version) in self.paths

    def document(self, api_version: str) -> Json:
        path = self.path(api_version)
        if path not in self.documents:
            url = self.paths[path]["serverRelativeURL"]
            self.documents[path] = self.kube.request("GET", url)
        return self.documents[path]


def schema_and_document(
    openapi: PublishedOpenAPI, crds: dict[tuple[str, str], Json], api_version: str, kind: str
) -> tuple[Json, Json]:
    """A kind's schema and the OpenAPI document its $refs resolve in: our CRDs' from crds/
    (their ObjectMeta from the core group's document), every other from the API server."""
    group, _, version = api_version.rpartition("/")
    if (group, kind) in crds:
        return crd_schema(crds[group, kind], version), openapi.document("v1")
    document = openapi.document(api_version)
    return kind_schema(document, group, version, kind), document


@pytest.fixture(scope="module")
def schemas(
    kubeconfig: Path, renders: dict[Path, str], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A kubeconform schema folder with the kinds the examples and their renders hold, from
    the pinned API server's /openapi/v3 and from crds/: written once, read offline."""
    wanted = {
        (doc["apiVersion"], doc["kind"])
        for text in [*renders.values(), *(e.read_text() for e in EXAMPLES)]
        for doc in documents(text)
    }
    crds = {
        (crd["spec"]["group"], crd["spec"]["names"]["kind"]): crd
        for crd in (yaml.safe_load(path.read_text()) for path in CRDS)
    }
    folder = tmp_path_factory.mktemp("kubeconform-schemas")
    kube = KubeJson(kubeconfig)
    try:
        openapi = PublishedOpenAPI(kube)
        for api_version, kind in sorted(wanted):
            if api_version in NOT_SERVED_HERE:
                assert not openapi.serves(api_version), f"{api_version} is served now"
                continue
            schema, document = schema_and_document(openapi, crds, api_version, kind)
            strict = standalone_strict(schema, document["components"]["schemas"])
            target = folder / schema_file(api_version, kind)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(strict, indent=1))
    finally:
        kube.close()
    return folder


def kubeconform_strict(binary: Path, schemas: Path, text: str) -> Verdict:
    """`kubeconform -strict -summary` over `text` on stdin, one worker (CI shares two cores);
    objects of an API this control plane does not serve are skipped, and counted so."""
    argv = [str(binary), "-strict", "-summary", "-verbose", "-output", "json", "-n", "1"]
    argv += ["-schema-location", f"{schemas}/{SCHEMA_LOCATION}"]
    skip = unserved(text)
    argv += ["-skip", ",".join(sorted(skip))] if skip else []
    result = subprocess.run([*argv, "-"], input=text, capture_output=True, text=True, timeout=120)
    assert result.stdout, result.stderr
    report = json.loads(result.stdout)
    return Verdict(result.returncode, report["summary"], report["resources"] or [])


def render_of(renders: dict[Path, str], name: str) -> str:
    return renders[ROOT / "examples" / name]


# --- the conversions --------------------------------------------------------------------

OPEN_MAP = {"type": "object", "additionalProperties": {"type": "string"}}


@pytest.mark.parametrize(
    ("schema", "closed"),
    [
        pytest.param(
            {"properties": {"a": {"type": "string"}}},
            {"properties": {"a": {"type": "string"}}, "additionalProperties": False},
            id="declared properties: nothing else",
        ),
        pytest.param(OPEN_MAP, OPEN_MAP, id="a map keeps its keys open"),
        pytest.param(
            {"properties": {}, "x-kubernetes-preserve-unknown-fields": True},
            {"properties": {}, "x-kubernetes-preserve-unknown-fields": True},
            id="the API keeps unknown fields there",
        ),
        pytest.param(
            {"items": {"properties": {}}},
            {"items": {"properties": {}, "additionalProperties": False}},
            id="a list's items",
        ),
        pytest.param(
            {"properties": {"a": {}}, "anyOf": [{"properties": {"a": {"minLength": 1}}}]},
            {
                "properties": {"a": {}},
                "anyOf": [{"properties": {"a": {"minLength": 1}}}],
                "additionalProperties": False,
            },
            id="a junctor only restricts values: left open",
        ),
        pytest.param(
            {"additionalProperties": {"properties": {"b": {"properties": {}}}}},
            {
                "additionalProperties": {
                    "properties": {"b": {"properties": {}, "additionalProperties": False}},
                    "additionalProperties": False,
                }
            },
            id="a map's values and nested properties",
        ),
    ],
)
def test_close_objects_refuses_undeclared_fields_where_the_api_does(
    schema: Json, closed: Json
) -> None:
    assert close_objects(schema) == closed


def test_a_standalone_schema_carries_exactly_the_definitions_it_reaches() -> None:
    components = {
        "Spec": {"properties": {"meta": {"allOf": [{"$ref": COMPONENTS_REF + "Meta"}]}}},
        "Meta": {"properties": {"labels": OPEN_MAP}},
        "Unrelated": {"properties": {}},
    }
    root = {"properties": {"spec": {"$ref": COMPONENTS_REF + "Spec"}}}
    standalone = standalone_strict(root, components)
    assert standalone["properties"]["spec"] == {"$ref": DEFINITIONS_REF + "Spec"}
    assert sorted(standalone["definitions"]) == ["Meta", "Spec"]
    assert standalone["definitions"]["Spec"]["properties"]["meta"] == {
        "allOf": [{"$ref": DEFINITIONS_REF + "Meta"}]
    }
    assert standalone["definitions"]["Meta"]["additionalProperties"] is False


# --- kubeconform over what render prints --------------------------------------------------


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_object_an_example_renders_passes_kubeconform_strict(
    kubeconform: Path, schemas: Path, renders: dict[Path, str], example: Path
) -> None:
    text = renders[example]
    served = [doc for doc in documents(text) if doc["apiVersion"] not in NOT_SERVED_HERE]
    verdict = kubeconform_strict(kubeconform, schemas, text)
    assert verdict.returncode == 0, verdict.messages()
    skipped = len(documents(text)) - len(served)
    assert verdict.summary == {"valid": len(served), "invalid": 0, "errors": 0, "skipped": skipped}
    assert verdict.valid_kinds() == Counter(doc["kind"] for doc in served)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_example_itself_passes_kubeconform_strict_against_our_crd(
    kubeconform: Path, schemas: Path, example: Path
) -> None:
    """What a GitOps repository holds beside the render (or instead of it)."""
    verdict = kubeconform_strict(kubeconform, schemas, example.read_text())
    assert verdict.returncode == 0, verdict.messages()
    assert verdict.valid_kinds() == Counter({api.KIND: 1})


def test_a_field_the_api_does_not_know_is_refused(
    kubeconform: Path, schemas: Path, renders: dict[Path, str]
) -> None:
    docs = documents(render_of(renders, "sglang-1p2d.yaml"))
    statefulset = next(doc for doc in docs if doc["kind"] == "StatefulSet")
    statefulset["spec"]["template"]["spec"]["containers"][0]["bogus"] = "x"
    text = manifest_yaml.dump_all(docs, explicit_start=True, sort_keys=False)
    verdict = kubeconform_strict(kubeconform, schemas, text)
    assert verdict.returncode == 1
    refused = [(r["kind"], r["name"]) for r in verdict.refused()]
    assert refused == [("StatefulSet", statefulset["metadata"]["name"])], verdict.messages()
    assert "bogus" in verdict.messages()


def test_a_yaml_11_boolean_left_bare_where_a_string_belongs_is_refused(
    kubeconform: Path, schemas: Path, renders: dict[Path, str]
) -> None:
    """The example sets NIXL_UCX_SGL_ENABLE to `n`; render quotes it. Bare, PyYAML still
    reads the string `n`, while kubeconform (like kubectl) reads YAML 1.1's `false`."""
    text = render_of(renders, "sglang-1p2d.yaml")
    quoted = "- name: NIXL_UCX_SGL_ENABLE\n          value: 'n'\n"
    assert text.count(quoted) >= 1, "render no longer prints the quoted `n` this test needs"
    bare = text.replace(quoted, quoted.replace("'n'", "n"), 1)
    assert documents(bare) == documents(text)
    verdict = kubeconform_strict(kubeconform, schemas, bare)
    assert verdict.returncode == 1
    assert len(verdict.refused()) == 1, verdict.messages()
    assert re.search(r"/env/\d+/value'?: got boolean, want string", verdict.messages()), (
        verdict.messages()
    )
