"""Certificate files -> SDS secrets: load what the policy's TLS settings name, watch for rotation.

Two entry points, both on one :class:`CertificateSource`:

* ``resolve_state`` is a state source (:mod:`inferway.gateway.sources`): every policy edit has
  its certificate files read before it is applied, so an edit naming a missing, unreadable or
  unsafe file is refused like any bad edit, and the snapshot always carries the secrets its
  listeners and clusters refer to. (The first policy's files are read by the composition root
  with :func:`load_tls_secrets`, the same reads ``inferway validate`` does; ``follow`` then
  points the watch at them.)
* ``start`` watches the directories holding those files; when one changes, the material is
  re-read and pushed into the sink (``StateSink.update_state``). Envoy gets a new Secret and
  uses it for new handshakes; established connections keep theirs; listeners are not drained.

Private keys are never logged or shown in errors (only their paths), and a key that its group
or others can read is refused with the chmod that fixes it. A certificate whose key does not
match (caught mid-rotation, between the two renames) is refused and the next change retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, replace
from pathlib import Path

import watchfiles
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from inferway.gateway.control_plane import PolicyRefusedError
from inferway.gateway.sources import StateSink
from inferway.gateway.watch_health import WatchHealth, supervise
from inferway.pki.keys import check_private_key_permissions, key_matches_certificate
from inferway.policies.errors import PolicyError, PolicyIssue, read_limited
from inferway.policies.model import Policy
from inferway.resolve.secrets import listener_secret_names, service_secret_names
from inferway.state import State, TlsMaterial

__all__ = [
    "CertificateSource",
    "SecretFiles",
    "load_tls_secrets",
    "secret_files",
]

log = logging.getLogger(__name__)

CERTIFICATES_SOURCE = "certificate files"


@dataclass(frozen=True)
class SecretFiles:
    """The files one SDS secret is made of, and where in the policy they were named."""

    loc: str
    certificate: Path | None = None
    private_key: Path | None = None
    trusted_ca: Path | None = None

    def paths(self) -> list[Path]:
        return [p for p in (self.certificate, self.private_key, self.trusted_ca) if p is not None]


def _path(base_dir: Path, value: str | None) -> Path | None:
    if value is None:
        return None
    path = Path(value).expanduser()
    return path if path.is_absolute() else base_dir / path


def secret_files(policy: Policy, base_dir: Path) -> dict[str, SecretFiles]:
    """SDS secret name -> its files (relative paths resolved against ``base_dir``)."""
    out: dict[str, SecretFiles] = {}
    for i, listener in enumerate(policy.listeners):
        names = listener_secret_names(listener)
        tls = listener.tls
        if not names or tls is None:
            continue
        loc = f"listeners[{i}].tls"
        out[names["cert"]] = SecretFiles(
            loc,
            certificate=_path(base_dir, tls.certificate),
            private_key=_path(base_dir, tls.private_key),
        )
        if "ca" in names:
            out[names["ca"]] = SecretFiles(loc, trusted_ca=_path(base_dir, tls.client_ca))
    for s, service in enumerate(policy.services):
        names = service_secret_names(service)
        service_tls = service.tls
        if not names or service_tls is None:
            continue
        loc = f"services[{s}].tls"
        out[names["ca"]] = SecretFiles(loc, trusted_ca=_path(base_dir, service_tls.ca))
        if "cert" in names:
            out[names["cert"]] = SecretFiles(
                loc,
                certificate=_path(base_dir, service_tls.certificate),
                private_key=_path(base_dir, service_tls.private_key),
            )
    return out


def _read(path: Path, what: str, problems: list[str]) -> bytes | None:
    try:
        return read_limited(path)
    except OSError as exc:
        problems.append(f"cannot read {what} {path}: {exc.strerror or exc}")
        return None


def _load_one(files: SecretFiles, problems: list[str]) -> TlsMaterial | None:
    before = len(problems)
    chain = key = ca = None
    if files.certificate is not None:
        chain = _read(files.certificate, "certificate", problems)
        if chain is not None:
            try:
                certs = x509.load_pem_x509_certificates(chain)
            except ValueError:
                problems.append(f"certificate {files.certificate} is not a PEM certificate")
                certs = []
    if files.private_key is not None:
        try:
            message = check_private_key_permissions(files.private_key)
        except OSError as exc:
            message = f"cannot read private key {files.private_key}: {exc.strerror or exc}"
        if message:
            problems.append(message)
        else:
            key = _read(files.private_key, "private key", problems)
        if key is not None:
            try:
                private = serialization.load_pem_private_key(key, password=None)
            except (ValueError, TypeError):  # never echo the content
                problems.append(f"private key {files.private_key} is not an unencrypted PEM key")
            else:
                if chain is not None and certs and not key_matches_certificate(certs[0], private):
                    problems.append(
                        f"private key {files.private_key} does not match certificate "
                        f"{files.certificate}"
                    )
    if files.trusted_ca is not None:
        ca = _read(files.trusted_ca, "CA bundle", problems)
        if ca is not None:
            try:
                x509.load_pem_x509_certificates(ca)
            except ValueError:
                problems.append(f"CA bundle {files.trusted_ca} holds no PEM certificate")
    if len(problems) > before:
        return None
    return TlsMaterial(certificate_chain=chain, private_key=key, trusted_ca=ca)


def load_tls_secrets(
    policy: Policy, base_dir: Path, *, source: str = "<policy>"
) -> dict[str, TlsMaterial]:
    """Read every file the policy's TLS settings name. Raises PolicyError listing every
    unreadable, malformed, mismatched or unsafe file (paths only, never key content)."""
    issues: list[PolicyIssue] = []
    secrets: dict[str, TlsMaterial] = {}
    for name, files in sorted(secret_files(policy, base_dir).items()):
        problems: list[str] = []
        material = _load_one(files, problems)
        issues.extend(PolicyIssue(source, None, None, files.loc, p) for p in problems)
        if material is not None:
            secrets[name] = material
    if issues:
        raise PolicyError(issues)
    return secrets


class CertificateSource:
    """Loads certificate files for each applied policy and pushes them again when they change."""

    def __init__(
        self,
        base_dir: str | Path,
        *,
        source: str = "<policy>",
        debounce_ms: int = 50,
        force_polling: bool | None = None,
    ) -> None:
        self.base_dir = Path(base_dir)
        self.source = source
        self.debounce_ms = debounce_ms
        self.force_polling = force_polling
        self.rotations = 0
        self._plane: StateSink | None = None
        self._watched: frozenset[Path] = frozenset()
        self._dirs: frozenset[Path] = frozenset()
        self._stop = asyncio.Event()
        self._rewatch = asyncio.Event()
        self._watching = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.health = WatchHealth("certificates", str(self.base_dir))

    def resolve_state(self, policy: Policy, state: State) -> State:
        """Control-plane state source: ``state`` with the policy's secrets freshly loaded."""
        secrets = load_tls_secrets(policy, self.base_dir, source=self.source)
        self.follow(policy)
        if dict(state.secrets) == secrets:
            return state
        return replace(state, secrets=secrets)

    def follow(self, policy: Policy) -> None:
        """Watch the certificate files ``policy`` names (without reading them now)."""
        files = secret_files(policy, self.base_dir)
        self._set_watched({p for f in files.values() for p in f.paths()})

    def _set_watched(self, paths: set[Path]) -> None:
        self._watched = frozenset(p.resolve() for p in paths)
        dirs = frozenset(p.parent for p in self._watched)
        if dirs != self._dirs:
            self._dirs = dirs
            self._rewatch.set()

    async def start(self, plane: StateSink) -> None:
        """Watch the certificate directories of the live policy; returns once watching. A
        change is pushed into ``plane`` (the control plane, or any :class:`StateSink`)."""
        if self._task is not None:
            raise RuntimeError("this certificate source is already started")
        self._plane = plane
        self._stop.clear()
        self._task = asyncio.create_task(
            supervise(self._run, self.health, self._stop, self._watching),
            name="certificate-watcher",
        )
        waiter = asyncio.create_task(self._watching.wait())
        await asyncio.wait({waiter, self._task}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if self._task.done():
            self._task.result()

    async def stop(self) -> None:
        self._stop.set()
        self._rewatch.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while not self._stop.is_set():
            self._rewatch.clear()
            dirs = sorted(d for d in self._dirs if d.is_dir())
            if not dirs:
                self._watching.set()
                self.health.running = True
                await self._rewatch.wait()
                continue
            log.info("watching certificate files in %s", ", ".join(map(str, dirs)))
            async for changes in watchfiles.awatch(
                *dirs,
                watch_filter=None,
                debounce=self.debounce_ms,
                step=min(50, max(self.debounce_ms, 1)),
                stop_event=_AnyEvent(self._stop, self._rewatch),
                recursive=False,
                force_polling=self.force_polling,
                yield_on_timeout=True,
                rust_timeout=200,
            ):
                self._watching.set()
                self.health.running = True
                if any(self._concerns(path) for _, path in changes):
                    self.reload()

    def _concerns(self, changed: str) -> bool:
        path = Path(changed)
        return path in self._watched or path.name.startswith("..")  # ConfigMap symlink swap

    def reload(self) -> str | None:
        """Re-read the files of the live policy and push them; the new version, or None when
        nothing changed or the files were refused (recorded on the control plane)."""
        plane = self._plane
        if plane is None or plane.policy is None:
            return None
        try:
            secrets = load_tls_secrets(plane.policy, self.base_dir, source=self.source)
        except PolicyError as exc:
            plane.refuse(exc, CERTIFICATES_SOURCE)
            return None
        self.health.read_ok()
        if dict(plane.state.secrets) == secrets:
            return None
        try:
            version = plane.update_state(replace(plane.state, secrets=secrets), CERTIFICATES_SOURCE)
        except PolicyRefusedError:
            return None
        self.rotations += 1
        log.info("certificate files changed: pushed %d secret(s)", len(secrets))
        return version


class _AnyEvent:
    """What ``watchfiles.awatch`` needs of a stop event (``is_set``), set by either event."""

    def __init__(self, *events: asyncio.Event) -> None:
        self._events = events

    def is_set(self) -> bool:
        return any(event.is_set() for event in self._events)
