"""Every command of the `inferway` CLI and its helpers (output formats, the admin API client).

The top layer: nothing else in inferway imports it."""
