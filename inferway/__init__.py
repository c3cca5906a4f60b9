"""inferway: a sidecar gateway and traffic manager for AI inference."""

__version__ = "0.1.0"
