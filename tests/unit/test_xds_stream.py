"""The SotW ADS protocol, driven through in-memory streams (no network): ordering, ACK/NACK,
nonces, subscriptions, and stream independence."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from google.rpc import status_pb2

from inferway._xds_protos.envoy.config.core.v3 import base_pb2
from inferway._xds_protos.envoy.service.discovery.v3 import discovery_pb2
from inferway.xds import type_urls
from inferway.xds.cache import SnapshotCache
from inferway.xds.hooks import XdsObserver
from inferway.xds.snapshot import build_snapshot
from inferway.xds.stream import XdsProtocolError, serve_sotw_stream
from tests.xds_sample import build_sample_resources

CDS, EDS, LDS, RDS = type_urls.CLUSTER, type_urls.ENDPOINT, type_urls.LISTENER, type_urls.ROUTE
PROBE = "type.googleapis.com/inferway.test.Probe"


def sample(port: int = 10000, backends: tuple[int, ...] = (9001,)):
    return build_snapshot(build_sample_resources(listener_port=port, backend_ports=list(backends)))


class MemoryStream:
    """An ADS stream as two queues; ``send`` blocks when ``capacity`` responses are unread."""

    def __init__(self, cache: SnapshotCache, node_id: str, *, capacity: int = 0) -> None:
        self.node = base_pb2.Node(id=node_id, cluster="test")
        self.requests: asyncio.Queue[discovery_pb2.DiscoveryRequest | None] = asyncio.Queue()
        self.responses: asyncio.Queue[discovery_pb2.DiscoveryResponse] = asyncio.Queue(capacity)
        self._first = True
        self._probes = 0
        self.task = asyncio.create_task(serve_sotw_stream(self._iterate(), self.send, cache))

    async def _iterate(self) -> AsyncIterator[discovery_pb2.DiscoveryRequest]:
        while (request := await self.requests.get()) is not None:
            yield request

    async def send(self, response: discovery_pb2.DiscoveryResponse) -> None:
        await self.responses.put(response)

    def request(
        self,
        type_url: str,
        names: tuple[str, ...] = (),
        *,
        nonce: str = "",
        version: str = "",
        error: str | None = None,
    ) -> None:
        request = discovery_pb2.DiscoveryRequest(
            type_url=type_url,
            resource_names=list(names),
            response_nonce=nonce,
            version_info=version,
        )
        if self._first:
            request.node.CopyFrom(self.node)
            self._first = False
        if error is not None:
            request.error_detail.CopyFrom(status_pb2.Status(code=3, message=error))
        self.requests.put_nowait(request)

    def ack(self, response: discovery_pb2.DiscoveryResponse, names: tuple[str, ...] = ()) -> None:
        self.request(response.type_url, names, nonce=response.nonce, version=response.version_info)

    async def next(self, timeout: float = 2.0) -> discovery_pb2.DiscoveryResponse:
        return await asyncio.wait_for(self.responses.get(), timeout)

    async def settle(self) -> list[discovery_pb2.DiscoveryResponse]:
        """Everything sent before a probe's answer: events are handled in order, so once a
        fresh subscription to a probe type is answered, all earlier events were handled."""
        self._probes += 1
        self.request(f"{PROBE}{self._probes}", ("probe",))
        before = []
        while (response := await self.next()).type_url != f"{PROBE}{self._probes}":
            before.append(response)
        return before

    async def close(self) -> None:
        self.requests.put_nowait(None)
        await asyncio.wait_for(self.task, 2.0)


@pytest.fixture
async def cache():
    return SnapshotCache()


@pytest.fixture
async def streams(cache):
    opened: list[MemoryStream] = []

    def open_stream(node_id: str = "envoy-1", **kwargs) -> MemoryStream:
        stream = MemoryStream(cache, node_id, **kwargs)
        opened.append(stream)
        return stream

    yield open_stream
    for stream in opened:
        stream.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await stream.task


async def subscribe_all(stream: MemoryStream, order=(RDS, LDS, EDS, CDS)) -> None:
    names = {CDS: (), LDS: (), EDS: ("backend",), RDS: ("ingress",)}
    for type_url in order:
        stream.request(type_url, names[type_url])


async def test_listener_and_route_changes_go_out_once_the_cluster_change_is_answered(
    cache, streams
):
    cache.set_snapshot(sample())
    stream = streams()
    await subscribe_all(stream)  # subscribed in reverse order
    for response in [await stream.next() for _ in range(4)]:
        stream.ack(response, {EDS: ("backend",), RDS: ("ingress",)}.get(response.type_url, ()))
    assert await stream.settle() == []
    changed = build_snapshot(
        build_sample_resources(
            listener_port=10001, backend_ports=[9002], connect_timeout_ms=250, route_prefix="/v2"
        )
    )
    assert cache.set_snapshot(changed)
    first = [await stream.next() for _ in range(2)]
    assert [r.type_url for r in first] == [CDS, EDS]
    assert await stream.settle() == []  # listeners and routes wait for the CDS answer
    stream.ack(first[1], ("backend",))
    assert await stream.settle() == []  # an EDS answer is not enough
    stream.ack(first[0])
    responses = first + [await stream.next() for _ in range(2)]
    assert [r.type_url for r in responses] == [CDS, EDS, LDS, RDS]
    assert [r.version_info for r in responses] == [
        changed.versions[t] for t in (CDS, EDS, LDS, RDS)
    ]
    assert len({r.nonce for r in responses}) == 4
    assert all(len(r.resources) == 1 for r in responses)
    assert await stream.settle() == []


async def test_initial_requests_are_answered_with_the_current_snapshot(cache, streams):
    snapshot = sample()
    cache.set_snapshot(snapshot)
    stream = streams()
    stream.request(CDS)
    cds = await stream.next()
    assert (cds.type_url, cds.version_info) == (CDS, snapshot.versions[CDS])
    assert cds.resources[0].type_url == CDS


async def test_ack_is_recorded_per_type_and_wait_for_acks_completes(cache, streams):
    snapshot = sample()
    cache.set_snapshot(snapshot)
    stream = streams()
    await subscribe_all(stream, order=(CDS, EDS, LDS, RDS))
    responses = [await stream.next() for _ in range(4)]
    assert not await cache.wait_for_acks(snapshot.version, timeout=0.05)
    for response in responses:
        stream.ack(response, {EDS: ("backend",), RDS: ("ingress",)}.get(response.type_url, ()))
    assert await cache.wait_for_acks(snapshot.version, timeout=2.0)
    (status,) = cache.node_status()
    assert status.connected and status.node_id == "envoy-1" and status.cluster == "test"
    assert dict(status.acked) == {t: snapshot.versions[t] for t in (CDS, EDS, LDS, RDS)}
    assert await stream.settle() == []  # an ACK is not answered


async def test_nack_is_recorded_and_the_rejected_version_is_not_resent(cache, streams):
    cache.set_snapshot(sample())
    stream = streams()
    stream.request(CDS)
    rejected = await stream.next()
    stream.request(CDS, nonce=rejected.nonce, version="", error="cluster 'backend': bad ring")
    assert await stream.settle() == []
    (record,) = cache.nacks()
    assert (record.node_id, record.type_url) == ("envoy-1", CDS)
    assert (record.version, record.nonce) == (rejected.version_info, rejected.nonce)
    assert record.message == "cluster 'backend': bad ring"
    assert cache.node_status()[0].last_nack == record
    assert CDS not in cache.node_status()[0].acked
    # a snapshot change elsewhere (listener port) does not resend the rejected clusters
    cache.set_snapshot(sample(port=10001))
    assert await stream.settle() == []


async def test_a_changed_snapshot_is_sent_after_a_nack(cache, streams):
    cache.set_snapshot(sample())
    stream = streams()
    stream.request(CDS)
    rejected = await stream.next()
    stream.request(CDS, nonce=rejected.nonce, error="no")
    fixed = build_snapshot(
        build_sample_resources(listener_port=10000, backend_ports=[9001], connect_timeout_ms=250)
    )
    cache.set_snapshot(fixed)
    resent = await stream.next()
    assert resent.type_url == CDS
    assert resent.version_info == fixed.versions[CDS] != rejected.version_info
    assert resent.nonce != rejected.nonce
    stream.ack(resent)
    assert await stream.settle() == []
    assert cache.node_status()[0].acked[CDS] == fixed.versions[CDS]


async def test_a_subscription_change_resends_even_the_rejected_version(cache, streams):
    cache.set_snapshot(sample(backends=(9001,)))
    stream = streams()
    stream.request(EDS, ("backend",))
    rejected = await stream.next()
    stream.request(EDS, ("backend",), nonce=rejected.nonce, error="no")
    assert await stream.settle() == []
    stream.request(EDS, ("backend", "other"), nonce=rejected.nonce)
    again = await stream.next()
    assert again.version_info == rejected.version_info
    assert len(again.resources) == 1  # "other" does not exist: only what exists is sent


async def test_a_request_repeating_an_acked_nonce_is_answered_again(cache, streams):
    """Envoy re-subscribes EDS for a cluster rebuilt by a CDS update with the old nonce, and
    keeps the cluster warming until it gets an answer."""
    cache.set_snapshot(sample())
    stream = streams()
    stream.request(EDS, ("backend",))
    first = await stream.next()
    stream.ack(first, ("backend",))
    assert await stream.settle() == []
    stream.ack(first, ("backend",))
    again = await stream.next()
    assert (again.version_info, len(again.resources)) == (first.version_info, 1)
    assert again.nonce != first.nonce
    stream.ack(again, ("backend",))
    assert await stream.settle() == []
    # a repeated NACK still does not bring the rejected version back
    cache.set_snapshot(sample(backends=(9002,)))
    rejected = await stream.next()
    stream.request(EDS, ("backend",), nonce=rejected.nonce, error="no")
    stream.request(EDS, ("backend",), nonce=rejected.nonce, error="no")
    assert await stream.settle() == []
    assert len(cache.nacks()) == 1


async def test_eds_sends_only_the_requested_names(cache, streams):
    resources = build_sample_resources(listener_port=10000, backend_ports=[9001])
    two = dict(resources.by_type)
    base = resources.of_type(EDS)["backend"]
    extra = type(base)()
    extra.CopyFrom(base)
    extra.cluster_name = "other"
    two[EDS] = {"backend": base, "other": extra}
    cache.set_snapshot(
        build_snapshot(type(resources).build({t: m.items() for t, m in two.items()}))
    )
    stream = streams()
    stream.request(EDS, ("other",))
    first = await stream.next()
    assert [r.value for r in first.resources] == [extra.SerializeToString()]
    stream.request(EDS, ("backend", "other"), nonce=first.nonce, version=first.version_info)
    both = await stream.next()
    assert len(both.resources) == 2 and both.version_info == first.version_info


async def test_unchanged_snapshot_pushes_nothing(cache, streams):
    cache.set_snapshot(sample())
    stream = streams()
    stream.request(CDS)
    stream.ack(await stream.next())
    assert cache.set_snapshot(sample()) is False
    assert await stream.settle() == []


async def test_stale_nonce_is_ignored(cache, streams):
    cache.set_snapshot(sample())
    stream = streams()
    stream.request(CDS)
    first = await stream.next()
    cache.set_snapshot(sample(backends=(9002,)))  # EDS only changes; CDS stays
    cache.set_snapshot(
        build_snapshot(
            build_sample_resources(
                listener_port=10000, backend_ports=[9002], connect_timeout_ms=250
            )
        )
    )
    second = await stream.next()
    assert second.nonce != first.nonce
    stream.request(CDS, nonce=first.nonce, error="late NACK of the old response")
    stream.request(CDS, nonce="never-sent")
    assert await stream.settle() == []
    assert cache.nacks() == []
    assert CDS not in cache.node_status()[0].acked


async def test_two_streams_are_independent_and_a_stalled_one_blocks_nobody(cache, streams):
    cache.set_snapshot(sample())
    stalled = streams("envoy-stalled", capacity=1)
    healthy = streams("envoy-healthy")
    stalled.request(CDS)
    stalled.request(LDS)  # its second response blocks in send(): nobody reads it
    healthy.request(CDS)
    first = await healthy.next()
    healthy.ack(first)
    cache.set_snapshot(
        build_snapshot(
            build_sample_resources(
                listener_port=10000, backend_ports=[9001], connect_timeout_ms=250
            )
        )
    )
    update = await healthy.next()
    assert update.version_info != first.version_info
    healthy.ack(update)
    assert await healthy.settle() == []
    acked = {s.node_id: dict(s.acked) for s in cache.node_status()}
    assert acked == {"envoy-healthy": {CDS: update.version_info}, "envoy-stalled": {}}


async def test_disconnect_marks_the_node_disconnected(cache, streams):
    cache.set_snapshot(sample())
    stream = streams()
    stream.request(CDS)
    await stream.next()
    assert cache.node_status()[0].connected
    await stream.close()
    (status,) = cache.node_status()
    assert not status.connected
    assert not await cache.wait_for_acks(cache.get_snapshot().version, timeout=0.01)


async def test_first_request_without_node_is_a_protocol_error(cache):
    async def requests():
        yield discovery_pb2.DiscoveryRequest(type_url=CDS)

    async def send(_response):
        raise AssertionError("nothing may be sent")

    with pytest.raises(XdsProtocolError, match=r"node\.id"):
        await serve_sotw_stream(requests(), send, cache)


async def test_hooks_observe_pushes_acks_nacks_and_a_failing_hook_breaks_nothing(cache, streams):
    seen: list[tuple] = []

    class Recorder(XdsObserver):
        def on_connect(self, status):
            seen.append(("connect", status.node_id))

        def on_push(self, node_id, type_url, version, count):
            seen.append(("push", type_url, count))

        def on_ack(self, node_id, type_url, version):
            seen.append(("ack", type_url))

        def on_nack(self, record):
            seen.append(("nack", record.type_url, record.message))

        def on_disconnect(self, status):
            seen.append(("disconnect", status.node_id, status.connected))

    class Broken(XdsObserver):
        def on_push(self, *args):
            raise RuntimeError("metrics backend down")

    cache.add_hook(Broken())
    cache.add_hook(Recorder())
    with pytest.raises(TypeError):
        cache.add_hook(object())
    cache.set_snapshot(sample())
    stream = streams()
    stream.request(CDS)
    stream.request(LDS)
    cds, lds = await stream.next(), await stream.next()
    stream.ack(cds)
    stream.request(LDS, nonce=lds.nonce, error="bad listener")
    await stream.settle()
    await stream.close()
    assert seen[:3] == [("connect", "envoy-1"), ("push", CDS, 1), ("push", LDS, 1)]
    assert ("ack", CDS) in seen and ("nack", LDS, "bad listener") in seen
    assert seen[-1] == ("disconnect", "envoy-1", False)


async def test_a_held_stage_goes_out_when_the_client_does_not_answer_in_time(
    cache, streams, monkeypatch
):
    from inferway.xds import stream as stream_module

    monkeypatch.setattr(stream_module, "HOLD_TIMEOUT_S", 0.2)
    cache.set_snapshot(sample())
    stream = streams()
    await subscribe_all(stream)
    for response in [await stream.next() for _ in range(4)]:
        stream.ack(response, {EDS: ("backend",), RDS: ("ingress",)}.get(response.type_url, ()))
    assert await stream.settle() == []
    changed = build_snapshot(
        build_sample_resources(
            listener_port=10001, backend_ports=[9002], connect_timeout_ms=250, route_prefix="/v2"
        )
    )
    assert cache.set_snapshot(changed)
    first = [await stream.next() for _ in range(2)]
    assert [r.type_url for r in first] == [CDS, EDS]
    # no answer to CDS: after the hold timeout the listeners and routes go anyway
    rest = [await stream.next(timeout=2.0) for _ in range(2)]
    assert [r.type_url for r in rest] == [LDS, RDS]
