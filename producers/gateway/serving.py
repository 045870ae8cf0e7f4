"""The gRPC ingest gateway: authenticate, validate a batch whole, publish it, ack once Kafka has it.

One asyncio event loop (grpc.aio) serves every call; validation and ``produce`` run on it. With
hundreds of events per message the cost is per event (Avro decode, produce, delivery callback),
not per message (bench/gateway_throughput.py). librdkafka's delivery callbacks run on a poll
thread (and on the loop, when ``produce`` polls); each batch counts its records down under a
lock and settles its future on the loop once the last one is acknowledged or the first failed.

Exactly once per gateway: the ids of recent batches are remembered with their delivery. A
batch sent again whose records are still in flight waits for those, one already acknowledged
is acked again without publishing, and only one whose records the producer gave up on is
published again. A gateway restart forgets the ids; sinks dedup on ``event_id`` for that.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from functools import partial

import grpc
from confluent_kafka import KafkaError, Message

from producers.gateway.exceptions import GatewayError, GatewayUnavailable, InvalidBatch, RejectReason
from producers.gateway.metrics import GatewayMetrics
from producers.gateway.settings import GatewaySettings
from producers.gateway.validating import BatchValidator
from producers.publishing import EventPublisher, PublishError
from protos.gateway.v1 import ingest_pb2, ingest_pb2_grpc
from schemas.codec import AvroCodec
from schemas.exceptions import RegistryError
from schemas.settings import KafkaSettings
from schemas.topics import CATALOG, TopicSpec

log = logging.getLogger(__name__)

BATCH_ID_METADATA = "gpulens-batch-id"
"""Trailing metadata of an INVALID_ARGUMENT answer: the id of the batch that was refused."""


class _Delivery:
    """The records of one batch on their way to the broker; settles once, on the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, count: int) -> None:
        self.count = count
        self.future: asyncio.Future[str | None] = loop.create_future()
        """Settles with ``None`` once every record is acknowledged, else the first error."""
        self._loop = loop
        self._left = count
        self._lock = threading.Lock()

    @property
    def failed(self) -> bool:
        return self.future.done() and self.future.result() is not None

    def on_delivery(self, err: KafkaError | None, _message: Message | None) -> None:
        """librdkafka's callback, on the poll thread or the loop: one record answered."""
        with self._lock:
            if not self._left:  # a record failed before: the batch is settled already
                return
            if err is None:
                self._left -= 1
                if self._left:
                    return
            else:
                self._left = 0
        self._loop.call_soon_threadsafe(self._settle, None if err is None else err.str())

    def _settle(self, error: str | None) -> None:
        if not self.future.done():
            self.future.set_result(error)


@dataclass(frozen=True, slots=True)
class _Accepted:
    batch_id: str
    delivery: _Delivery
    duplicate: bool
    received_at: float


class IngestService(ingest_pb2_grpc.IngestServicer):
    """The ``Ingest`` service: every call authenticated, every batch checked, acks after Kafka's."""

    def __init__(
        self,
        settings: GatewaySettings,
        publisher: EventPublisher,
        validator: BatchValidator,
        metrics: GatewayMetrics,
    ) -> None:
        self._settings = settings
        self._publisher = publisher
        self._validator = validator
        self._metrics = metrics
        self._tokens = [f"Bearer {t.get_secret_value()}".encode() for t in settings.tokens]
        self._recent: OrderedDict[str, _Delivery] = OrderedDict()

    async def Publish(
        self, request_iterator: AsyncIterator[ingest_pb2.EventBatch], context: grpc.aio.ServicerContext
    ) -> ingest_pb2.PublishSummary:
        """Publish every batch of the call; answer once all are acknowledged."""
        await self._authenticate(context)
        accepted: list[_Accepted] = []
        try:
            async for batch in request_iterator:
                accepted.append(self._accept(batch))
            deadline = time.monotonic() + self._settings.ack_timeout_s
            for item in accepted:
                await self._acknowledged(item, deadline - time.monotonic())
        except GatewayError as err:
            await _abort(context, err)
        return ingest_pb2.PublishSummary(
            batches=len(accepted),
            events=sum(item.delivery.count for item in accepted),
            duplicates=sum(item.duplicate for item in accepted),
        )

    async def Stream(
        self, request_iterator: AsyncIterator[ingest_pb2.EventBatch], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[ingest_pb2.BatchAck]:
        """Publish batches as they come; ack each, in order, once Kafka has every record of it."""
        await self._authenticate(context)
        accepted: asyncio.Queue[_Accepted | GatewayError | None] = asyncio.Queue()
        reader = asyncio.create_task(self._read(request_iterator, accepted))
        try:
            while (item := await accepted.get()) is not None:
                if isinstance(item, GatewayError):
                    await _abort(context, item)
                    return
                try:
                    await self._acknowledged(item, self._settings.ack_timeout_s)
                except GatewayError as err:
                    await _abort(context, err)
                    return
                yield ingest_pb2.BatchAck(
                    batch_id=item.batch_id, events=item.delivery.count, duplicate=item.duplicate
                )
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def _read(
        self,
        request_iterator: AsyncIterator[ingest_pb2.EventBatch],
        accepted: asyncio.Queue[_Accepted | GatewayError | None],
    ) -> None:
        try:
            async for batch in request_iterator:
                accepted.put_nowait(self._accept(batch))
        except GatewayError as err:
            accepted.put_nowait(err)  # the batches before it are still acked, then the call ends
            return
        accepted.put_nowait(None)

    async def _authenticate(self, context: grpc.aio.ServicerContext) -> None:
        given = dict(context.invocation_metadata() or ()).get("authorization", "")
        presented = given.encode() if isinstance(given, str) else given
        if not any(hmac.compare_digest(presented, token) for token in self._tokens):
            self._metrics.rejected.labels(RejectReason.UNAUTHENTICATED.value).inc()
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "a valid `authorization: Bearer` token")

    def _accept(self, batch: ingest_pb2.EventBatch) -> _Accepted:
        """Check ``batch`` and hand its records to the producer, unless its id is known already."""
        received_at = time.monotonic()
        self._metrics.batches_received.inc()
        self._metrics.events_received.inc(len(batch.events))
        known = self._recent.get(batch.batch_id)
        if known is not None and not known.failed:
            self._metrics.duplicates.inc()
            return _Accepted(batch.batch_id, known, True, received_at)
        try:
            self._validator.check(batch)
        except InvalidBatch as err:
            self._metrics.rejected.labels(err.reason.value).inc()
            raise
        except RegistryError as err:  # not the batch's fault: the client sends it again later
            raise GatewayUnavailable(f"batch {batch.batch_id!r}: {err}") from err
        delivery = _Delivery(asyncio.get_running_loop(), len(batch.events))
        delivery.future.add_done_callback(partial(self._count_published, delivery.count))
        for event in batch.events:
            self._publisher.produce(event.topic, event.key, event.value, on_delivery=delivery.on_delivery)
        self._recent[batch.batch_id] = delivery
        self._recent.move_to_end(batch.batch_id)
        while len(self._recent) > self._settings.dedup_batches:
            self._recent.popitem(last=False)
        return _Accepted(batch.batch_id, delivery, False, received_at)

    def _count_published(self, count: int, future: asyncio.Future[str | None]) -> None:
        if future.result() is None:  # counted once per delivery, however often its id is sent
            self._metrics.events_published.inc(count)

    async def _acknowledged(self, item: _Accepted, timeout: float) -> None:
        """Wait until Kafka has every record of ``item``; :class:`GatewayUnavailable` otherwise."""
        try:
            error = await asyncio.wait_for(asyncio.shield(item.delivery.future), max(timeout, 0.0))
        except TimeoutError:
            error = f"no acknowledgement within {self._settings.ack_timeout_s:g}s"
        if error is not None:
            self._metrics.unavailable.inc()
            raise GatewayUnavailable(f"batch {item.batch_id!r}: Kafka did not take it: {error}")
        self._metrics.ack_latency.observe(time.monotonic() - item.received_at)


