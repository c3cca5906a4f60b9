"""Asynchronous inference jobs: an OIP request submitted with ``Prefer: respond-async`` is
answered 202 at once and worked in the background (embedded store, or Redis Streams); its
answer is polled at /v2/jobs/{id} or POSTed to a callback URL (docs/jobs.md)."""
