"""Every command README.md and docs/*.md tell a user to run, in document order, as written,
with the real kubectl and helm against a real API server (tests/docs/cluster.py). A command
that cannot run here is marked in the document's source with the reason
(tests/docs/markdown_commands.py), and the tier lists them."""

from __future__ import annotations

import contextlib
import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from .cluster import Shell, user_cluster
from .conftest import Tally
from .markdown_commands import Block, Command, command_blocks

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
WITH_COMMANDS = [d for d in DOCUMENTS if command_blocks(d)]


def test_every_fence_says_what_it_holds() -> None:
    """An unlabelled fence could hide a command from this tier: command_blocks refuses it."""
    for document in DOCUMENTS:
        command_blocks(document)


@pytest.mark.parametrize("document", WITH_COMMANDS, ids=lambda p: p.name)
def test_documented_commands_run_as_written(document: Path, tmp_path: Path, tally: Tally) -> None:
    with DocumentRun(document, tmp_path, tally) as run:
        for block in command_blocks(document):
            run.block(block)


class DocumentRun:
    """One document's commands: one cluster for the document, one more per `alone` block."""

    def __init__(self, document: Path, work: Path, tally: Tally) -> None:
        self.document = document
        self.work = work
        self.tally = tally
        self.stack = contextlib.ExitStack()
        self.shell: Shell | None = None
        self.givens: dict[int, set[str]] = {}

    def __enter__(self) -> DocumentRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.close()

    def block(self, block: Block) -> None:
        runnable = [c for c in block.commands if not self._skipped(block, c)]
        if not runnable:
            return
        cwd = self._checkout(block.from_commit) if block.from_commit else ROOT
        with contextlib.ExitStack() as own:
            shell = (
                own.enter_context(user_cluster(self.work / f"alone-{block.line}"))
                if block.alone
                else self._document_shell()
            )
            for given in block.given:
                self._given(shell, given, cwd)
            variables: list[str] = []  # the block's assignments, as one shell keeps them
            for command in runnable:
                script = "\n".join([*variables, command.text])
                if command.assigns:
                    variables.append(command.text)
                check(
                    command,
                    shell.run(script, cwd, watch=command.watches),
                    self._where(command),
                )
                self.tally.ran.append(self._where(command))
                self.tally.documents.add(self.document.name)

    def _given(self, shell: Shell, command: str, cwd: Path) -> None:
        """What the text assumes, once per cluster (two blocks may assume the same)."""
        done = self.givens.setdefault(id(shell), set())
        if command not in done:
            result = shell.run(command, cwd)
            assert result.returncode == 0, f"given `{command}`: {result.stderr[-2000:]}"
            done.add(command)

    def _skipped(self, block: Block, command: Command) -> bool:
        reason = block.skip_reason(command)
        if reason is not None:
            self.tally.not_runnable.append((self._where(command), command.text, reason))
        return reason is not None

    def _document_shell(self) -> Shell:
        if self.shell is None:
            self.shell = self.stack.enter_context(user_cluster(self.work / "cluster"))
        return self.shell

    def _checkout(self, commit: str) -> Path:
        """The repository as it was at `commit` (what a user upgrading from it has)."""
        tree = self.work / f"at-{commit}"
        if not tree.exists():
            archive = subprocess.run(
                ["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=True
            ).stdout
            with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
                tar.extractall(tree, filter="data")
            assert_crds_changed_since(tree)
        return tree

    def _where(self, command: Command) -> str:
        return f"{self.document.relative_to(ROOT)}:{command.line}"


def assert_crds_changed_since(tree: Path) -> None:
    """An upgrade path proves something only when the CRDs really changed in between."""
    old = {p.name: p.read_text() for p in (tree / "charts/pdd-operator/crds").glob("*.yaml")}
    new = {p.name: p.read_text() for p in (ROOT / "charts/pdd-operator/crds").glob("*.yaml")}
    assert old != new, "the earlier commit's CRDs equal today's: pick an older commit"


def check(command: Command, result: subprocess.CompletedProcess[str], where: str) -> None:
    said = (
        f"{where}: `{command.text}` exited {result.returncode}\n"
        f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )
    if command.watches:
        # Still watching when stopped (timeout's status), having printed the table.
        assert result.returncode == 124 and result.stdout.strip(), said
    elif command.expect in ("yes", "no"):
        assert result.stdout.strip() == command.expect, said
    elif command.expect == "denied":
        assert result.returncode != 0 and "denied" in result.stderr, said
    else:
        assert result.returncode == 0, said
    if command.output:
        assert_same_shape(command.output, result.stdout, said)


def assert_same_shape(shown: tuple[str, ...], printed: str, said: str) -> None:
    """A table's header as the document shows it (rows depend on the cluster)."""
    header = shown[0].split()
    if all(word.isupper() for word in header):
        first = printed.splitlines()[0].split() if printed.strip() else []
        assert first == header, f"{said}\nthe document shows the columns {header}"
