"""Which engine version a deployment runs, and which version's wiring the adapter renders.

Engines change their flags, ports and protocols between releases (docs/engines.md lists what
changed where), so the version is an input: ``spec.engine.version`` where given (it wins, and
is the only way for an image pinned by digest alone), else the image's tag
(``vllm/vllm-openai:v0.33.0``, ``lmsysorg/sglang:v0.5.23-cu129``). A version the adapter does
not know, or none at all (``:latest``, a digest), gets the newest supported wiring and a
condition that says so (status.compute).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

# "0.33", "v0.33.0", "0.5.23.post1", "v0.5.4-cu129": the release is the leading numbers.
_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:[.+-].*|rc\d+.*)?$")

VersionSource = Literal["spec.engine.version", "image tag", "none"]


@dataclass(frozen=True, order=True)
class Version:
    major: int
    minor: int
    patch: int = 0

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


def parse_version(text: str) -> Version | None:
    """The release a version string or image tag names, or None where it names none."""
    match = _VERSION.match(text.strip())
    if match is None:
        return None
    major, minor, patch = match.groups()
    return Version(int(major), int(minor), int(patch or 0))


def image_tag(image: str) -> str:
    """The tag of an image reference ("" where it has none): after the digest is cut off,
    what follows the last ':' of the last path segment (a registry's ':port' is not a tag)."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.rsplit(":", 1)[1] if ":" in last else ""


@dataclass(frozen=True)
class SupportedVersions:
    """The releases an adapter's wiring is checked against (tests/fixtures/engines)."""

    oldest: Version
    newest: Version

    def __contains__(self, version: Version) -> bool:
        return self.oldest <= version <= Version(self.newest.major, self.newest.minor, 10**6)

    def __str__(self) -> str:
        return f"{self.oldest} to {self.newest}"


@dataclass(frozen=True)
class ResolvedVersion:
    """The version a deployment's engine runs, as far as the spec tells, and the one whose
    wiring is rendered: the same where it is supported, else the newest supported."""

    wiring: Version
    declared: Version | None  # None: neither spec.engine.version nor the tag names one
    source: VersionSource
    supported: bool


def resolve_version(
    declared_version: str | None, image: str, supported: SupportedVersions
) -> ResolvedVersion:
    """``spec.engine.version`` wins over the image tag; an unsupported or unknown version
    renders the newest supported wiring (a newer engine is likelier to keep today's flags than
    to have gone back to an old release's)."""
    source: VersionSource = "none"
    declared = None
    if declared_version:
        declared, source = parse_version(declared_version), "spec.engine.version"
    else:
        declared = parse_version(image_tag(image))
        source = "image tag" if declared is not None else "none"
    if declared is not None and declared in supported:
        return ResolvedVersion(declared, declared, source, True)
    return ResolvedVersion(supported.newest, declared, source, False)
