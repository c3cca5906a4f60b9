"""``AdminClient``: the one client of the gateway's admin API, used by every command that asks
a running gateway something (``status``, ``scale status``, ``rollout ...``, ``profile
--admin``, ``verify --admin``).

Built on the standard library's ``urllib`` rather than httpx: operators and scripts poll these
commands, and importing httpx alone costs more CPU than the whole answer should (docs/cli.md,
bench/cli_startup.py). Every failure is an :class:`AdminError` carrying the message and the exit
code of docs/cli.md: 3 the admin API unreachable or not answering as one, 1 refused (an unknown
rollout, a command its phase refuses, no autoscaler, a missing token).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from http.client import HTTPException
from pathlib import Path
from typing import Any, cast

from inferway.exit_codes import EXIT_CANNOT_START, EXIT_INVALID, EXIT_UNREACHABLE
from inferway.gateway.admin_documents import (
    ADMIN_TOKEN_ENV,
    DEFAULT_ADMIN_PORT,
    AutoscaleDocument,
    RolloutCommandAnswer,
    RolloutStatus,
    StatusDocument,
)

__all__ = [
    "DEFAULT_ADMIN_URL",
    "AdminClient",
    "AdminError",
    "admin_token",
]

DEFAULT_ADMIN_URL = f"http://127.0.0.1:{DEFAULT_ADMIN_PORT}"
"""Where ``inferway run`` serves the admin API by default."""


class AdminError(Exception):
    """The admin API could not be asked or refused; ``exit_code`` is the command's exit."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class _Answer:
    """One HTTP answer: status code and body (an error status is an answer too)."""

    def __init__(self, url: str, status: int, body: bytes) -> None:
        self.url, self.status, self.body = url, status, body

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace").strip()

    def json(self) -> Any:
        """The body as JSON; ValueError when it is not."""
        return json.loads(self.body)


def admin_token(token_file: Path | None, *, needed_for: str) -> str:
    """The admin token from ``token_file``, else ``$INFERWAY_ADMIN_TOKEN``; AdminError (exit 1)
    saying what needs it when neither gives one."""
    if token_file is not None:
        try:
            return token_file.read_text(encoding="utf-8").strip()
        except OSError as error:
            message = f"cannot read --token-file {token_file}: {error}"
            raise AdminError(message, EXIT_INVALID) from None
    token = os.environ.get(ADMIN_TOKEN_ENV, "").strip()
    if not token:
        raise AdminError(
            f"{needed_for} the admin token: --token-file FILE or ${ADMIN_TOKEN_ENV}", EXIT_INVALID
        )
    return token


