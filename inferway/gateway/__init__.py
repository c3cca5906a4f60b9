"""The user-facing shell around the control plane: CLI, Envoy supervisor, policy watcher,
admin API and the demo."""

import os

# The gateway forks Envoy while gRPC threads run; gRPC's fork handlers only matter to a child
# that keeps using gRPC (Envoy execs at once), and they print a warning on every fork.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
