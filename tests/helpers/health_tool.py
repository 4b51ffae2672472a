"""hack/health, the CD tools' health code (kstatus and Argo CD's Lua) as one Go binary, built
once per source into .tmp/ (the Go build cache keeps the modules).

`make test` runs this file before pytest starts (`python tests/helpers/health_tool.py`): on a
fresh machine the build downloads and compiles for minutes, and under parallel workers it
would do so beside three other workers' control planes. Standard library only, so that it runs
as a script too.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEALTH_SRC = ROOT / "hack" / "health"


def health_tool() -> Path:
    """The binary for the current source, built when it is missing."""
    digest = hashlib.sha256(
        b"".join((HEALTH_SRC / f).read_bytes() for f in ("main.go", "go.mod", "go.sum"))
    ).hexdigest()[:12]
    binary = ROOT / ".tmp" / f"health-{digest}"
    if not binary.exists():
        binary.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["go", "build", "-o", str(binary), "."], cwd=HEALTH_SRC, check=True, timeout=600
        )
    return binary


if __name__ == "__main__":
    print(health_tool())
