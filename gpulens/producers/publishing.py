"""Publishing events to their catalog topics: Avro-encoded, keyed by entity, idempotent.

:class:`BasePublisher` is the contract a sender relies on (encode, queue bytes with a delivery
callback, serve callbacks, flush or purge, close); :class:`EventPublisher` fulfils it straight
to Kafka, ``gpulens.producers.gateway.GatewayPublisher`` through the ingest gateway.
"""

from __future__ import annotations

import contextlib
import logging
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import NamedTuple

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from gpulens.schemas.kafka.settings import KafkaSettings
from gpulens.schemas.model.exceptions import GPULensError
from gpulens.schemas.model.models import Event
from gpulens.schemas.model.topics import TopicSpec, record_key
from gpulens.schemas.wire.codec import AvroCodec

log = logging.getLogger(__name__)

DeliveryCallback = Callable[[KafkaError | None, Message | None], None]
"""The answer about one record: no error once the broker acknowledged it (librdkafka passes its
``Message``; the gateway client passes ``None``)."""


class PublishError(GPULensError):
    """The broker did not take a record (after librdkafka's own retries)."""


class BasePublisher(ABC):
    """Queues encoded events for the broker; delivery callbacks run inside :meth:`poll` (and the
    other methods), on the caller's thread."""

    def __init__(self, codec: AvroCodec) -> None:
        self._codec = codec

    def encode(self, topic: TopicSpec, event: Event) -> tuple[bytes, bytes]:
        """The key and value bytes ``event`` is published with on ``topic``."""
        return record_key(topic, event), self._codec.encode(topic, event)

    def publish(self, topic: TopicSpec, event: Event) -> None:
        """Queue ``event`` on ``topic`` (keyed by its entity); blocks while the queue is full."""
        key, value = self.encode(topic, event)
        self.produce(topic.name, key, value)

    @abstractmethod
    def produce(
        self, topic: str, key: bytes | None, value: bytes, *, on_delivery: DeliveryCallback | None = None
    ) -> None:
        """Queue encoded bytes; ``on_delivery`` hears the broker's answer (default: :meth:`flush` raises)."""

    def produce_many(self, topic: str, keys: Sequence[bytes | None], values: Sequence[bytes]) -> None:
        """Queue many encoded records on ``topic`` at once (refusals: :meth:`flush` raises)."""
        for key, value in zip(keys, values, strict=True):
            self.produce(topic, key, value)

    @abstractmethod
    def poll(self, timeout: float = 0.0) -> None:
        """Serve delivery callbacks, waiting up to ``timeout`` seconds for one."""

    @abstractmethod
    def purge(self) -> None:
        """Give up on every queued and in-flight record: their callbacks get an error."""

    @abstractmethod
    def flush(self, timeout: float = 60.0) -> None:
        """Wait until every queued record is acknowledged; :class:`PublishError` otherwise."""

    def close(self) -> None:  # noqa: B027 - a publisher without connections of its own has nothing to do
        """Release connections and threads; queued records are not waited for (flush first)."""


_SEQUENCE_LOST = frozenset(
    (KafkaError._FATAL, KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, KafkaError.UNKNOWN_PRODUCER_ID)
)
"""Delivery errors of records caught in an idempotent producer's fatal error (the error
callback, which says it is fatal, may come after them)."""


class _Record(NamedTuple):  # one per record sent: a tuple is the cheapest immutable record
    seq: int
    """Order of :meth:`EventPublisher.produce` calls: resends keep it."""
    topic: str
    key: bytes | None
    value: bytes
    on_delivery: DeliveryCallback | None


