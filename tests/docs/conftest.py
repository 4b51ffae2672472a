"""The docs tier: every command README.md and docs/*.md tell a user to run, run as written.

At the end of the session it prints `docs: N commands from M documents ran, K not runnable
here`, each of the K with where it is and why (the reason written in the document's source).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest


@dataclass
class Tally:
    ran: list[str] = field(default_factory=list)  # "README.md:120"
    documents: set[str] = field(default_factory=set)
    not_runnable: list[tuple[str, str, str]] = field(default_factory=list)  # where, what, why


TALLY = pytest.StashKey[Tally]()


@pytest.fixture(scope="session")
def tally(request: pytest.FixtureRequest) -> Tally:
    return request.config.stash.setdefault(TALLY, Tally())


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    found = terminalreporter.config.stash.get(TALLY, None)
    if found is None:
        return
    terminalreporter.write_line(
        f"docs: {len(found.ran)} commands from {len(found.documents)} documents ran, "
        f"{len(found.not_runnable)} not runnable here"
    )
    for where, command, why in found.not_runnable:
        first = command.splitlines()[0]
        terminalreporter.write_line(f"  {where}: {first[:70]}  -- {why}")
