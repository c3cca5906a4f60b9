"""Test-process settings that the ``inferway`` entry point makes for a real run, the isolation
every test gets from the ones before it, each test's marker from its directory, the real
components a test needs (tests/components.py) and the skips summed up at the end."""

import logging
import os
from collections import Counter
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from tests.components import CI, require_binary

pytest_plugins = ["tests.hang_report"]

# As inferway.cli.main.main does: the in-process gateways fork Envoy while gRPC threads
# run, and gRPC's fork handlers would print a warning on every fork.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """A CLI command run in process (CliRunner) sets up logging as a real run does: a handler on
    the root logger writing to that invocation's stderr, which CliRunner closes afterwards.
    Left in place, every later log record fails on the closed stream, and the "Logging error"
    traceback lands in whatever stderr is current: another command's captured output. Remove
    the handlers a test added (pytest's own capture handlers excepted) and restore the level."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers and not type(handler).__module__.startswith("_pytest"):
            root.removeHandler(handler)
    root.setLevel(level)


TESTS = Path(__file__).resolve().parent

DIRECTORY_MARKERS = {
    "unit": "unit",
    "golden": "golden",
    "integration": "integration",
    "e2e": "e2e",
    "gpu": "gpu",
    "wheel_install": "packaging",
    "image": "image",
}
"""tests/<directory>/ -> the marker every test under it gets (`make test-fast` is -m unit or
golden); markers are registered in pyproject.toml."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test by its directory, before ``-m`` selects on the markers."""
    for item in items:
        try:
            parts = item.path.relative_to(TESTS).parts
        except ValueError:
            continue
        marker = DIRECTORY_MARKERS.get(parts[0]) if len(parts) > 1 else None
        if marker is None:
            raise pytest.UsageError(
                f"{item.nodeid}: a test belongs in one of tests/{{{','.join(DIRECTORY_MARKERS)}}}/ "
                "(its directory gives its marker: tests/conftest.py DIRECTORY_MARKERS)"
            )
        item.add_marker(marker)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """``needs_binary`` markers: skip without the binary, or fail under CI=true."""
    for mark in item.iter_markers("needs_binary"):
        require_binary(*mark.args, **mark.kwargs)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> Generator[None, object]:
    """One line per skip reason with its count, after every other summary (-ra's list of each
    skipped test included), so a run that skipped something says so where it ends."""
    result = yield
    reasons: Counter[str] = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        if isinstance(report.longrepr, tuple):
            reasons[str(report.longrepr[2]).removeprefix("Skipped: ")] += 1
    mode = "CI=true: a missing real component fails" if CI else "not CI"
    if reasons:
        terminalreporter.write_sep("=", f"skips: {sum(reasons.values())} ({mode})")
        for reason, count in reasons.most_common():
            terminalreporter.write_line(f"{count:5d}  {reason}")
    else:
        terminalreporter.write_line(f"skips: none ({mode})")
    return result