class EventPublisher(BasePublisher):
    """Produces events with an idempotent producer; :meth:`flush` raises if any was refused.

    It survives librdkafka's fatal errors. After a broker lost records it had acknowledged (the
    embedded broker after a SIGKILL), the idempotent producer's next batch is out of sequence
    and librdkafka stops the producer for good. The publisher then creates a new producer and
    resends, in their original order, every record not yet acknowledged plus the recently
    acknowledged ones (the last ``keep_acked_s`` seconds, at most ``keep_acked`` records: the
    memory this costs is bounded) that lie at or past their partition's end offset on the
    broker (the ones it lost). Callers see each record acknowledged once. A
    record the broker had written but whose acknowledgement never came is sent twice: such
    duplicates are counted in ``resent``, and consumers deduplicate by event id.
    """

    def __init__(
        self,
        kafka: KafkaSettings,
        codec: AvroCodec,
        *,
        keep_acked_s: float = 120.0,
        keep_acked: int = 200_000,
        **overrides: object,
    ) -> None:
        super().__init__(codec)
        self._config = kafka.producer(
            **{
                "enable.idempotence": True,
                "linger.ms": 20,
                "batch.num.messages": 10_000,
                "queue.buffering.max.messages": 500_000,
                **overrides,
                "error_cb": self._on_error,
            }
        )
        self._kafka = kafka
        self._producer = Producer(self._config)
        self._failures: list[str] = []
        self._keep_acked_s, self._keep_acked = keep_acked_s, keep_acked
        self._unacked: dict[int, _Record] = {}
        self._acked: deque[tuple[float, int, int, _Record]] = deque()
        """(when, partition, offset, record) of recent acknowledgements, oldest first."""
        self._fatal: KafkaError | None = None
        self.published = 0
        self.recoveries = 0
        self.resent = 0

    def produce(
        self, topic: str, key: bytes | None, value: bytes, *, on_delivery: DeliveryCallback | None = None
    ) -> None:
        """Queue encoded bytes; ``on_delivery`` hears the broker's answer (default: :meth:`flush` raises)."""
        self._queue(topic, key, value, on_delivery)
        self.poll(0)

    def produce_many(self, topic: str, keys: Sequence[bytes | None], values: Sequence[bytes]) -> None:
        """Queue many encoded records on ``topic``, serving callbacks once after them all rather
        than after each record."""
        for key, value in zip(keys, values, strict=True):
            self._queue(topic, key, value, None)
        self.poll(0)

    def _queue(
        self, topic: str, key: bytes | None, value: bytes, on_delivery: DeliveryCallback | None
    ) -> None:
        record = _Record(self.published, topic, key, value, on_delivery)
        self._unacked[record.seq] = record
        self.published += 1
        self._send(record)

    def _on_delivered(self, record: _Record, err: KafkaError | None, message: Message | None) -> None:
        if err is not None and (err.fatal() or err.code() in _SEQUENCE_LOST or self._fatal is not None):
            self._fatal = self._fatal or err  # kept for the new producer, not reported
            return
        if err is None and message is not None:
            self._remember(record, message)
        if self._unacked.pop(record.seq, None) is not None:
            (record.on_delivery or self._delivered)(err, message)

    def _send(self, record: _Record) -> None:
        delivered = partial(self._on_delivered, record)
        while True:
            try:
                self._producer.produce(
                    record.topic, key=record.key, value=record.value, on_delivery=delivered
                )
                return
            except BufferError:
                self._guarded(lambda: self._producer.poll(0.05))
            except KafkaException as err:
                if not err.args[0].fatal():
                    raise
                self._fatal = err.args[0]
            if self._fatal is not None:
                self._recover()  # resends every unacknowledged record, this one included
                return

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            self._fatal = err

    def _remember(self, record: _Record, message: Message) -> None:
        now = time.monotonic()
        self._acked.append((now, message.partition() or 0, message.offset() or 0, record))
        while self._acked and (
            now - self._acked[0][0] > self._keep_acked_s or len(self._acked) > self._keep_acked
        ):
            self._acked.popleft()

    def _guarded(self, call: Callable[[], int]) -> int:
        """``call``'s result; a fatal error it raises is noted for :meth:`_recover` (0 returned)."""
        try:
            return call()
        except KafkaException as err:
            if not err.args[0].fatal():
                raise
            self._fatal = err.args[0]
            return 0
        except SystemError as err:
            # confluent-kafka's flush returned NULL with no exception set just after the broker
            # restarted under an idempotent producer (seen once, on a loaded machine, in
            # test_producer_recovery): the handle's state is unknown, so it is replaced like a dead one.
            log.warning("producer call failed inside the client library (%s)", err)
            self._fatal = KafkaError(KafkaError._FATAL, str(err), fatal=True)
            return 0

    def _recover_if_fatal(self) -> None:
        if self._fatal is not None:
            self._recover()

    def _recover(self) -> None:
        """Replace a producer librdkafka declared dead and resend what the broker does not hold."""
        log.warning("producer failed for good (%s); creating a new one", self._fatal)
        with contextlib.suppress(KafkaException):
            self._producer.purge()
            self._producer.poll(0)  # the purged records' callbacks keep them unacknowledged
        lost = self._lost_acknowledged()
        self._producer = Producer(self._config)
        self._fatal = None
        lost_seqs = {record.seq for record in lost}
        self._acked = deque(entry for entry in self._acked if entry[3].seq not in lost_seqs)
        log.warning(
            "resending %d unacknowledged records and %d acknowledged ones the broker lost",
            len(self._unacked),
            len(lost),
        )
        for record in lost:  # their senders heard already: only a refusal is reported (by flush)
            self._unacked[record.seq] = record._replace(on_delivery=self._delivered)
        self.recoveries += 1
        self.resent += len(self._unacked)
        for record in sorted(self._unacked.values(), key=lambda record: record.seq):
            self._send(record)

    def _lost_acknowledged(self) -> list[_Record]:
        """Recently acknowledged records at or past their partition's end offset (waits for the broker)."""
        ends: dict[tuple[str, int], int] = {}
        consumer = Consumer(self._kafka.librdkafka(**{"group.id": "gpulens-publisher-recovery"}))
        try:
            for _, partition, _, record in self._acked:
                where = (record.topic, partition)
                while where not in ends:
                    try:
                        ends[where] = consumer.get_watermark_offsets(TopicPartition(*where), timeout=10)[1]
                    except KafkaException as err:
                        log.warning("end offset of %s[%d] unknown yet (%s); asking again", *where, err)
        finally:
            consumer.close()
        return [
            record
            for _, partition, offset, record in self._acked
            if offset >= ends[(record.topic, partition)]
        ]

    def poll(self, timeout: float = 0.0) -> None:
        """Serve delivery callbacks, waiting up to ``timeout`` seconds for one."""
        self._guarded(lambda: self._producer.poll(timeout))
        self._recover_if_fatal()

    def purge(self) -> None:
        """Give up on every queued and in-flight record: their callbacks get a purge error."""
        self._producer.purge()
        self._producer.poll(0)

    def _delivered(self, err: KafkaError | None, _message: Message | None) -> None:
        if err is not None:
            self._failures.append(err.str())

    def flush(self, timeout: float = 60.0) -> None:
        """Wait until every queued record is acknowledged; :class:`PublishError` otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            left = self._guarded(lambda: self._producer.flush(max(0.0, deadline - time.monotonic())))
            if self._fatal is None:
                break
            self._recover()
        if left or self._failures:
            raise PublishError(
                f"{left} records unacknowledged after {timeout:.0f}s, {len(self._failures)} refused"
                + (f": {self._failures[0]}" if self._failures else "")
            )
