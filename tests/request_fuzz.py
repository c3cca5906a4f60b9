"""Fuzzing inference requests against a live ``inferway serve`` (issue 33): Hypothesis
strategies for whole HTTP requests (JSON and binary-extension bodies, mutated fields, headers,
lengths, methods, paths) and the checks every answer must pass. Shared by the bounded test
(tests/integration/test_fuzz_requests.py) and the long run (bench/fuzz_requests.py).

What is checked, request by request: exactly one whole HTTP answer comes back (nothing after
it), its status is 2xx or 4xx (bad input is never a 5xx), and a JSON answer is strict JSON
(no bare NaN). After a run: the server is still answering and its log holds no traceback."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from hypothesis import strategies as st

from inferway.devtools.demo_models import build_add
from inferway.free_ports import free_ports

__all__ = [
    "FuzzServer",
    "RequestCase",
    "check_answer",
    "fuzz_server",
    "requests",
    "send",
]

MAX_BODY_BYTES = 1 << 20
"""The fuzzed server's --max-body-bytes: larger declared bodies must get 413 at once."""
MODELS = {"add": "FP32", "addi": "INT32"}
"""Served models (demo_models.build_add: inputs a, b [-1, 4]; outputs sum, diff)."""
DATATYPES = ["FP32", "FP64", "FP16", "INT8", "INT32", "INT64", "UINT8", "BOOL", "BYTES", "X"]


@dataclass(frozen=True)
class RequestCase:
    """One HTTP/1.1 request as bytes on the wire (always ``Connection: close``)."""

    method: str
    path: str
    headers: tuple[tuple[str, str], ...]
    body: bytes

    def wire(self) -> bytes:
        lines = [f"{self.method} {self.path} HTTP/1.1", "Host: fuzz", "Connection: close"]
        lines += [f"{name}: {value}" for name, value in self.headers]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + self.body


# -- strategies ------------------------------------------------------------------------------

_json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
_json_values = st.recursive(
    _json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=20,
)
_numbers = st.one_of(
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
)
_raw_numbers = st.sampled_from(
    ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1e39", "1e-400"]
)
"""Number spellings no JSON encoder writes: the body is assembled around them as text."""


@st.composite
def _tensor(draw: st.DrawFn, name: str) -> dict[str, object]:
    tensor: dict[str, object] = {
        "name": draw(st.sampled_from([name, name, name, "c", "", "a\u00e9\U0001f600", "sum"])),
        "datatype": draw(st.sampled_from(["FP32"] * 12 + ["INT32"] * 4 + DATATYPES)),
    }
    rows = draw(st.integers(min_value=-1, max_value=3))
    cols = draw(st.sampled_from([4] * 12 + [0, 3, 5, 2**31, -4]))
    shape: object = [rows, cols]
    if draw(st.integers(0, 5)) == 0:
        shape = draw(st.one_of(st.lists(st.integers(-2, 6), max_size=4), _json_values))
    tensor["shape"] = shape
    count = max(0, rows) * 4
    data: object = draw(st.lists(_numbers, min_size=count, max_size=count))
    if draw(st.integers(0, 3)) == 0:
        data = draw(
            st.one_of(
                st.lists(st.lists(_numbers, min_size=4, max_size=4), min_size=1, max_size=3),
                st.lists(st.booleans(), max_size=8),
                st.lists(st.text(max_size=4), max_size=8),
                _json_values,
            )
        )
    if draw(st.integers(0, 9)) > 0:
        tensor["data"] = data
    if draw(st.integers(0, 9)) == 0:
        tensor["parameters"] = draw(_json_values)
    return tensor


