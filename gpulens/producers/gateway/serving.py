"""The gRPC ingest gateway: authenticate, validate a batch whole, publish it, ack once Kafka has it.

One asyncio event loop (grpc.aio) does everything: it checks a batch (validating.py), hands
its records, still encoded, to the idempotent producer in one ``produce_batch`` per topic, and
polls the producer, so librdkafka's delivery callbacks run on the loop too: a batch counts its
records down without a lock and settles its future once the last is acknowledged or the first
failed. No other thread takes the GIL per record (a poll thread cost a third of the throughput
in handing it back and forth). A batch is produced only once the producer's queue has room for
all of it, so that none of it can be refused at enqueue while the rest goes out.

Exactly once per gateway: the ids of recent batches are remembered with their delivery and a
hash of their events. A batch sent again whose records are still in flight waits for those,
one already acknowledged is acked again without publishing, and only one whose records the
producer gave up on is published again. A known id with other events is a client bug and is
refused (ALREADY_EXISTS), never acked as a resend. A gateway restart forgets the ids; sinks
dedup on ``event_id`` for that.

A batch's watermarks (records of ``gpulens.watermarks.v1``) are produced only once the broker
acknowledged every other record of it: a watermark promises that its source's earlier records
are on the broker, and the producer would otherwise send the topics of one batch side by side.
Across batches the client keeps that promise itself: the agent sends a watermark only once
every earlier batch of it was acked (:meth:`~gpulens.producers.agent.running.NodeAgent.vouch`).

A message that does not parse as an EventBatch is refused with INVALID_ARGUMENT: grpc hands
the parse error to the handler's request iterator, where it is translated.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

import grpc
from confluent_kafka import KafkaError, KafkaException, Message, Producer
from google.protobuf.message import DecodeError as ProtobufDecodeError

from gpulens.producers.gateway.exceptions import (
    BatchIdReused,
    GatewayError,
    GatewayUnavailable,
    InvalidBatch,
    RejectReason,
)
from gpulens.producers.gateway.metrics import GatewayMetrics
from gpulens.producers.gateway.settings import GatewaySettings
from gpulens.producers.gateway.validating import BatchValidator, Checked
from gpulens.protos.gateway.v1 import ingest_pb2, ingest_pb2_grpc
from gpulens.protos.lens.v1 import exporter_pb2_grpc
from gpulens.schemas.kafka.settings import KafkaSettings
from gpulens.schemas.model.exceptions import RegistryError
from gpulens.schemas.model.topics import CATALOG, CONTAINERS, WATERMARKS, TopicSpec
from gpulens.schemas.wire.codec import AvroCodec

log = logging.getLogger(__name__)

BATCH_ID_METADATA = "gpulens-batch-id"
"""Trailing metadata of an INVALID_ARGUMENT or ALREADY_EXISTS answer: the id of the batch refused."""


_QUEUE_MESSAGES = 500_000
"""Records the producer may hold (queue.buffering.max.messages); a batch waits for room."""
_QUEUE_KBYTES = 1_048_576
"""Their bytes (queue.buffering.max.kbytes); the gateway keeps half of it for whole batches."""
_RECORD_OVERHEAD = 512
"""Bytes librdkafka adds to a record's key and value when it checks message.max.bytes (~40)."""
_POLL_S = 0.005
"""How often the producer is polled while records are out (an ack waits at most this long more)."""
_IDLE_POLL_S = 0.05
"""How often when none are (librdkafka still has errors and statistics to hand over)."""


