"""Known images and how their filesystem is provided on this machine.

A container of a known image runs the host's root filesystem (under an overlay, see
`sandbox`) with the image's programs put first on PATH and its Python packages on PYTHONPATH,
the way the image's Dockerfile would set ENV. An image built here (`make images`) can run from
its own files instead: `built_images` mounts each one's root filesystem through the container
engine and reads its ENV, ENTRYPOINT, CMD, USER and WORKDIR, and the sandbox then runs the
container on that root as the image's (or the pod's) user. An image that is not in the table
is not run: its pod keeps the simulated status of `podstatus` and says so in its container
logs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# operator/ (the source root) and the repository above it.
SOURCE_ROOT = Path(__file__).resolve().parents[2]
REPO_ROOT = SOURCE_ROOT.parent
# The venv whose console scripts (pdd-sidecar, vllm-router, smg, ...) the images carry.
VENV_BIN = Path(sys.executable).parent
# What the known images are made of here: the venv, the interpreter it links to, the repository.
# A volume mounted over a directory that holds one of them (an emptyDir at /tmp, when the
# repository is checked out under /tmp) must not hide it: the sandbox binds these back on top.
IMAGE_CONTENT = tuple(
    dict.fromkeys(str(p) for p in (Path(sys.prefix), Path(sys.base_prefix), REPO_ROOT))
)
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class ImageFs:
    """An image's filesystem on this machine: directories put first on PATH and PYTHONPATH."""

    name: str
    bin_dirs: Sequence[Path] = ()
    python_dirs: Sequence[Path] = ()
    extra_env: Mapping[str, str] = field(default_factory=dict)
    # The Dockerfile target's ENTRYPOINT and CMD (a pod that sets only `args` relies on them).
    entrypoint: Sequence[str] = ()
    cmd: Sequence[str] = ()
    # Where the image's tag is told to its programs: one build per tag would bake what the
    # tag names into the image's ENV (the reference engine's tag names the engine release
    # whose protocol it speaks).
    tag_env: str = ""
    # A built image's own root filesystem on this machine, with its USER ("uid[:gid]") and
    # WORKDIR; None: the host's root with the programs above.
    root: Path | None = None
    user: str = ""
    working_dir: str = ""

    def env(self, image: str = "") -> dict[str, str]:
        """The image's ENV, as a Dockerfile's ENV lines would set it."""
        if self.root is not None:
            return dict(self.extra_env)
        path = [*map(str, self.bin_dirs), str(VENV_BIN), SYSTEM_PATH]
        python = [*map(str, self.python_dirs), str(SOURCE_ROOT)]
        tagged = {self.tag_env: tag(image)} if self.tag_env else {}
        return {
            "PATH": ":".join(path),
            "PYTHONPATH": ":".join(python),
            "PYTHONUNBUFFERED": "1",
            **self.extra_env,
            **tagged,
        }


REFENGINE_IMAGE_DIR = SOURCE_ROOT / "pdd_refengine" / "image"

# Repository (the image reference without tag or digest) -> its filesystem here.
KNOWN_IMAGES: dict[str, ImageFs] = {
    "ghcr.io/pdd-dev/pdd-sidecar": ImageFs(
        "pdd-sidecar", entrypoint=("pdd-sidecar",), cmd=("serve",)
    ),
    "ghcr.io/pdd-dev/pdd-operator": ImageFs(
        "pdd-operator", entrypoint=("pdd-operator",), cmd=("run",)
    ),
    "ghcr.io/pdd-dev/pdd-router": ImageFs("pdd-router"),
    # The reference engine (a test double of vLLM and SGLang): `vllm` on PATH and
    # `python3 -m sglang.launch_server` importable.
    "ghcr.io/pdd-dev/pdd-refengine": ImageFs(
        "pdd-refengine",
        bin_dirs=(REFENGINE_IMAGE_DIR / "bin",),
        python_dirs=(REFENGINE_IMAGE_DIR / "python",),
        tag_env="PDD_REFENGINE_IMAGE_TAG",
    ),
}


def repository(image: str) -> str:
    """`ghcr.io/pdd-dev/pdd-sidecar:0.1.0@sha256:...` -> `ghcr.io/pdd-dev/pdd-sidecar`."""
    name = image.split("@", 1)[0]
    last_slash = name.rfind("/")
    colon = name.rfind(":")
    return name[:colon] if colon > last_slash else name


def tag(image: str) -> str:
    """`ghcr.io/pdd-dev/pdd-refengine:vllm-0.33.0@sha256:...` -> `vllm-0.33.0` ("": none)."""
    return image.split("@", 1)[0][len(repository(image)) :].lstrip(":")


def lookup(image: str, table: Mapping[str, ImageFs] = KNOWN_IMAGES) -> ImageFs | None:
    return table.get(repository(image))


def unknown_images(pod: Mapping[str, object], table: Mapping[str, ImageFs]) -> list[str]:
    """The images of the pod's containers that the table cannot run."""
    spec = pod.get("spec") or {}
    assert isinstance(spec, dict)
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    return sorted(
        {c.get("image", "") for c in containers if lookup(c.get("image", ""), table) is None}
    )


def built_images(
    references: Sequence[str], engine: Sequence[str], engine_env: Mapping[str, str] | None = None
) -> dict[str, ImageFs]:
    """Images built here, run from their own files: repository -> the image's root filesystem
    as the container engine mounts it (`podman image mount`, which needs root) and its config.
    A repository maps to the one tag given, as the chart names one tag per image."""
    table = {}
    for reference in references:
        root = _engine(engine, engine_env, "image", "mount", reference).strip()
        [inspected] = json.loads(_engine(engine, engine_env, "image", "inspect", reference))
        config = inspected.get("Config") or {}
        table[repository(reference)] = ImageFs(
            name=repository(reference).rsplit("/", 1)[-1],
            extra_env=dict(e.split("=", 1) for e in config.get("Env") or [] if "=" in e),
            entrypoint=tuple(config.get("Entrypoint") or ()),
            cmd=tuple(config.get("Cmd") or ()),
            root=Path(root),
            user=str(config.get("User") or ""),
            working_dir=str(config.get("WorkingDir") or ""),
        )
    return table


def _engine(engine: Sequence[str], env: Mapping[str, str] | None, *args: str) -> str:
    result = subprocess.run(
        [*engine, *args], capture_output=True, text=True, env=None if env is None else dict(env)
    )
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join([*engine, *args])}: {result.stderr.strip()}")
    return result.stdout
