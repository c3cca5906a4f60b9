"""The fast HTTP front end (protocol/fast_http.py) over real sockets: it serves infer requests
itself and hands every other request, and the rest of its connection, to aiohttp. Raw HTTP on
purpose: keep-alive, pipelining, hang-ups and malformed requests are what it must get right."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from inferway.backends.app import BackendHandle, start_backend
from inferway.backends.serving.settings import ServingSettings
from inferway.backends.tls import BackendTls
from inferway.devtools.demo_models import build_add
from tests.helpers import poll_until
from tests.integration.tls_support import client_context, mint_pki
from tests.prometheus_text import parse_exposition, sample_value

pytestmark = pytest.mark.integration

FAST = ServingSettings(http_frontend="fast", max_body_bytes=64 * 1024)
INFER = {
    "inputs": [{"name": n, "datatype": "FP32", "shape": [1, 4], "data": [1] * 4} for n in "ab"]
}
SLOW = {"batching": {"mode": "fixed", "max_batch_size": 64, "max_queue_delay_s": 8.0}}


def _request(path: str, body: bytes = b"", method: str = "POST", headers: str = "") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: t\r\n{headers}"
    if method == "POST":
        head += f"Content-Length: {len(body)}\r\n"
    return (head + "\r\n").encode() + body


def _infer(model: str = "add", headers: str = "") -> bytes:
    return _request(f"/v2/models/{model}/infer", json.dumps(INFER).encode(), headers=headers)


async def _response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:] if line)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(lines[0].split()[1]), headers, body


async def _metric(backend: BackendHandle, **labels: str) -> float:
    reader, writer = await asyncio.open_connection("127.0.0.1", backend.http_port)
    writer.write(_request("/metrics", method="GET"))
    _, _, body = await _response(reader)
    writer.close()
    return sample_value(parse_exposition(body.decode()), **labels)


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[BackendHandle]:
    build_add(tmp_path / "add" / "1" / "model.onnx")
    build_add(tmp_path / "slow" / "1" / "model.onnx")
    (tmp_path / "slow" / "config.yaml").write_text(json.dumps(SLOW))
    handle = await start_backend(tmp_path, watch=False, settings=FAST)
    try:
        yield handle
    finally:
        await handle.stop()


def _binary_infer(row: np.ndarray, headers: str = "", path: str = "/v2/models/add/infer") -> bytes:
    """Both inputs of ``add`` set to ``row``, as binary, asking for binary outputs."""
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": n,
                    "datatype": "FP32",
                    "shape": [1, 4],
                    "parameters": {"binary_data_size": 16},
                }
                for n in "ab"
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    length = f"Inference-Header-Content-Length: {len(head)}\r\n"
    return _request(path, head + row.tobytes() * 2, headers=length + headers)


async def test_json_and_binary_infer_with_request_id_and_load_report(backend) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", backend.http_port)
    writer.write(_infer(headers="x-request-id: r-1\r\n"))
    status, headers, body = await _response(reader)
    assert status == 200 and headers["content-type"] == "application/json"
    assert headers["x-request-id"] == "r-1" and "endpoint-load-metrics" in headers
    assert json.loads(body)["outputs"][0]["data"] == [2, 2, 2, 2]
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    writer.write(_binary_infer(a, path="/v2/models/add/versions/1/infer"))
    status, headers, body = await _response(reader)
    assert status == 200 and headers["content-type"] == "application/octet-stream"
    size = int(headers["inference-header-content-length"])
    outputs = json.loads(body[:size])["outputs"]
    np.testing.assert_array_equal(np.frombuffer(body[size : size + 16], np.float32), (a + a)[0])
    assert outputs[0]["parameters"]["binary_data_size"] == 16
    writer.close()


async def test_requests_that_repeat_a_head_skip_the_parser_and_are_answered_in_order(
    backend,
) -> None:
    rows = [np.full((1, 4), i, np.float32) for i in range(6)]
    sent = [_binary_infer(row) for row in rows]
    sent[4] = _binary_infer(rows[4], headers="x-request-id: r-4\r\n")  # another head
    reader, writer = await asyncio.open_connection("127.0.0.1", backend.http_port)
    writer.write(sent[0])  # parsed, and its head remembered
    answers = [await _response(reader)]
    writer.write(sent[1] + sent[2] + sent[3][:-5])  # two repeats and one not all there yet
    await asyncio.sleep(0.05)
    writer.write(sent[3][-5:] + sent[4] + sent[5])
    answers += [await _response(reader) for _ in range(5)]
    writer.close()
    for i, (status, headers, body) in enumerate(answers):
        assert status == 200, body
        size = int(headers["inference-header-content-length"])
        np.testing.assert_array_equal(
            np.frombuffer(body[size : size + 16], np.float32), rows[i][0] * 2
        )
        assert headers.get("x-request-id") == ("r-4" if i == 4 else None)
    assert backend._fast is not None and backend._fast.repeated_heads >= 2


async def test_a_new_connection_per_request_repeats_the_last_head_and_still_closes(
    backend,
) -> None:
    """A client that opens a connection per request (``Connection: close``) sends the same
    head each time: after the first, the head is taken without the parser, and each answer
    still says close and closes the connection."""
    rows = [np.full((1, 4), i, np.float32) for i in range(4)]
    assert backend._fast is not None
    before = backend._fast.repeated_heads
    for row in rows:
        reader, writer = await asyncio.open_connection("127.0.0.1", backend.http_port)
        writer.write(_binary_infer(row, headers="Connection: close\r\n"))
        status, headers, body = await _response(reader)
        assert status == 200 and headers["connection"] == "close", body
        size = int(headers["inference-header-content-length"])
        np.testing.assert_array_equal(np.frombuffer(body[size : size + 16], np.float32), row[0] * 2)
        assert await asyncio.wait_for(reader.read(), 10) == b""  # the server closed it
        writer.close()
    assert backend._fast.repeated_heads - before >= len(rows) - 1
    # a keep-alive connection whose request differs from that head by one byte is parsed,
    # and its own head is kept
    reader, writer = await asyncio.open_connection("127.0.0.1", backend.http_port)
    for row in rows:
        writer.write(_binary_infer(row))
        status, headers, body = await _response(reader)
        assert status == 200 and "connection" not in headers
    writer.close()


async def test_other_routes_after_an_infer_on_one_connection_are_aiohttps(backend) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", backend.http_port)
    writer.write(_infer())
    assert (await _response(reader))[0] == 200
    writer.write(_request("/v2/health/ready", method="GET", headers="x-request-id: h\r\n"))
    status, headers, body = await _response(reader)
    assert (status, json.loads(body)) == (200, {"ready": True})
    assert headers["server"].startswith("Python/") and headers["x-request-id"] == "h"
    writer.write(_infer())  # aiohttp's connection now: it still serves infer, as always
    status, headers, body = await _response(reader)
    assert status == 200 and "endpoint-load-metrics" in headers
    writer.write(_request("/v2/models/add/infer", method="GET"))
    assert (await _response(reader))[0] == 405
    writer.close()
    assert await _metric(backend, name="inferway_backend_requests_total", code="200") == 2


async def test_pipelined_requests_are_answered_in_order_across_the_hand_off(backend) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", backend.http_port)
    bad = _request("/v2/models/add/infer", b"{not json")
    writer.write(_infer() + bad + _infer("nosuch") + _request("/v2/models/add", method="GET"))
    answers = [await _response(reader) for _ in range(4)]
    assert [a[0] for a in answers] == [200, 400, 404, 200]
    assert json.loads(answers[3][2])["name"] == "add"
    writer.close()


async def test_connection_close_and_http10_are_honoured(backend) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", backend.http_port)
    writer.write(_infer(headers="Connection: close\r\n"))
    status, headers, _ = await _response(reader)
    assert status == 200 and headers["connection"] == "close"
    assert await asyncio.wait_for(reader.read(), 10) == b""  # closed by the server
    writer.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", backend.http_port)
    body = json.dumps(INFER).encode()
    writer.write(
        b"POST /v2/models/add/infer HTTP/1.0\r\nConnection: keep-alive\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    status, headers, _ = await _response(reader)
    assert status == 200 and headers["connection"] == "keep-alive"
    writer.close()


async def test_a_client_that_hangs_up_is_not_computed_and_counts_as_499(backend) -> None:
    writers = []
    for _ in range(3):
        _, writer = await asyncio.open_connection("127.0.0.1", backend.http_port)
        writer.write(_infer("slow"))
        writers.append(writer)
    executor = backend.repository.get("slow").executor
    await poll_until(lambda: executor.queue_depth == 3, timeout=10, what="requests queued")
    for writer in writers:
        writer.close()
    await poll_until(lambda: executor.queue_depth == 0, timeout=10, what="queue emptied")
    assert executor.in_flight_batches == 0
    labels = {"name": "inferway_backend_requests_total", "model": "slow"}
    assert await _metric(backend, **labels, code="499") == 3
    assert await _metric(backend, name="inferway_backend_batch_size_count", model="slow") == 0


async def test_bodies_over_the_limit_get_413_and_the_server_keeps_serving(backend) -> None:
    big = b"x" * (FAST.max_body_bytes + 1)
    for extra in ("", "Expect: 100-continue\r\n"):
        reader, writer = await asyncio.open_connection("127.0.0.1", backend.http_port)
        writer.write(_request("/v2/models/add/infer", big, headers=extra))
        status, headers, body = await _response(reader)
        if status == 100:  # aiohttp's (handed off): it says continue, then refuses
            status, headers, body = await _response(reader)
        assert status == 413 and "endpoint-load-metrics" in headers
        assert "error" in json.loads(body)
        writer.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", backend.http_port)
    writer.write(_infer())
    assert (await _response(reader))[0] == 200
    writer.close()


async def test_malformed_http_gets_400_and_never_breaks_the_server(backend) -> None:
    for garbage in (
        b"NOT HTTP AT ALL\r\n\r\n",
        b"POST /v2/models/add/infer HTTP/1.1\r\nContent-Length: nope\r\n\r\n",
        b"POST /v2/models/add/infer HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
    ):
        reader, writer = await asyncio.open_connection("127.0.0.1", backend.http_port)
        writer.write(garbage)
        status, _, _ = await _response(reader)
        assert status == 400, garbage
        writer.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", backend.http_port)
    writer.write(_infer())
    assert (await _response(reader))[0] == 200
    writer.close()


async def test_tls_serves_the_fast_path_and_hands_off_with_the_same_context(tmp_path) -> None:
    pki = mint_pki(tmp_path / "certs")
    build_add(tmp_path / "models" / "add" / "1" / "model.onnx")
    tls = BackendTls(certificate=pki.server.certificate, private_key=pki.server.private_key)
    handle = await start_backend(tmp_path / "models", watch=False, settings=FAST, tls=tls)
    try:
        context = client_context(pki, None)
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", handle.http_port, ssl=context, server_hostname="localhost"
        )
        writer.write(_infer())
        assert (await _response(reader))[0] == 200
        writer.write(_request("/v2", method="GET"))
        status, _, body = await _response(reader)
        assert status == 200 and json.loads(body)["name"] == "inferway"
        writer.close()
        with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
            plain_reader, plain = await asyncio.open_connection("127.0.0.1", handle.http_port)
            plain.write(_infer())
            await _response(plain_reader)
    finally:
        await handle.stop()
