"""What README.md and docs/*.md tell a user to run, read from the Markdown (pure).

Every fenced block needs an info string, so nothing a user is told to type can hide in an
unlabelled block: `sh`/`bash` blocks are commands, `console` blocks are `$ command` lines each
followed by the output the document shows, everything else (`text`, `yaml`, `python`, ...) is
not run. HTML comments right above a fence say how the tier treats it:

    <!-- docs-tier: skip REASON -->            no command of the block runs here
    <!-- docs-tier: skip `PREFIX` REASON -->   commands that start with PREFIX do not
    <!-- docs-tier: alone REASON -->           an alternative: the block gets a cluster of its own
    <!-- docs-tier: from COMMIT REASON -->     runs in the repository as it was at COMMIT (an
                                               earlier release a user upgrades from)
    <!-- docs-tier: given COMMAND -->           what the text assumes is done (the operator
                                               installed), run first on the block's cluster

A command's trailing comment may state its answer: `# yes` / `# no` (kubectl auth can-i) or
`# denied...` (the API server refuses it).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

COMMAND_LANGUAGES = ("sh", "bash", "console")
_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+)(?P<info>[^`]*)$")
_MARKER = re.compile(r"^\s*<!--\s*docs-tier:\s*(?P<body>.*?)\s*-->\s*$")
_HEREDOC = re.compile(r"<<-?\s*'?\"?(?P<word>[A-Za-z_]+)'?\"?")


class MarkdownError(ValueError):
    """The document breaks a rule of the tier (an unlabelled fence, an unknown marker)."""


@dataclass(frozen=True)
class Skip:
    prefix: str  # "" for the whole block
    reason: str


@dataclass(frozen=True)
class Command:
    text: str  # as a shell reads it: continuation lines and heredocs included
    line: int  # 1-based line of the document where it starts
    expect: str = ""  # "yes", "no", "denied" or "" (exit status 0)
    output: tuple[str, ...] = ()  # what a console block shows after it

    @property
    def assigns(self) -> bool:
        """`OP=...` or `export X=...`: later lines of the block use the variable."""
        value = r"(\$\(.*\)|'[^']*'|\"[^\"]*\"|[^\s#]*)"
        return bool(re.fullmatch(rf"(export\s+)?[A-Za-z_]\w*={value}\s*(#.*)?", self.text.strip()))

    @property
    def watches(self) -> bool:
        """`kubectl get -w` runs until the user stops it."""
        return bool(re.search(r"(^|\s)(-w|--watch)(\s|$)", self.text))


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # the fence's line
    language: str
    commands: tuple[Command, ...]
    skips: tuple[Skip, ...] = ()
    alone: bool = False
    from_commit: str = ""
    given: tuple[str, ...] = ()

    def skip_reason(self, command: Command) -> str | None:
        for skip in self.skips:
            if not skip.prefix or command.text.startswith(skip.prefix):
                return skip.reason
        return None


@dataclass
class _Pending:
    skips: list[Skip] = field(default_factory=list)
    alone: bool = False
    from_commit: str = ""
    given: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.skips or self.alone or self.from_commit or self.given)


def command_blocks(path: Path) -> list[Block]:
    """The document's blocks of commands, in document order."""
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    pending = _Pending()
    i = 0
    while i < len(lines):
        marker = _MARKER.match(lines[i])
        fence = _FENCE.match(lines[i])
        if marker:
            _read_marker(marker["body"], pending, path, i + 1)
        elif fence:
            end = _closing_fence(lines, i, fence["fence"])
            language = fence["info"].strip().split(" ")[0]
            if not language:
                raise MarkdownError(
                    f"{path.name}:{i + 1}: a fenced block without a language: label it `sh` "
                    "(commands), `console` ($ commands and their output) or `text`"
                )
            if language in COMMAND_LANGUAGES:
                body = [line[len(fence["indent"]) :] for line in lines[i + 1 : end]]
                commands = tuple(_commands(body, i + 2, console=language == "console"))
                blocks.append(
                    Block(
                        path,
                        i + 1,
                        language,
                        commands,
                        tuple(pending.skips),
                        pending.alone,
                        pending.from_commit,
                        tuple(pending.given),
                    )
                )
            elif pending:
                raise MarkdownError(
                    f"{path.name}:{i + 1}: a docs-tier marker above a `{language}` block"
                )
            pending = _Pending()
            i = end
        elif lines[i].strip():
            pending = _Pending()  # a marker belongs to the fence right below it
        i += 1
    return blocks


def _read_marker(body: str, pending: _Pending, path: Path, line: int) -> None:
    verb, _, rest = body.partition(" ")
    if verb == "skip":
        prefix = re.match(r"`([^`]+)`\s*(.*)", rest)
        skip = Skip(prefix[1], prefix[2]) if prefix else Skip("", rest)
        if not skip.reason:
            raise MarkdownError(f"{path.name}:{line}: a skip must say why")
        pending.skips.append(skip)
    elif verb == "alone":
        pending.alone = True
    elif verb == "from":
        pending.from_commit = rest.split(" ")[0]
    elif verb == "given":
        pending.given.append(rest)
    else:
        raise MarkdownError(f"{path.name}:{line}: unknown docs-tier marker {verb!r}")


def _closing_fence(lines: list[str], start: int, fence: str) -> int:
    for j in range(start + 1, len(lines)):
        if lines[j].strip() == fence:
            return j
    raise MarkdownError(f"fence at line {start + 1} is never closed")


def _commands(body: list[str], first_line: int, *, console: bool) -> Iterator[Command]:
    i = 0
    while i < len(body):
        raw = body[i]
        if console:
            if not raw.startswith("$ "):
                i += 1
                continue
            raw = raw[2:]
        if not raw.strip() or raw.lstrip().startswith("#"):
            i += 1
            continue
        start = i
        text, i = _one_command(body, i, raw)
        output: tuple[str, ...] = ()
        if console:
            out_end = i
            while out_end < len(body) and not body[out_end].startswith("$ "):
                out_end += 1
            output = tuple(line for line in body[i:out_end] if line.strip())
            i = out_end
        yield Command(text, first_line + start, _expectation(text), output)


def _one_command(body: list[str], i: int, first: str) -> tuple[str, int]:
    """One command from line i: its continuation lines and any heredoc."""
    parts = [first]
    while parts[-1].rstrip().endswith("\\") and i + 1 < len(body):
        i += 1
        parts.append(body[i])
    heredoc = _HEREDOC.search(parts[-1])
    i += 1
    if heredoc:
        while i < len(body):
            parts.append(body[i])
            i += 1
            if body[i - 1].strip() == heredoc["word"]:
                break
    return "\n".join(parts), i


def _expectation(text: str) -> str:
    comment = re.search(r"\s#\s*(yes|no|denied)\b", text.splitlines()[-1])
    return comment[1] if comment else ""