async def _abort(context: grpc.aio.ServicerContext, err: GatewayError) -> None:
    """End the call with the status code that says what the client should do about ``err``."""
    if isinstance(err, InvalidBatch):
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT, str(err), trailing_metadata=((BATCH_ID_METADATA, err.batch_id),)
        )
    await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))


class Gateway:
    """The server and its idempotent producer; :meth:`serve` runs it until told to stop."""

    def __init__(
        self,
        settings: GatewaySettings,
        kafka: KafkaSettings,
        codec: AvroCodec,
        *,
        topics: Iterable[TopicSpec] = CATALOG,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or GatewayMetrics()
        self.port: int | None = None
        """The port it listens on, once started (``settings.port``, or the one picked for 0)."""
        self.started = threading.Event()
        self._publisher = EventPublisher(
            kafka, codec, **{"message.timeout.ms": int(settings.delivery_timeout_s * 1000)}
        )
        self._validator = BatchValidator(codec, topics=topics, max_events=settings.max_batch_events)
        self._polling = threading.Event()

    async def serve(self, stop: asyncio.Event) -> None:
        """Listen until ``stop`` is set; then let calls finish, wait for Kafka, release everything."""
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", self.settings.max_message_bytes),
                ("grpc.max_send_message_length", self.settings.max_message_bytes),
            ]
        )
        service = IngestService(self.settings, self._publisher, self._validator, self.metrics)
        ingest_pb2_grpc.add_IngestServicer_to_server(service, server)  # type: ignore[no-untyped-call]
        self.port = self._listen(server)
        poller = threading.Thread(target=self._poll, name="gateway-delivery", daemon=True)
        self._polling.set()
        poller.start()
        try:
            await server.start()
            scheme = "TLS" if self.settings.tls_cert else "plaintext"
            log.info("ingest gateway on %s:%d (%s)", self.settings.host, self.port, scheme)
            self.started.set()
            await stop.wait()
            await server.stop(self.settings.shutdown_grace_s)
        finally:
            try:
                await asyncio.to_thread(self._publisher.flush, self.settings.shutdown_grace_s)
            except PublishError as err:
                log.warning("gateway stopped with records Kafka did not take: %s", err)
            self._polling.clear()
            await asyncio.to_thread(poller.join)

    def _listen(self, server: grpc.aio.Server) -> int:
        address = f"{self.settings.host}:{self.settings.port}"
        if self.settings.tls_cert and self.settings.tls_key:
            credentials = grpc.ssl_server_credentials(
                [(self.settings.tls_key.read_bytes(), self.settings.tls_cert.read_bytes())]
            )
            port = server.add_secure_port(address, credentials)
        else:
            port = server.add_insecure_port(address)
        if not port:
            raise GatewayError(f"cannot listen on {address}")
        return port

    def _poll(self) -> None:
        while self._polling.is_set():
            self._publisher.poll(0.1)


@contextlib.contextmanager
def running_gateway(gateway: Gateway) -> Iterator[Gateway]:
    """``gateway`` served on a thread of its own (tests, benchmarks, embedding), stopped on exit."""
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            loop.run_until_complete(gateway.serve(stop))
        except BaseException as err:  # handed to the thread that waits for the start
            failure.append(err)
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="gateway", daemon=True)
    thread.start()
    while not gateway.started.wait(0.05):
        if not thread.is_alive():
            raise GatewayError(f"the gateway did not start: {failure[0] if failure else 'unknown'}")
    try:
        yield gateway
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join()
