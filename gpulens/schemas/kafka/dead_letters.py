"""The dead-letter topic: records that cannot be processed, with their bytes and the reason.

A dead letter never fails to be sent. Its original value is kept whole up to
``max_original_bytes`` (default 256 KiB, far below librdkafka's and Kafka's 1 MB message
limit); a larger one keeps its first bytes, with its length and SHA-256, so a 999,000-byte
junk value cannot turn into a ``MSG_SIZE_TOO_LARGE`` restart loop. A burst waits for room in
the producer's queue (:func:`~gpulens.schemas.kafka.producing.produce_with_backpressure`).

Logging is rate-limited: the first dead letter of a quiet spell is logged at once, then one
line per ``log_interval_s`` counts what came meanwhile by reason (200,000 bad records made
386 MB of one-line-per-record logs); ``gpulens_dead_letters_total`` counts every one.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import Counter as Tally
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol

from confluent_kafka import Message, Producer
from prometheus_client import Counter

from gpulens.schemas.kafka.producing import produce_with_backpressure
from gpulens.schemas.model.ids import event_id
from gpulens.schemas.model.models import DeadLetter
from gpulens.schemas.model.topics import DLQ, record_key
from gpulens.schemas.wire.codec import AvroCodec

log = logging.getLogger(__name__)

DEAD_LETTERS = Counter(
    "gpulens_dead_letters_total",
    "Records sent to the dead-letter topic, by source topic and reason.",
    ["topic", "reason", "consumer"],
)

MAX_ORIGINAL_BYTES = 256 * 1024
"""Original value bytes a dead letter keeps whole (its key and detail are capped too)."""
MAX_KEY_BYTES = 4 * 1024
MAX_DETAIL_CHARS = 4 * 1024


class DeadLetterLog:
    """Logs dead letters at most once per ``interval_s``, with counts by reason in between."""

    def __init__(
        self, consumer: str, *, interval_s: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._consumer = consumer
        self._interval_s, self._clock = interval_s, clock
        self._last_line = -interval_s
        self._held: Tally[str] = Tally()

    def record(self, where: str, reason: str, detail: str) -> None:
        """One more dead letter at ``where`` (topic/partition@offset)."""
        self._held[reason] += 1
        now = self._clock()
        if now - self._last_line < self._interval_s:
            return
        held, self._held = self._held, Tally()
        self._last_line = now
        if sum(held.values()) == 1:
            log.warning("%s: dead letter %s: %s: %s", self._consumer, where, reason, detail)
            return
        counts = ", ".join(f"{r} {n}" for r, n in sorted(held.items()))
        log.warning(
            "%s: %d dead letters since the last line (%s); latest %s: %s: %s",
            self._consumer, sum(held.values()), counts, where, reason, detail,
        )  # fmt: skip


class Located(Protocol):
    """A record as read, where it was read: what a dead letter keeps of it."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...


class DeadLetterPublisher:
    """Publishes dead letters through a caller's producer (flush it before committing offsets)."""

    def __init__(
        self,
        producer: Producer,
        codec: AvroCodec,
        *,
        consumer: str,
        max_original_bytes: int = MAX_ORIGINAL_BYTES,
        log_interval_s: float = 10.0,
    ) -> None:
        self._producer = producer
        self._codec = codec
        self._consumer = consumer
        self._max_original_bytes = max_original_bytes
        self._log = DeadLetterLog(consumer, interval_s=log_interval_s)

    def publish(self, message: Message, reason: str, detail: str) -> DeadLetter:
        """Send ``message`` to the DLQ with ``reason``; returns the dead letter sent."""
        return self.send(
            message.topic() or "",
            message.partition() or 0,
            message.offset() or 0,
            key=message.key(),
            value=message.value(),
            reason=reason,
            detail=detail,
        )

    def send_read(self, item: Located, reason: str, detail: str) -> DeadLetter:
        """Send ``item`` (a record read and kept with its place and bytes) to the DLQ."""
        place = (item.topic, item.partition, item.offset)
        return self.send(*place, key=item.key, value=item.value, reason=reason, detail=detail)

    def send(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        key: bytes | None,
        value: bytes | None,
        reason: str,
        detail: str,
    ) -> DeadLetter:
        """Send the record at ``topic/partition@offset`` to the DLQ with ``reason``."""
        truncated = value is not None and len(value) > self._max_original_bytes
        letter = DeadLetter(
            event_id=event_id("dlq", topic, partition, offset),
            failed_at=datetime.now(UTC),
            source_topic=topic,
            source_partition=partition,
            source_offset=offset,
            key=None if key is None else key[:MAX_KEY_BYTES],
            value=None if value is None else value[: self._max_original_bytes],
            reason=reason,
            detail=detail[:MAX_DETAIL_CHARS],
            consumer=self._consumer,
            value_length=None if value is None else len(value),
            value_sha256=None if value is None else hashlib.sha256(value).hexdigest(),
            value_truncated=truncated,
        )
        produce_with_backpressure(
            self._producer,
            DLQ.name,
            key=record_key(DLQ, letter),
            value=self._codec.encode(DLQ, letter),
            headers={
                "reason": reason.encode(),
                "source": f"{topic}/{partition}/{offset}".encode(),
                "consumer": self._consumer.encode(),
            },
        )
        DEAD_LETTERS.labels(topic, reason, self._consumer).inc()
        self._log.record(f"{topic}/{partition}@{offset}", reason, letter.detail)
        return letter