class AdminClient:
    """The admin API at ``url`` (``http://127.0.0.1:15000``); ``token`` for the POSTs (and the
    reads, which also take ``$INFERWAY_ADMIN_TOKEN``)."""

    def __init__(self, url: str, *, token: str | None = None, timeout: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    # ---- documents ---------------------------------------------------------------------------

    def status(self) -> StatusDocument:
        """``GET /status``: what is live, what was refused, what each Envoy ACKed."""
        answer = self._request("GET", "/status", hint=True)
        if answer.status != 200:
            raise AdminError(f"{answer.url} answered HTTP {answer.status}", EXIT_UNREACHABLE)
        return cast(StatusDocument, self._json(answer, "did not answer JSON"))

    def autoscale(self, *, missing_ok: bool = False) -> AutoscaleDocument | None:
        """``GET /autoscale``; exit 1 when the gateway has no autoscaler (no replicas), or
        None with ``missing_ok``."""
        answer = self._request("GET", "/autoscale")
        if answer.status == 404 and missing_ok:
            return None
        if answer.status == 404:
            raise AdminError(
                f"{answer.url}: no autoscaler: no service of the gateway has replicas: or "
                "autoscale:",
                EXIT_INVALID,
            )
        return cast(AutoscaleDocument, self._document(answer))

    def rollouts(self, *, missing_ok: bool = False) -> list[RolloutStatus]:
        """``GET /rollouts``: every rollout of the live policy. ``missing_ok``: a gateway
        without a rollout driver (404) has none, rather than failing."""
        answer = self._request("GET", "/rollouts")
        if answer.status == 404 and missing_ok:
            return []
        document = self._document(answer)
        try:
            return cast(list[RolloutStatus], document["rollouts"])
        except (KeyError, TypeError):
            raise AdminError(
                f"{answer.url} did not answer the rollouts document", EXIT_UNREACHABLE
            ) from None

    def rollout(self, name: str) -> RolloutStatus:
        """``GET /rollouts/{name}``; exit 1 for a rollout the live policy does not have."""
        answer = self._request("GET", f"/rollouts/{name}")
        if answer.status == 404:
            raise AdminError(f"{answer.url}: HTTP 404: {answer.text}", EXIT_INVALID)
        return cast(RolloutStatus, self._document(answer))

    def rollout_command(self, name: str, command: str) -> RolloutCommandAnswer:
        """``POST /rollouts/{name}/{command}`` (promote, abort, pause, resume, restart);
        exit 1 with the gateway's reason when it refuses."""
        answer = self._request("POST", f"/rollouts/{name}/{command}")
        if answer.status != 200:
            raise AdminError(
                f"{command} {name}: HTTP {answer.status}: {_error_text(answer)}", EXIT_INVALID
            )
        return cast(RolloutCommandAnswer, self._json(answer, "did not answer JSON"))

    def profile(self, body: dict[str, Any], *, seconds: float) -> dict[str, Any]:
        """``POST /profile``: a py-spy run on the gateway's host (its document carries the
        SVG). Exit 1 when refused (bad request, token, target), 2 when profiling failed."""
        answer = self._request("POST", "/profile", body=body, timeout=seconds + 30, plain=True)
        try:
            document: dict[str, Any] = answer.json()
        except ValueError:
            document = {"error": answer.text}
        if answer.status != 200:
            code = EXIT_INVALID if answer.status in (400, 401, 404, 409) else EXIT_CANNOT_START
            message = f"{answer.url} answered {answer.status}: {document.get('error')}"
            raise AdminError(message, code)
        return document

    # ---- transport ---------------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        *,
        body: dict[str, Any] | None = None,
        timeout: float | None = None,
        hint: bool = False,
        plain: bool = False,
    ) -> _Answer:
        url = self.url + path
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        # reads carry the token too when there is one: off loopback the admin API wants it
        # for every read (docs/operations.md); $INFERWAY_ADMIN_TOKEN serves reads by default
        token = self.token if method == "POST" else self.token or os.environ.get(ADMIN_TOKEN_ENV)
        if token:
            headers["Authorization"] = f"Bearer {token.strip()}"
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=timeout or self.timeout) as response:
                return _Answer(url, response.status, response.read())
        except urllib.error.HTTPError as error:  # an answer, with an error status
            with error:
                return _Answer(url, error.code, error.read())
        except (urllib.error.URLError, HTTPException, OSError, ValueError) as error:
            reason = error.reason if isinstance(error, urllib.error.URLError) else error
            if plain:
                message = f"admin API {url} unreachable: {reason}"
            else:
                message = f"cannot reach the inferway admin API at {url}: {reason}"
                if hint:
                    message += ". Is `inferway run` running, and is --admin its admin address?"
            raise AdminError(message, EXIT_UNREACHABLE) from None

    def _document(self, answer: _Answer) -> Any:
        if answer.status != 200:
            raise AdminError(f"{answer.url}: HTTP {answer.status}: {answer.text}", EXIT_UNREACHABLE)
        return self._json(answer, "did not answer JSON: is it the admin API?")

    @staticmethod
    def _json(answer: _Answer, complaint: str) -> Any:
        try:
            return answer.json()
        except ValueError:
            raise AdminError(f"{answer.url} {complaint}", EXIT_UNREACHABLE) from None


def _error_text(answer: _Answer) -> str:
    """The gateway's ``{"error": ...}`` message, else the body as it is."""
    try:
        document = answer.json()
    except ValueError:
        return answer.text
    if isinstance(document, dict):
        return str(document.get("error", answer.text))
    return answer.text
