"""The sidecar's token follows its file: the operator creates a deleted token Secret again
with a new token, and the kubelet rewrites the volume (by swapping a symlink to a new
directory), so a running sidecar must serve and send the new token without a restart."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pdd_sidecar.token import TokenFile


def _kubelet_writes(volume: Path, token: str, generation: int) -> None:
    """As the kubelet's atomic writer does: a new timestamped directory, then ..data swapped."""
    data = volume / f"..{generation}"
    data.mkdir()
    (data / "token").write_text(token + "\n")
    link = volume / "..data_tmp"
    link.symlink_to(data.name)
    os.replace(link, volume / "..data")
    if not (volume / "token").is_symlink():
        (volume / "token").symlink_to("..data/token")


def test_a_rewritten_volume_gives_the_new_token(tmp_path: Path) -> None:
    _kubelet_writes(tmp_path, "first", 1)
    token = TokenFile(tmp_path / "token")
    assert token() == "first"
    _kubelet_writes(tmp_path, "second", 2)
    assert token() == "second"


def test_a_vanished_or_empty_file_keeps_the_last_token(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("kept")
    token = TokenFile(path)
    path.write_text("")
    assert token() == "kept"
    path.unlink()
    assert token() == "kept"


@pytest.mark.parametrize("content", [None, "", "  \n"])
def test_a_missing_or_empty_token_at_the_start_is_refused(
    tmp_path: Path, content: str | None
) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match="missing or empty"):
        TokenFile(path)
