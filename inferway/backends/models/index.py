"""The model repository's index as Triton's repository extension reports it.

One entry per model version the directory holds or the server serves: ``READY`` when it
serves, ``UNAVAILABLE`` with the reason when it was refused or unloaded on request. A model
directory with no loadable version yet is listed by name alone, as Triton lists a model it
has not loaded.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferway.backends.models.repository import ModelRepository
from inferway.backends.models.scan import scan_repository

__all__ = ["READY", "UNAVAILABLE", "UNLOADED", "IndexEntry", "repository_index"]

READY = "READY"
UNAVAILABLE = "UNAVAILABLE"
UNLOADED = "unloaded"
"""The reason of a version taken out of service by an unload request."""


@dataclass(frozen=True, slots=True)
class IndexEntry:
    name: str
    version: str = ""
    state: str = ""
    reason: str = ""

    def as_dict(self) -> dict[str, str]:
        """Triton's JSON entry: empty fields are left out, as Triton leaves them."""
        entry = {"name": self.name}
        for key in ("version", "state", "reason"):
            value = getattr(self, key)
            if value:
                entry[key] = value
        return entry


def repository_index(repository: ModelRepository, *, ready_only: bool = False) -> list[IndexEntry]:
    """Every model version known to ``repository``, sorted by name then version."""
    served = {(m.name, m.version) for m in repository.models()}
    refused = repository.refusals()
    held = repository.held
    on_disk = set(scan_repository(repository.root)) if repository.root.is_dir() else set()
    entries: list[IndexEntry] = []
    for name, version in sorted(served | set(refused) | on_disk, key=lambda k: (k[0], int(k[1]))):
        if (name, version) in served:
            entries.append(IndexEntry(name, version, READY))
        elif ready_only:
            continue
        elif name in held:
            entries.append(IndexEntry(name, version, UNAVAILABLE, UNLOADED))
        elif (name, version) in refused:
            entries.append(IndexEntry(name, version, UNAVAILABLE, refused[(name, version)]))
        elif IndexEntry(name) not in entries:  # found by the scan, not tried yet
            entries.append(IndexEntry(name))
    if not ready_only:  # model directories that hold no version at all
        listed = {e.name for e in entries}
        for path in sorted(repository.root.iterdir()) if repository.root.is_dir() else ():
            if path.is_dir() and not path.name.startswith(".") and path.name not in listed:
                entries.append(IndexEntry(path.name))
    return entries
