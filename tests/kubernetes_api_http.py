"""The in-memory API server (tests/kubernetes_api.py) served over HTTP on loopback, with a
kubeconfig naming it: processes started by a test (control-plane replicas) then reach it the
way they reach a real API server, through the client's own urllib3 pool and sockets, a watch
as a chunked response that stays open, and ``$KUBECONFIG`` read as kubectl reads it.

    with ServedApi(tmp_path) as api:
        env = {**os.environ, "KUBECONFIG": str(api.kubeconfig)}
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from tests.kubernetes_api import FakeApiServer, _Stream

__all__ = ["ServedApi"]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # headers and body in one segment, no Nagle wait on a small write (40 ms each otherwise)
    wbufsize = -1
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        headers = {"Content-Type": self.headers.get("Content-Type", "")}
        answer = self.server.api.serve(self.command, "http://api" + self.path, body, headers)
        self.send_response(answer.status)
        self.send_header("Content-Type", "application/json")
        if isinstance(answer, _Stream):
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for line in answer.stream():
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
            except OSError:  # the client went away (a watch stopped)
                self.close_connection = True
            finally:
                answer.close()
            return
        payload = answer.data
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    api: FakeApiServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A replica killed mid-request resets its connection: nothing to report; anything
        else is the fake's own failure, reported as the server would."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class ServedApi:
    def __init__(self, folder: Path) -> None:
        self.api = FakeApiServer()
        self._http = _Server(("127.0.0.1", 0), _Handler)
        self._http.api = self.api
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        self.kubeconfig = folder / "kubeconfig"
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    def __enter__(self) -> ServedApi:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "inferway", "user": {"token": "fake-token"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "inferway"}}],
            "current-context": "fake",
        }
        self.kubeconfig.write_text(yaml.safe_dump(config))
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.api.shut_down()
        self._http.shutdown()
        self._http.server_close()