class _Delivery:
    """The records of one batch on their way to the broker; settles once, on the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, count: int, size: int, content: int) -> None:
        self.count = count
        self.size = size
        """Bytes of the batch as it arrived: an upper bound of what it holds in the producer."""
        self.content = content
        """Hash of the batch's serialized events: a resend has the same, a reused id another."""
        self.future: asyncio.Future[str | None] = loop.create_future()
        """Settles with ``None`` once every record is acknowledged, else the first error."""
        self._left = count
        self._held: tuple[int, Callable[[], None]] | None = None
        """(records held back, how to produce them): once only they are left unacknowledged."""

    def hold(self, count: int, produce: Callable[[], None]) -> None:
        """``count`` records of the batch are produced by ``produce`` once every other one is
        acknowledged (at once if none is left)."""
        self._held = (count, produce)
        self._release()

    def _release(self) -> None:
        if self._held is not None and self._left == self._held[0]:
            produce = self._held[1]
            self._held = None
            produce()

    @property
    def failed(self) -> bool:
        return self.future.done() and self.future.result() is not None

    def on_delivery(self, err: KafkaError | None, _message: Message | None) -> None:
        """librdkafka's callback, inside ``poll`` on the event loop: one record answered."""
        if err is None:
            self._left -= 1
            if not self._left:
                self.future.set_result(None)
            else:
                self._release()
        elif self._left > 0:  # the first failure settles it; later answers change nothing
            self._left = -self.count
            self.future.set_result(err.str())

    def fail(self, error: str) -> None:
        """Settle it as failed before the broker answered (records the producer refused)."""
        if not self.future.done():
            self._left = -self.count
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
        producer: Producer,
        validator: BatchValidator,
        metrics: GatewayMetrics,
    ) -> None:
        self._settings = settings
        self._producer = producer
        self._validator = validator
        self._metrics = metrics
        self._tokens = [f"Bearer {t.get_secret_value()}".encode() for t in settings.tokens]
        self._recent: OrderedDict[str, _Delivery] = OrderedDict()
        self._queued_bytes = 0
        """Bytes of the batches in the producer, as they arrived; see :meth:`_room`."""

    async def Publish(
        self, request_iterator: AsyncIterator[ingest_pb2.EventBatch], context: grpc.aio.ServicerContext
    ) -> ingest_pb2.PublishSummary:
        """Publish every batch of the call; answer once all are acknowledged."""
        await self.authenticate(context)
        accepted: list[_Accepted] = []
        try:
            async for batch in self._parsed(request_iterator):
                accepted.append(await self.accept(batch))
            deadline = time.monotonic() + self._settings.ack_timeout_s
            for item in accepted:
                await self.acknowledged(item, deadline - time.monotonic())
        except GatewayError as err:
            await abort(context, err)
        return ingest_pb2.PublishSummary(
            batches=len(accepted),
            events=sum(item.delivery.count for item in accepted),
            duplicates=sum(item.duplicate for item in accepted),
        )

    async def Stream(
        self, request_iterator: AsyncIterator[ingest_pb2.EventBatch], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[ingest_pb2.BatchAck]:
        """Publish batches as they come; ack each, in order, once Kafka has every record of it."""
        await self.authenticate(context)
        accepted: asyncio.Queue[_Accepted | GatewayError | None] = asyncio.Queue()
        reader = asyncio.create_task(self._read(request_iterator, accepted))
        try:
            while (item := await accepted.get()) is not None:
                if isinstance(item, GatewayError):
                    await abort(context, item)
                    return
                try:
                    await self.acknowledged(item, self._settings.ack_timeout_s)
                except GatewayError as err:
                    await abort(context, err)
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
            async for batch in self._parsed(request_iterator):
                accepted.put_nowait(await self.accept(batch))
        except GatewayError as err:
            accepted.put_nowait(err)  # the batches before it are still acked, then the call ends
            return
        accepted.put_nowait(None)

    async def _parsed(
        self, request_iterator: AsyncIterator[ingest_pb2.EventBatch]
    ) -> AsyncIterator[ingest_pb2.EventBatch]:
        """The call's batches; :class:`InvalidBatch` for a message that is not an EventBatch."""
        try:
            async for batch in request_iterator:
                yield batch
        except ProtobufDecodeError as err:
            self._metrics.rejected.labels(RejectReason.UNDECODABLE_BATCH.value).inc()
            raise InvalidBatch(
                "", RejectReason.UNDECODABLE_BATCH, f"the message is not an EventBatch: {err}"
            ) from err

    @property
    def ack_timeout_s(self) -> float:
        """How long a batch waits for the broker's acknowledgement (gateway.ack_timeout_s)."""
        return self._settings.ack_timeout_s

    async def authenticate(self, context: grpc.aio.ServicerContext) -> None:
        """Abort the call with UNAUTHENTICATED unless it carries one of the gateway's tokens."""
        given = dict(context.invocation_metadata() or ()).get("authorization", "")
        presented = given.encode() if isinstance(given, str) else given
        if not any(hmac.compare_digest(presented, token) for token in self._tokens):
            self._metrics.rejected.labels(RejectReason.UNAUTHENTICATED.value).inc()
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "a valid `authorization: Bearer` token")

    async def accept(self, batch: ingest_pb2.EventBatch) -> _Accepted:
        """Check ``batch`` and hand its records to the producer, unless its id is known already."""
        received_at = time.monotonic()
        size = batch.ByteSize()
        await self._room(len(batch.events), size)  # from here on nothing awaits: no call interleaves
        self._metrics.batches_received.inc()
        self._metrics.events_received.inc(len(batch.events))
        # The id is part of it: under one id, equal hashes are equal events. A resend is the
        # message the client kept, serialized alike (GatewayPublisher resends the same object).
        content = hash(batch.SerializeToString())
        known = self._recent.get(batch.batch_id)
        if known is not None and known.content != content:
            self._metrics.rejected.labels(RejectReason.BATCH_ID_REUSED.value).inc()
            raise BatchIdReused(batch.batch_id)
        if known is not None and not known.failed:
            self._metrics.duplicates.inc()
            return _Accepted(batch.batch_id, known, True, received_at)
        try:
            checked = self._validator.check(batch)
        except InvalidBatch as err:
            self._metrics.rejected.labels(err.reason.value).inc()
            raise
        except RegistryError as err:  # not the batch's fault: the client sends it again later
            raise GatewayUnavailable(f"batch {batch.batch_id!r}: {err}") from err
        delivery = _Delivery(asyncio.get_running_loop(), len(batch.events), size, content)
        delivery.future.add_done_callback(partial(self._settled, delivery))
        self._queued_bytes += size
        self._produce(checked, delivery)
        self._recent[batch.batch_id] = delivery
        self._recent.move_to_end(batch.batch_id)
        while len(self._recent) > self._settings.dedup_batches:
            self._recent.popitem(last=False)
        return _Accepted(batch.batch_id, delivery, False, received_at)

    async def _room(self, count: int, size: int) -> None:
        """Wait until the producer's queue can take ``count`` records of ``size`` bytes in all.

        Only this loop produces, so room seen here is still there when the batch is produced:
        ``produce_batch`` never refuses a record for a full queue, which would leave the batch
        half published (and the records after the refused one possibly overtaking it)."""
        while len(self._producer) + count > _QUEUE_MESSAGES or (
            self._queued_bytes and self._queued_bytes + size > _QUEUE_KBYTES * 512
        ):
            self._producer.poll(0)
            await asyncio.sleep(0.005)

    def _produce(self, checked: Checked, delivery: _Delivery) -> None:
        """Queue the batch's records, each topic's in one call, its watermarks once the broker
        acknowledged every other record of the batch; then serve the callbacks due."""
        marks = checked.pop(WATERMARKS.name, None) if len(checked) > 1 else None
        self._produce_topics(checked, delivery)
        if marks is not None and not delivery.failed:
            delivery.hold(len(marks), partial(self._produce_topics, {WATERMARKS.name: marks}, delivery))
        self._producer.poll(0)

    def _produce_topics(self, checked: Checked, delivery: _Delivery) -> None:
        for topic, records in checked.items():
            # Plain dicts, as produce_batch takes them: it writes a refused one's "_error" into it.
            messages = cast(list[dict[str, Any]], records)
            try:
                self._producer.produce_batch(topic, messages, on_delivery=delivery.on_delivery)
            except (KafkaException, BufferError, TypeError) as err:
                delivery.fail(f"the producer refused the batch: {err}")
                return
            refused = [message["_error"] for message in messages if "_error" in message]
            if refused:  # never expected (sizes are checked, room is made): the batch is resent
                log.error("the producer refused %d records of a batch: %s", len(refused), refused[0])
                delivery.fail(f"the producer refused {len(refused)} records: {refused[0]}")
                return

    def _settled(self, delivery: _Delivery, future: asyncio.Future[str | None]) -> None:
        self._queued_bytes -= delivery.size
        if future.result() is None:  # counted once per delivery, however often its id is sent
            self._metrics.events_published.inc(delivery.count)

    async def acknowledged(self, item: _Accepted, timeout: float) -> None:
        """Wait until Kafka has every record of ``item``; :class:`GatewayUnavailable` otherwise."""
        try:
            error = await asyncio.wait_for(asyncio.shield(item.delivery.future), max(timeout, 0.0))
        except TimeoutError:
            error = f"no acknowledgement within {self._settings.ack_timeout_s:g}s"
        if error is not None:
            self._metrics.unavailable.inc()
            raise GatewayUnavailable(f"batch {item.batch_id!r}: Kafka did not take it: {error}")
        self._metrics.ack_latency.observe(time.monotonic() - item.received_at)


