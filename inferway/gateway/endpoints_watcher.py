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

from inferway.gateway.control_plane import ControlPlane
from inferway.gateway.file_watch import WatchedFile
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
    """Re-reads ``path`` whenever its directory changes and applies it through
    ``control_plane.update_state`` (keeping every other runtime source as it is)."""

    kind = "endpoints"
    retired = False
    """Set when the live policy has moved to another file: a change still seen here before
    the watcher stops is ignored, never applied over the new file's endpoints."""

    def apply(self, text: str, source: str) -> str | None:
        if self.retired:
            return None
        plane = self.control_plane
        endpoints = load_endpoints_text(text, source, services=_services(plane))
        return plane.update_state(dataclasses.replace(plane.state, endpoints=endpoints), source)


def _services(control_plane: ControlPlane) -> list[str] | None:
    policy = control_plane.policy
    return None if policy is None else [service.name for service in policy.services]
