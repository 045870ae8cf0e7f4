"""The dead-letter topic: records that cannot be processed, with their bytes and the reason."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from confluent_kafka import Message, Producer
from prometheus_client import Counter

from schemas.codec import AvroCodec
from schemas.ids import event_id
from schemas.models import DeadLetter
from schemas.topics import DLQ, record_key

log = logging.getLogger(__name__)

DEAD_LETTERS = Counter(
    "gpulens_dead_letters_total",
    "Records sent to the dead-letter topic, by source topic and reason.",
    ["topic", "reason", "consumer"],
)


class DeadLetterPublisher:
    """Publishes dead letters through a caller's producer (flush it before committing offsets)."""

    def __init__(self, producer: Producer, codec: AvroCodec, *, consumer: str) -> None:
        self._producer = producer
        self._codec = codec
        self._consumer = consumer

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
        letter = DeadLetter(
            event_id=event_id("dlq", topic, partition, offset),
            failed_at=datetime.now(UTC),
            source_topic=topic,
            source_partition=partition,
            source_offset=offset,
            key=key,
            value=value,
            reason=reason,
            detail=detail,
            consumer=self._consumer,
        )
        self._producer.produce(
            DLQ.name,
            key=record_key(DLQ, letter),
            value=self._codec.encode(DLQ, letter),
            headers={"reason": reason.encode(), "source": f"{topic}/{partition}/{offset}".encode()},
        )
        DEAD_LETTERS.labels(topic, reason, self._consumer).inc()
        log.warning("dead letter %s/%d@%d: %s: %s", topic, partition, offset, reason, detail)
        return letter
