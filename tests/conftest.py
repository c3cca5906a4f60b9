"""Test-process settings that the ``inferway`` entry point makes for a real run."""

import os

# As inferway.gateway.cli.main does: the in-process gateways fork Envoy while gRPC threads
# run, and gRPC's fork handlers would print a warning on every fork.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
