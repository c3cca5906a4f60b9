"""The ``inferway`` command's entry point (``[project.scripts]``).

gRPC reads ``GRPC_ENABLE_FORK_SUPPORT`` once, when it is first imported, and a command's module
imports it (``run``, ``serve``: the xDS and backend servers) before the command runs. So the
process environment is set here, before the CLI is imported: the gateway forks Envoy while
gRPC threads run, and gRPC's fork handlers, which only matter to a child that keeps using gRPC
(Envoy execs at once), would print a warning on every fork. Importing any inferway module
still changes nothing.
"""

from __future__ import annotations

import os

__all__ = ["main"]


def main() -> None:
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    from inferway.cli.main import main as cli_main

    cli_main()


if __name__ == "__main__":  # python -m inferway.cli.entry: the console script, by module
    main()
