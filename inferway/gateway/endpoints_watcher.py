"""Watch the endpoints file on its own and push each valid edit as new runtime state.

A deploy system rewrites the endpoints file as replicas come and go; each valid version
reaches Envoy as ClusterLoadAssignments only (the policy, clusters and listeners stay as they
are, so no connection is dropped). A bad file is refused with its location, like a bad policy
edit, and the last good endpoints keep serving. As with the policy, the file's directory is
watched (editors and ConfigMaps replace the inode a file watch would follow).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from pathlib import Path

from inferway.gateway.file_watch import WatchedFile
from inferway.gateway.sources import StateSink
from inferway.policies.endpoints import ServiceEndpoints, load_endpoints_text
from inferway.policies.errors import read_source_text

__all__ = ["EndpointsWatcher", "load_initial_endpoints"]


def load_initial_endpoints(path: Path, services: Collection[str]) -> tuple[str, ServiceEndpoints]:
    """Read the endpoints file once at start, checked against the policy's ``services``;
    returns the text (for ``mark_loaded``) and the endpoints. Raises PolicyError: a gateway
    refuses to start on a bad endpoints file."""
    text = read_source_text(path)
    return text, load_endpoints_text(text, str(path), services=services)


class EndpointsWatcher(WatchedFile):
    """Re-reads ``path`` whenever its directory changes and pushes it into its sink with
    ``update_state`` (keeping every other runtime source as it is); it knows nothing else of
    the control plane."""

    kind = "endpoints"
    retired = False
    """Set when the live policy has moved to another file: a change still seen here before
    the watcher stops is ignored, never applied over the new file's endpoints."""

    def apply(self, text: str, source: str) -> str | None:
        if self.retired:
            return None
        sink = self.sink
        endpoints = load_endpoints_text(text, source, services=_services(sink))
        return sink.update_state(dataclasses.replace(sink.state, endpoints=endpoints), source)


def _services(sink: StateSink) -> list[str] | None:
    policy = sink.policy
    return None if policy is None else [service.name for service in policy.services]
