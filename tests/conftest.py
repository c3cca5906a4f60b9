"""Test-process settings that the ``inferway`` entry point makes for a real run, and the
isolation every test gets from the ones before it."""

import logging
import os
from collections.abc import Iterator

import pytest

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
