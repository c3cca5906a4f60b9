"""The user-facing shell around the control plane: composition root, CLI, Envoy supervisor,
policy and file watchers, admin API. Importing it changes nothing (no environment edits)."""
