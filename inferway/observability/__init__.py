"""Observability helpers shared by inferway's processes: log formats, redaction, masking,
OpenTelemetry setup (``observability.otel``), py-spy profiles.

Nothing is imported here: importing ``inferway.observability.log_format`` (the CLI does, for
``--log-format``) must not load the OpenTelemetry SDK, which only ``otel`` needs."""