async def abort(context: grpc.aio.ServicerContext, err: GatewayError) -> None:
    """End the call with the status code that says what the client should do about ``err``."""
    if isinstance(err, InvalidBatch | BatchIdReused):
        code = (
            grpc.StatusCode.INVALID_ARGUMENT
            if isinstance(err, InvalidBatch)
            else grpc.StatusCode.ALREADY_EXISTS
        )
        await context.abort(code, str(err), trailing_metadata=((BATCH_ID_METADATA, err.batch_id),))
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
        cluster: str = "default",
        containers: TopicSpec = CONTAINERS,
    ) -> None:
        self.settings = settings
        self._codec = codec
        self._cluster = cluster
        """The cluster of the records made from Primus-Lens's events (which name none)."""
        self._containers = containers
        self.metrics = metrics or GatewayMetrics()
        self.port: int | None = None
        """The port it listens on, once started (``settings.port``, or the one picked for 0)."""
        self.started = threading.Event()
        config = kafka.producer(
            **{
                "enable.idempotence": True,
                "linger.ms": 20,
                "batch.num.messages": 10_000,
                "queue.buffering.max.messages": _QUEUE_MESSAGES,
                "queue.buffering.max.kbytes": _QUEUE_KBYTES,
                "message.timeout.ms": int(settings.delivery_timeout_s * 1000),
            }
        )
        self._producer = Producer(config)
        self._validator = BatchValidator(
            codec,
            topics=topics,
            max_events=settings.max_batch_events,
            # librdkafka refuses a record whose key, value and framing exceed message.max.bytes
            max_record_bytes=int(config.get("message.max.bytes", 1_000_000)) - _RECORD_OVERHEAD,
        )

    async def serve(self, stop: asyncio.Event) -> None:
        """Listen until ``stop`` is set; then let calls finish, wait for Kafka, release everything."""
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", self.settings.max_message_bytes),
                ("grpc.max_send_message_length", self.settings.max_message_bytes),
            ]
        )
        service = IngestService(self.settings, self._producer, self._validator, self.metrics)
        ingest_pb2_grpc.add_IngestServicer_to_server(service, server)
        from gpulens.producers.gateway.lens import ExporterService  # it imports this module

        lens = ExporterService(
            service, self._codec, self.metrics, cluster=self._cluster, topic=self._containers
        )
        exporter_pb2_grpc.add_ExporterServiceServicer_to_server(lens, server)
        self.port = self._listen(server)
        poller = asyncio.create_task(self._poll())
        try:
            await server.start()
            scheme = "TLS" if self.settings.tls_cert else "plaintext"
            log.info("ingest gateway on %s:%d (%s)", self.settings.host, self.port, scheme)
            self.started.set()
            await stop.wait()
            await server.stop(self.settings.shutdown_grace_s)
        finally:
            deadline = time.monotonic() + self.settings.shutdown_grace_s
            while len(self._producer) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)  # the poller serves the last callbacks
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
            if len(self._producer):
                log.warning("gateway stopped with %d records Kafka did not take", len(self._producer))

    def _listen(self, server: grpc.aio.Server) -> int:
        address = f"{self.settings.host}:{self.settings.port}"
        port: int  # 0 when grpc could not bind
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

    async def _poll(self) -> None:
        """Serve the producer's callbacks on the loop: every few ms while records are out."""
        while True:
            self._producer.poll(0)
            await asyncio.sleep(_POLL_S if len(self._producer) else _IDLE_POLL_S)


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
