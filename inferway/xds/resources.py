"""The translator's output: Envoy resources grouped by type URL, each keyed by name.

A plain value: pure code builds it, the cache versions it, ``render`` prints it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

import yaml
from google.protobuf import json_format
from google.protobuf.message import Message

from inferway.xds import type_urls

__all__ = ["Resources", "content_hash", "resources_to_dict", "resources_to_yaml"]

_M = TypeVar("_M", bound=Message)


@dataclass(frozen=True)
class Resources:
    """``by_type[type_url][name] -> proto``; names and types sorted for determinism."""

    by_type: Mapping[str, Mapping[str, Message]] = field(default_factory=dict)

    @classmethod
    def build(cls, items: Mapping[str, Iterable[tuple[str, Message]]]) -> Resources:
        frozen: dict[str, Mapping[str, Message]] = {}
        for type_url in sorted(items):
            named: dict[str, Message] = {}
            for name, message in items[type_url]:
                if name in named:
                    raise ValueError(f"duplicate {type_url} resource named {name!r}")
                named[name] = message
            frozen[type_url] = MappingProxyType(dict(sorted(named.items())))
        return cls(MappingProxyType(frozen))

    def of_type(self, type_url: str) -> Mapping[str, Message]:
        return self.by_type.get(type_url, MappingProxyType({}))

    def typed(self, type_url: str, kind: type[_M]) -> dict[str, _M]:
        """``of_type`` for code that reads the messages' fields: each checked to be a ``kind``
        (what ``type_url`` names), so the type checker knows their fields."""
        found: dict[str, _M] = {}
        for name, message in self.of_type(type_url).items():
            if not isinstance(message, kind):
                raise TypeError(
                    f"{type_url} resource {name!r} is a {type(message).__name__}, "
                    f"not a {kind.__name__}"
                )
            found[name] = message
        return found

    def type_urls(self) -> list[str]:
        return [t for t in type_urls.PUSH_ORDER if t in self.by_type] + sorted(
            t for t in self.by_type if t not in type_urls.PUSH_ORDER
        )


def content_hash(messages: Iterable[Message]) -> str:
    """A version string derived from content (deterministic serialization), stable across
    control-plane restarts so Envoy never mistakes new content for something already applied."""
    digest = hashlib.sha256()
    for message in messages:
        payload = message.SerializeToString(deterministic=True)
        digest.update(len(payload).to_bytes(8, "big"))
        digest.update(payload)
    return digest.hexdigest()[:16]


def resources_to_dict(resources: Resources) -> dict[str, Any]:
    """``{"clusters": [...], "listeners": [...], ...}`` with each proto as its JSON form."""
    out: dict[str, Any] = {}
    for type_url in resources.type_urls():
        key = type_urls.SHORT_NAMES.get(type_url, type_url)
        out[key] = [
            _as_dict(type_url, message)
            for _, message in sorted(resources.of_type(type_url).items())
        ]
    return out


def resources_to_yaml(resources: Resources) -> str:
    return yaml.safe_dump(resources_to_dict(resources), sort_keys=True, default_flow_style=False)


def _as_dict(type_url: str, message: Message) -> dict[str, Any]:
    body = json_format.MessageToDict(message, preserving_proto_field_name=True)
    # protobuf renders packed Any fields as OrderedDict, which yaml.safe_dump refuses:
    # a JSON round trip leaves plain dicts/lists/scalars.
    if type_url == type_urls.SECRET:  # rendered for people: never print a private key
        key = body.get("tls_certificate", {}).get("private_key")
        if key is not None:
            body["tls_certificate"]["private_key"] = {"inline_string": "<redacted>"}
    return {"@type": type_url, **json.loads(json.dumps(body))}