@st.composite
def _json_request(draw: st.DrawFn) -> bytes:
    doc: dict[str, object] = {"inputs": [draw(_tensor("a")), draw(_tensor("b"))]}
    if draw(st.integers(0, 4)) == 0:
        doc["inputs"] = draw(st.one_of(_json_values, st.lists(_tensor("a"), max_size=3)))
    if draw(st.integers(0, 4)) == 0:
        doc["outputs"] = draw(
            st.one_of(
                st.lists(
                    st.fixed_dictionaries(
                        {"name": st.sampled_from(["sum", "diff", "x"])},
                        optional={"parameters": _json_values},
                    ),
                    max_size=3,
                ),
                _json_values,
            )
        )
    if draw(st.integers(0, 4)) == 0:
        doc["parameters"] = draw(
            st.one_of(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "timeout": st.one_of(_numbers, _json_values),
                        "binary_data_output": _json_values,
                    },
                ),
                _json_values,
            )
        )
    if draw(st.integers(0, 5)) == 0:
        doc["id"] = draw(_json_values)
    text = json.dumps(doc)
    if draw(st.integers(0, 5)) == 0 and "0" in text:  # an unencodable number somewhere
        at = draw(st.integers(0, text.count("0") - 1))
        head, *rest = text.split("0")
        pieces = [head, *rest]
        text = "0".join(pieces[: at + 1]) + draw(_raw_numbers) + "0".join(pieces[at + 1 :])
    if draw(st.integers(0, 9)) == 0:  # nested deeper than any parser wants
        depth = draw(st.sampled_from([100, 1000, 5000, 100_000]))
        text = '{"inputs": ' + "[" * depth + "]" * depth + "}"
    body = text.encode()
    if draw(st.integers(0, 9)) == 0:  # cut short or with junk after it
        body = draw(st.one_of(st.just(body[: len(body) // 2]), st.just(body + b"}junk")))
    return body


@st.composite
def _binary_request(draw: st.DrawFn) -> tuple[bytes, tuple[tuple[str, str], ...]]:
    """A binary-extension body: the JSON head then raw bytes, with sizes that may lie."""
    rows = draw(st.integers(min_value=0, max_value=3))
    size = draw(st.sampled_from([rows * 16, rows * 16, 0, 3, 17, 2**40, -1]))
    inputs = [
        {
            "name": n,
            "datatype": draw(st.sampled_from(["FP32", "FP32", "INT32", "BYTES", "BOOL"])),
            "shape": [rows, 4],
            "parameters": {"binary_data_size": size},
        }
        for n in ("a", "b")
    ]
    head = json.dumps(
        {"inputs": inputs, "parameters": {"binary_data_output": draw(st.booleans())}}
    ).encode()
    tail = draw(st.binary(max_size=2 * rows * 16 + 8))
    declared = draw(
        st.one_of(
            st.just(str(len(head))),
            st.integers(min_value=-5, max_value=len(head) + len(tail) + 5).map(str),
            st.sampled_from(["", "abc", "1e3", " 12", "99999999999999999999"]),
        )
    )
    return head + tail, (("Inference-Header-Content-Length", declared),)


def _paths() -> st.SearchStrategy[str]:
    model = st.sampled_from([*MODELS] * 6 + ["nope", "add%20x", "ädd", "..", "add/versions/1"])
    version = st.sampled_from([""] * 6 + ["/versions/1"] * 3 + ["/versions/2", "/versions/x"])
    tail = st.sampled_from(["/infer"] * 20 + ["", "/ready", "/config", "/infer/x", "/stats"])
    return st.builds(lambda m, v, t: f"/v2/models/{m}{v}{t}", model, version, tail)


@st.composite
def requests(draw: st.DrawFn) -> RequestCase:
    """Any request a client might send to an infer endpoint, well formed or not."""
    kind = draw(st.sampled_from(["json"] * 5 + ["binary"] * 2 + ["bytes", "empty", "value"]))
    headers: list[tuple[str, str]] = []
    if kind == "json":
        body = draw(_json_request())
    elif kind == "binary":
        body, extra = draw(_binary_request())
        headers += extra
    elif kind == "bytes":
        body = draw(st.binary(max_size=300))
    elif kind == "empty":
        body = b""
    else:
        body = json.dumps(draw(_json_values)).encode()
    content_type = draw(
        st.sampled_from(
            ["application/json"] * 4 + ["application/octet-stream", "text/plain", "", "\u00e9"]
        )
    )
    if content_type:
        headers.append(("Content-Type", content_type.encode("utf-8").decode("latin-1")))
    length = draw(st.integers(0, 19))
    if length == 0:  # a declared body above the limit: 413 before a byte of it is read
        headers.append(("Content-Length", str(draw(st.integers(MAX_BODY_BYTES + 1, 10**15)))))
        body = b""
    else:
        headers.append(("Content-Length", str(len(body))))
    if draw(st.integers(0, 9)) == 0:
        headers.append(
            (
                draw(
                    st.sampled_from(
                        ["x-request-id", "traceparent", "x-envoy-expected-rq-timeout-ms", "Accept"]
                    )
                ),
                draw(st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40)),
            )
        )
    method = draw(st.sampled_from(["POST"] * 30 + ["GET", "PUT", "DELETE", "HEAD"]))
    return RequestCase(method, draw(_paths()), tuple(headers), body)


# -- the server and the checks -------------------------------------------------------------


@dataclass
class FuzzServer:
    """A running ``inferway serve`` and where its log goes."""

    process: subprocess.Popen[bytes]
    port: int
    log: Path
    sent: int = 0
    statuses: dict[int, int] = field(default_factory=dict)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def healthy(self) -> bool:
        if self.process.poll() is not None:
            return False
        try:
            reply = httpx.get(f"http://127.0.0.1:{self.port}/v2/health/ready", timeout=5)
        except httpx.TransportError:
            return False
        return reply.status_code == 200


@contextmanager
def fuzz_server(workdir: Path, frontend: str = "fast") -> Iterator[FuzzServer]:
    """``inferway serve`` over the MODELS on free loopback ports, ready; stopped after."""
    repo = workdir / "models"
    for name, datatype in MODELS.items():
        build_add(repo / name / "1" / "model.onnx", datatype=datatype)
    http_port, grpc_port = free_ports("127.0.0.1", "127.0.0.1")
    log = workdir / "serve.log"
    args = [
        sys.executable,
        "-m",
        "inferway.cli.entry",
        "serve",
        str(repo),
        "--http-port",
        str(http_port),
        "--grpc-port",
        str(grpc_port),
        "--max-body-bytes",
        str(MAX_BODY_BYTES),
        "--http-frontend",
        frontend,
        "--log-format",
        "text",
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    server = FuzzServer(process, http_port, log)
    try:
        deadline = time.monotonic() + 60
        while not server.healthy():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"inferway serve did not start:\n{server.log_text()}")
            time.sleep(0.1)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def send(server: FuzzServer, case: RequestCase, timeout_s: float = 10.0) -> bytes:
    """What the server wrote back to ``case``: read until one whole answer is in (or the
    server closed), then a moment longer, so a second answer would show. (After an early
    answer, such as a 413 for a body never sent, aiohttp lingers reading the rest before it
    closes: the answer, not the close, is what is waited for.)"""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout_s) as sock:
        sock.sendall(case.wire())
        got = b""
        while not _whole(got, case.method == "HEAD"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
        else:
            sock.settimeout(0.05)
            try:
                while chunk := sock.recv(65536):
                    got += chunk
            except TimeoutError:
                pass
    server.sent += 1
    return got


def _whole(got: bytes, head_only: bool) -> bool:
    head, sep, rest = got.partition(b"\r\n\r\n")
    if not sep:
        return False
    if head_only:
        return True
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            return len(rest) >= int(value)
    return False


def check_answer(case: RequestCase, answer: bytes) -> tuple[int, str | None]:
    """(status, None) when ``answer`` is one whole HTTP answer with a 2xx/4xx status (strict
    JSON when it says JSON), else (status or 0, what is wrong)."""
    head, sep, rest = answer.partition(b"\r\n\r\n")
    if not sep:
        return 0, f"no whole answer: {answer[:200]!r}"
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        return 0, f"not an HTTP status line: {lines[0][:100]!r}"
    status = int(parts[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    if status >= 500 or status < 200:
        return status, f"status {status}: {rest[:300]!r}"
    if case.method == "HEAD":
        return status, None
    length = headers.get(b"content-length")
    if length is None:
        return status, "no Content-Length"
    body = rest[: int(length)]
    if len(rest) != int(length):
        return status, f"{len(rest)} bytes after the head, Content-Length {int(length)}"
    if headers.get(b"content-type", b"").startswith(b"application/json"):
        try:
            json.loads(body, parse_constant=_not_json)
        except ValueError as exc:
            return status, f"answer is not JSON ({exc}): {body[:200]!r}"
    return status, None


def _not_json(constant: str) -> object:
    raise ValueError(f"{constant} is not a JSON number")
