"""What the backend tells the outside: Prometheus metrics, OpenTelemetry spans and ORCA load
reports."""
