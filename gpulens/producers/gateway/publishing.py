"""Publishing through the ingest gateway: the :class:`BasePublisher` contract over one gRPC stream.

Records gather into batches (``batch_events``, or whatever is there after ``linger_s``) that
travel on one bidirectional ``Stream`` call, so they reach Kafka in the order they were
produced. A batch's delivery callbacks run, inside :meth:`GatewayPublisher.poll` on the
caller's thread, once the gateway acked it, which it does only after the broker acknowledged
every record. When the stream breaks (gateway or Kafka away: UNAVAILABLE, a lost connection)
the batches not yet acked are sent again, with the same ids and in the same order, on a new
stream after ``retry_backoff_s``, until ``delivery_timeout_s``: like librdkafka's own retries
until ``message.timeout.ms``, and safe because the gateway publishes a batch id once. A batch
refused as invalid, or a token refused, fails its records at once: resending cannot help.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc
from confluent_kafka import KafkaError

from gpulens.producers.gateway.serving import BATCH_ID_METADATA
from gpulens.producers.gateway.settings import GatewayClientSettings
from gpulens.producers.publishing import BasePublisher, DeliveryCallback, PublishError
from gpulens.protos.gateway.v1 import ingest_pb2, ingest_pb2_grpc
from gpulens.schemas.wire.codec import AvroCodec

log = logging.getLogger(__name__)

_PERMANENT = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
_REFUSED = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS)
"""Answers that refuse one batch (named in the trailing metadata): it fails, the rest are resent."""


@dataclass
class _Batch:
    message: ingest_pb2.EventBatch
    callbacks: list[DeliveryCallback | None] = field(default_factory=list)
    queued_at: float = 0.0
    """When it was closed for sending: its delivery timeout counts from here."""


@dataclass(frozen=True, slots=True)
class _Ended:
    """The stream ``generation`` ended, with the gateway's error or cleanly (``None``)."""

    generation: int
    error: grpc.RpcError | None


_END = object()


