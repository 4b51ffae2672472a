"""The deployment's bearer token, read again whenever its file changes.

The token lives in a Secret the operator creates; a deleted one is created again with a new
token (the operator cannot read Secrets, so it cannot restore the old value). The kubelet
rewrites a Secret volume when its Secret changes, so every running pod moves to the new token
within the kubelet's sync period, without a restart, as long as nobody holds the old value.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path


class TokenFile:
    """Calling it gives the token now in the file. A missing or empty file keeps the last
    token read (the kubelet keeps a deleted Secret's files; a half-written one is never seen,
    since the kubelet swaps a symlink), but there must be one at the start."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int] | None = None
        self._token = ""
        if not self():
            raise ValueError(f"the token file {self.path} is missing or empty")

    def __call__(self) -> str:
        try:
            stat = os.stat(self.path)
        except OSError:
            return self._token
        seen = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        with self._lock:
            if seen != self._seen:
                self._seen = seen
                self._token = self._read() or self._token
            return self._token

    def _read(self) -> str:
        try:
            return self.path.read_text(encoding="utf-8").strip()
        except OSError:
            return ""
