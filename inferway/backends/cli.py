"""``inferway serve``: the inference backend's command (filled in by the backend work)."""
