"""Actuators: thin shells at the edge that act on decisions (local replica processes)."""