class GatewayPublisher(BasePublisher):
    """Sends encoded records to the gateway; a stand-in for :class:`EventPublisher` by configuration."""

    def __init__(
        self, settings: GatewayClientSettings, codec: AvroCodec, *, delivery_timeout_s: float = 30.0
    ) -> None:
        super().__init__(codec)
        self._settings = settings
        self._delivery_timeout_s = delivery_timeout_s
        if settings.tls_ca is not None:
            credentials = grpc.ssl_channel_credentials(settings.tls_ca.read_bytes())
            self._channel = grpc.secure_channel(settings.address, credentials)
        else:
            self._channel = grpc.insecure_channel(settings.address)
        self._stub = ingest_pb2_grpc.IngestStub(self._channel)
        token = settings.token.get_secret_value() if settings.token else ""
        self._metadata = (("authorization", f"Bearer {token}"),)
        self._open: _Batch | None = None
        self._opened_at = 0.0
        self._unacked: dict[str, _Batch] = {}
        """Sent batches by id, oldest first: what a new stream sends again."""
        self._inbox: queue.SimpleQueue[ingest_pb2.BatchAck | _Ended] = queue.SimpleQueue()
        self._requests: queue.SimpleQueue[object] | None = None
        self._call: grpc.Future | None = None
        self._reader: threading.Thread | None = None
        self._generation = 0
        self._retry_at = 0.0
        self._failures: list[str] = []
        self.published = 0
        """Records the gateway acknowledged."""

    # --- the BasePublisher contract -------------------------------------------------------------

    def produce(
        self, topic: str, key: bytes | None, value: bytes, *, on_delivery: DeliveryCallback | None = None
    ) -> None:
        """Add the record to the open batch; a full batch leaves at once, once fewer than
        ``max_unacked_batches`` wait for their ack."""
        if self._open is None:
            self._open = _Batch(ingest_pb2.EventBatch(batch_id=uuid.uuid4().hex))
            self._opened_at = time.monotonic()
        self._open.message.events.add(topic=topic, key=key or b"", value=value)
        self._open.callbacks.append(on_delivery)
        if len(self._open.callbacks) >= self._settings.batch_events:
            self._send_open()

    def poll(self, timeout: float = 0.0) -> None:
        """Send a lingering batch, (re)open the stream when due, run the callbacks of acked batches."""
        if self._open is not None and time.monotonic() - self._opened_at >= self._settings.linger_s:
            self._send_open()
        self._expire()
        if self._call is None and self._unacked and time.monotonic() >= self._retry_at:
            self._connect()
        try:
            item = self._inbox.get(timeout=timeout) if timeout > 0 else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def flush(self, timeout: float = 60.0) -> None:
        """Send what is open and wait until every batch is acked; :class:`PublishError` otherwise."""
        self._send_open()
        deadline = time.monotonic() + timeout
        while self._unacked and time.monotonic() < deadline:
            self.poll(min(0.05, max(deadline - time.monotonic(), 0.0)))
        if self._unacked or self._failures:
            left = sum(len(b.callbacks) for b in self._unacked.values())
            raise PublishError(
                f"{left} records unacknowledged after {timeout:.0f}s, {len(self._failures)} refused"
                + (f": {self._failures[0]}" if self._failures else "")
            )

    def purge(self) -> None:
        """Give up on every record not acked yet: their callbacks run now with a purge error."""
        self._disconnect(cancel=True)
        self._send_open()  # no stream now: it only joins the batches given up on below
        self._fail(list(self._unacked), KafkaError._PURGE_QUEUE, "purged before the gateway acked it")

    def close(self) -> None:
        """End the stream (records not acked yet are left to the caller) and close the channel."""
        self._disconnect(cancel=bool(self._unacked))
        self._channel.close()

    # --- the stream -------------------------------------------------------------------------------

    def _send_open(self) -> None:
        batch, self._open = self._open, None
        if batch is None:
            return
        while len(self._unacked) >= self._settings.max_unacked_batches:  # acks, retries and expiry free it
            self.poll(0.05)
        batch.queued_at = time.monotonic()
        self._unacked[batch.message.batch_id] = batch
        if self._requests is not None:  # else it goes with the others once the stream is (re)opened
            self._requests.put(batch.message)

    def _connect(self) -> None:
        self._generation += 1
        self._requests = queue.SimpleQueue()
        requests = self._requests
        call = self._stub.Stream(iter(requests.get, _END), metadata=self._metadata)
        self._call = call
        self._reader = threading.Thread(
            target=self._read, args=(call, self._generation), name="gateway-acks", daemon=True
        )
        self._reader.start()
        for batch in self._unacked.values():
            requests.put(batch.message)

    def _read(self, call: Iterator[ingest_pb2.BatchAck], generation: int) -> None:
        """The acks of one stream into the inbox, then how it ended (runs on its own thread)."""
        try:
            for ack in call:
                self._inbox.put(ack)
        except grpc.RpcError as err:
            self._inbox.put(_Ended(generation, err))
            return
        self._inbox.put(_Ended(generation, None))

    def _disconnect(self, *, cancel: bool) -> None:
        """End the current stream: half-close it (the gateway finishes) or cancel it; join the reader."""
        if self._requests is not None:
            self._requests.put(_END)
        if cancel and self._call is not None:
            self._call.cancel()
        if self._reader is not None:
            self._reader.join()
        self._call = self._requests = self._reader = None

    def _handle(self, item: ingest_pb2.BatchAck | _Ended) -> None:
        if isinstance(item, ingest_pb2.BatchAck):
            batch = self._unacked.pop(item.batch_id, None)
            if batch is not None:
                self.published += len(batch.callbacks)
                for callback in batch.callbacks:
                    if callback is not None:
                        callback(None, None)
            return
        if item.generation != self._generation or self._call is None:
            return  # a stream this publisher already left behind
        self._disconnect(cancel=False)
        self._retry_at = time.monotonic() + self._settings.retry_backoff_s
        error = item.error
        code = error.code() if isinstance(error, grpc.Call) else None
        details = error.details() if isinstance(error, grpc.Call) else "the gateway ended the stream"
        if code in _PERMANENT:
            self._fail(list(self._unacked), KafkaError._AUTHENTICATION, f"{code}: {details}")
        elif code in _REFUSED and isinstance(error, grpc.Call):
            refused = dict(error.trailing_metadata() or ()).get(BATCH_ID_METADATA)
            self._fail([str(refused)], KafkaError._INVALID_ARG, f"refused by the gateway: {details}")
        else:
            log.info("gateway stream ended (%s: %s); %d batches resent", code, details, len(self._unacked))

    def _expire(self) -> None:
        now = time.monotonic()
        expired = [
            batch_id
            for batch_id, batch in self._unacked.items()
            if now - batch.queued_at >= self._delivery_timeout_s
        ]
        if expired:
            self._fail(expired, KafkaError._MSG_TIMED_OUT, f"not acked in {self._delivery_timeout_s:g}s")

    def _fail(self, batch_ids: list[str], code: int, reason: str) -> None:
        for batch_id in batch_ids:
            batch = self._unacked.pop(batch_id, None)
            if batch is None:
                continue
            error = KafkaError(code, reason)
            for callback in batch.callbacks:
                if callback is None:
                    self._failures.append(reason)
                else:
                    callback(error, None)
