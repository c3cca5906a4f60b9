"""A State written as YAML: the golden tests' ``state.yaml``, and a way to pin runtime
state in a file when reproducing what a gateway served.

    endpoints: {v1: ["10.0.0.1:8000"]}              # replaces v1's inline endpoints
    replicas: {v1: ["10.0.0.9:8000"]}               # added to v1's endpoints
    weights: {canary: {v1: 50, v2: 50}}             # route -> {service: weight}
    secrets:
      listener/secure/cert: {certificate_chain: "-----BEGIN ...", private_key: "..."}
      listener/secure/ca: {trusted_ca: "-----BEGIN ..."}

Errors are located like the policy's (file:line:column).
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from inferway.policies.errors import PolicyError, PolicyIssue, read_source_text
from inferway.policies.located import (
    describe_value,
    in_file_order,
    parse_located,
    validation_issues,
)
from inferway.policies.model import Endpoint, Name
from inferway.state.model import State, TlsMaterial

__all__ = ["StateFile", "load_state", "load_state_text"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SecretEntry(_Model):
    certificate_chain: str | None = None
    private_key: str | None = None
    trusted_ca: str | None = None


class StateFile(_Model):
    """The file's schema; every section may be left out."""

    endpoints: dict[Name, list[Endpoint]] = Field(default_factory=dict)
    replicas: dict[Name, list[Endpoint]] = Field(default_factory=dict)
    weights: dict[Name, dict[Name, float]] = Field(default_factory=dict)
    secrets: dict[str, SecretEntry] = Field(default_factory=dict)


def load_state(path: str | Path) -> State:
    return load_state_text(read_source_text(path), str(path))


def load_state_text(text: str, source: str = "<string>") -> State:
    """Raises PolicyError with every located issue."""
    document, issues = parse_located(text, source)
    data = document.data if document.data is not None else {}
    if not isinstance(data, dict):
        mark = document.position(())
        message = f"expected a mapping at the top level, got {describe_value(data)}"
        raise PolicyError([PolicyIssue(source, mark.line, mark.column, "", message)])
    try:
        parsed = StateFile.model_validate(data)
    except ValidationError as error:
        issues.extend(validation_issues(error, document, source, StateFile))
        raise PolicyError(in_file_order(issues)) from None
    if issues:
        raise PolicyError(in_file_order(issues))
    return State(
        endpoints=MappingProxyType({k: tuple(v) for k, v in sorted(parsed.endpoints.items())}),
        replicas=MappingProxyType({k: tuple(v) for k, v in sorted(parsed.replicas.items())}),
        weights=MappingProxyType(
            {k: MappingProxyType(dict(v)) for k, v in sorted(parsed.weights.items())}
        ),
        secrets=MappingProxyType(
            {name: _material(entry) for name, entry in sorted(parsed.secrets.items())}
        ),
    )


def _material(entry: SecretEntry) -> TlsMaterial:
    def encoded(text: str | None) -> bytes | None:
        return None if text is None else text.encode("ascii")

    return TlsMaterial(
        certificate_chain=encoded(entry.certificate_chain),
        private_key=encoded(entry.private_key),
        trusted_ca=encoded(entry.trusted_ca),
    )
