"""YAML that every Kubernetes tool reads the same way.

kubectl, kubeconform and most Go tools read YAML 1.1 (go-yaml v2 through sigs.k8s.io/yaml),
where a bare `y`, `n`, `yes`, `on` (in any case) is a boolean. PyYAML writes `y` and `n` bare,
since its own resolver does not treat single letters as booleans, so `NIXL_UCX_SGL_ENABLE: y`
came out as a boolean to kubectl, which then refused the StatefulSet ("cannot unmarshal bool
into ... EnvVar ... of type string"). This dumper knows YAML 1.1's booleans, so it quotes every
string that some reader would take for one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import yaml

# YAML 1.1's booleans (https://yaml.org/type/bool.html); PyYAML's SafeDumper already quotes
# the ones its resolver knows (true/false/yes/no/on/off), not the single letters.
_YAML11_BOOL = re.compile(r"^(?:y|Y|n|N|yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE"
                          r"|on|On|ON|off|Off|OFF)$")  # fmt: skip


class ManifestDumper(yaml.SafeDumper):
    """SafeDumper that also quotes YAML 1.1's single-letter booleans."""


ManifestDumper.add_implicit_resolver("tag:yaml.org,2002:bool", _YAML11_BOOL, list("yYnNtTfFoO"))


def dump(document: Any, **options: Any) -> str:
    return str(yaml.dump(document, Dumper=ManifestDumper, **options))


def dump_all(documents: Iterable[Any], **options: Any) -> str:
    return str(yaml.dump_all(documents, Dumper=ManifestDumper, **options))
