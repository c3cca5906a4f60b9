"""The LLM processor's reports port on loopback, without Envoy: each report's body reaches the
processor whole, its 200 comes only once the processor has taken it (a final report is
recorded before Envoy passes the answer's end on), answers keep the requests' order on a
keep-alive connection, a report the processor fails on still gets its 200 (and is counted),
another path gets 404, and bytes that are not HTTP close the connection."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from inferway.gateway.llm.report_lane import ReportLane
from inferway.xds.translate.llm_stream import REPORT_PATH

pytestmark = pytest.mark.asyncio


class Taker:
    """The processor's side: records each body; a body starting with ``hold`` waits for
    ``release``, one starting with ``fail`` raises."""

    def __init__(self) -> None:
        self.taken: list[bytes] = []
        self.release = asyncio.Event()

    async def __call__(self, body: bytes) -> None:
        if body.startswith(b"hold"):
            await self.release.wait()
        if body.startswith(b"fail"):
            raise RuntimeError("the processor failed on this report")
        self.taken.append(body)


@pytest.fixture
async def lane() -> AsyncIterator[tuple[ReportLane, Taker]]:
    taker = Taker()
    started = await ReportLane("127.0.0.1", 0, taker).start()
    try:
        yield started, taker
    finally:
        await started.stop()


def _post(body: bytes, path: str = REPORT_PATH) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nhost: reports\r\ncontent-length: {len(body)}\r\n\r\n"
    return head.encode() + body


async def _status(reader: asyncio.StreamReader) -> int:
    head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).decode("latin-1")
    assert "content-length: 0" in head.lower()
    return int(head.split()[1])


@asynccontextmanager
async def _connected(
    reports: ReportLane,
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """One connection to the reports port, as Envoy's keep-alive connection; closed after."""
    reader, writer = await asyncio.open_connection("127.0.0.1", reports.port)
    try:
        yield reader, writer
    finally:
        writer.close()


async def test_reports_are_taken_whole_and_answered_in_order_after_they_are_taken(
    lane: tuple[ReportLane, Taker],
) -> None:
    reports, taker = lane
    async with _connected(reports) as (reader, writer):
        report = b'{"id":"a-1","final":false}\n'
        writer.write(_post(report))
        assert await _status(reader) == 200 and taker.taken == [report]
        # a held (final) report, then another pipelined behind it: neither answer comes
        # before the held one is taken, and they come in order
        writer.write(_post(b"hold final") + _post(b"after"))
        await asyncio.sleep(0.1)
        assert taker.taken == [report, b"after"]  # taken, but its answer waits its turn
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 0.2)
        taker.release.set()
        assert [await _status(reader), await _status(reader)] == [200, 200]
        assert taker.taken == [report, b"after", b"hold final"]
        assert reports.requests == 3 and reports.errors == 0


async def test_a_failed_report_still_answers_and_other_paths_are_not_found(
    lane: tuple[ReportLane, Taker],
) -> None:
    reports, taker = lane
    async with _connected(reports) as (reader, writer):
        writer.write(_post(b"fail"))
        assert await _status(reader) == 200  # Envoy's stream goes on; the failure is logged
        assert reports.errors == 1 and taker.taken == []
        writer.write(_post(b"x", path="/elsewhere"))
        assert await _status(reader) == 404 and taker.taken == []


async def test_bytes_that_are_not_http_close_the_connection(
    lane: tuple[ReportLane, Taker],
) -> None:
    reports, _ = lane
    reader, writer = await asyncio.open_connection("127.0.0.1", reports.port)
    writer.write(b"\x00\x01 not http\r\n\r\n")
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    assert reports.requests == 0


async def test_a_taken_port_is_named_in_the_error(lane: tuple[ReportLane, Taker]) -> None:
    reports, taker = lane
    with pytest.raises(
        OSError,
        match=rf"reports port: cannot listen on 127.0.0.1:{reports.port}: .*llm.reports_port",
    ):
        await ReportLane("127.0.0.1", reports.port, taker).start()
