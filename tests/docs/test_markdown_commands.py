"""How the docs tier reads a document (tests/docs/markdown_commands.py), on small documents."""

from __future__ import annotations

from pathlib import Path

import pytest

from .markdown_commands import Block, MarkdownError, command_blocks


def blocks(tmp_path: Path, text: str) -> list[Block]:
    doc = tmp_path / "doc.md"
    doc.write_text(text)
    return command_blocks(doc)


def test_an_unlabelled_fence_is_refused(tmp_path: Path) -> None:
    with pytest.raises(MarkdownError, match=r"doc\.md:2: a fenced block without a language"):
        blocks(tmp_path, "text\n```\nkubectl get pdd\n```\n")


def test_only_command_blocks_are_read(tmp_path: Path) -> None:
    found = blocks(tmp_path, "```text\nkubectl x\n```\n```yaml\na: 1\n```\n```sh\nkubectl y\n```\n")
    assert [c.text for b in found for c in b.commands] == ["kubectl y"]


def test_continuations_heredocs_and_comments(tmp_path: Path) -> None:
    text = (
        "```sh\n# a comment\nhelm install x \\\n  --wait\n"
        "kubectl apply -f - <<'YAML'\nkind: X\nYAML\nkubectl get x   # no\n```\n"
    )
    (block,) = blocks(tmp_path, text)
    assert [c.text for c in block.commands] == [
        "helm install x \\\n  --wait",
        "kubectl apply -f - <<'YAML'\nkind: X\nYAML",
        "kubectl get x   # no",
    ]
    assert [c.line for c in block.commands] == [3, 5, 8]
    assert [c.expect for c in block.commands] == ["", "", "no"]


def test_console_blocks_keep_the_output_shown(tmp_path: Path) -> None:
    (block,) = blocks(tmp_path, "```console\n$ kubectl get pdd\nNAME   READY\nx      True\n```\n")
    (command,) = block.commands
    assert command.text == "kubectl get pdd"
    assert command.output == ("NAME   READY", "x      True")


def test_markers_skip_isolate_and_prepare(tmp_path: Path) -> None:
    text = (
        "<!-- docs-tier: skip `curl` needs a port-forward -->\n"
        "<!-- docs-tier: given helm install x -->\n"
        "<!-- docs-tier: alone another install -->\n"
        "<!-- docs-tier: from 226ed2c the old release -->\n"
        "```sh\nkubectl get x\ncurl localhost\n```\n"
        "```sh\nkubectl get y\n```\n"
    )
    first, second = blocks(tmp_path, text)
    assert [first.skip_reason(c) for c in first.commands] == [None, "needs a port-forward"]
    assert first.given == ("helm install x",) and first.alone and first.from_commit == "226ed2c"
    assert not (second.skips or second.given or second.alone or second.from_commit)


@pytest.mark.parametrize(
    "marker",
    ["<!-- docs-tier: skip -->", "<!-- docs-tier: later x -->"],
)
def test_a_marker_must_be_known_and_say_why(tmp_path: Path, marker: str) -> None:
    with pytest.raises(MarkdownError):
        blocks(tmp_path, f"{marker}\n```sh\nkubectl get x\n```\n")


def test_a_marker_above_a_block_that_is_not_run_is_refused(tmp_path: Path) -> None:
    with pytest.raises(MarkdownError, match="marker above a `yaml` block"):
        blocks(tmp_path, "<!-- docs-tier: skip why -->\n```yaml\na: 1\n```\n")


@pytest.mark.parametrize(
    ("text", "assigns"),
    [
        ("OP=system:serviceaccount:a:b", True),
        ("NODE=$(kubectl get nodes -o jsonpath='{.items[0].metadata.name}')", True),
        ("export KUBECONFIG=$PWD/k  # note", True),
        ("PDD_BENCH_WORK=/tmp/w .venv/bin/python bench/run.py", False),
        ("kubectl get pdd", False),
    ],
)
def test_assignments_carry_to_the_rest_of_the_block(
    tmp_path: Path, text: str, assigns: bool
) -> None:
    (block,) = blocks(tmp_path, f"```sh\n{text}\n```\n")
    assert block.commands[0].assigns is assigns


def test_a_watch_is_recognised(tmp_path: Path) -> None:
    (block,) = blocks(tmp_path, "```sh\nkubectl get pdd x -w\nkubectl get pdd -o wide\n```\n")
    assert [c.watches for c in block.commands] == [True, False]
