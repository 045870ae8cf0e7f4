"""Consuming catalog topics: decode every record, dead-letter what cannot be decoded.

At-least-once: offsets are committed only by :meth:`DecodingConsumer.commit`, which first
makes the dead letters durable. A record is either handed to the caller or in the DLQ;
nothing is skipped silently. A registry outage is not the record's fault: it raises
:class:`~schemas.exceptions.RegistryError` and the record is retried, never dead-lettered.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaException, Message, Producer, TopicPartition

from schemas.codec import AvroCodec
from schemas.dead_letters import DeadLetterPublisher
from schemas.exceptions import DecodeError, GPULensError
from schemas.models import Record
from schemas.settings import KafkaSettings
from schemas.topics import TopicSpec

log = logging.getLogger(__name__)


class ConsumeError(GPULensError):
    """The broker returned an error for a topic/partition."""


@dataclass(frozen=True, slots=True)
class Decoded:
    """A decoded record and where it came from."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    record: Record


class DecodingConsumer:
    """A consumer group member over catalog topics that yields validated records."""

    def __init__(
        self,
        kafka: KafkaSettings,
        codec: AvroCodec,
        *,
        group_id: str,
        topics: Sequence[TopicSpec],
        start: Sequence[TopicPartition] | None = None,
        overrides: dict[str, Any] | None = None,
    ) -> None:
        """Join ``group_id`` on ``topics``; with ``start``, read exactly those partitions from
        those offsets instead (no group rebalancing)."""
        self._codec = codec
        self._specs = {t.name: t for t in topics}
        self._consumer = Consumer(
            kafka.librdkafka(
                **{
                    "group.id": group_id,
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                    "session.timeout.ms": 6000,
                    **(overrides or {}),
                }
            )
        )
        if start is None:
            self._consumer.subscribe([t.name for t in topics])
        else:
            self._consumer.assign(list(start))
        self._dlq_producer = Producer(kafka.librdkafka(**{"acks": "all", "enable.idempotence": True}))
        self._dlq = DeadLetterPublisher(self._dlq_producer, codec, consumer=group_id)
        self._positions: dict[tuple[str, int], int] = {}

    def poll(self, max_records: int = 500, timeout: float = 1.0) -> list[Decoded]:
        """Up to ``max_records`` decoded records; bad ones are dead-lettered and skipped."""
        decoded: list[Decoded] = []
        for message in self._consumer.consume(max_records, timeout):
            error = message.error()
            if error is not None:
                if error.fatal() or not error.retriable():
                    raise ConsumeError(f"{message.topic()}/{message.partition()}: {error.str()}")
                log.warning("transient consume error: %s", error.str())
                continue
            record = self._decode(message)
            if record is not None:
                decoded.append(
                    Decoded(
                        message.topic() or "",
                        message.partition() or 0,
                        message.offset() or 0,
                        message.key(),
                        record,
                    )
                )
            self._positions[(message.topic() or "", message.partition() or 0)] = (message.offset() or 0) + 1
        return decoded

    def _decode(self, message: Message) -> Record | None:
        topic = self._specs[message.topic() or ""]
        try:
            # A tombstone (None) on an event topic is as undecodable as an empty value.
            return self._codec.decode(topic, message.value() or b"")
        except DecodeError as err:
            self._dlq.publish(message, err.reason.value, err.detail)
            return None

    def lag(self, timeout: float = 5.0) -> dict[str, int]:
        """Records not yet polled, per topic: high watermark minus position, summed over the
        assigned partitions (one broker round trip per partition: call it every few seconds,
        not per poll). A partition not read yet counts from its low watermark."""
        lag: dict[str, int] = {}
        try:
            for tp in self._consumer.position(self._consumer.assignment()):
                low, high = self._consumer.get_watermark_offsets(tp, timeout=timeout, cached=False)
                position = tp.offset if tp.offset >= 0 else low
                lag[tp.topic] = lag.get(tp.topic, 0) + max(high - position, 0)
        except KafkaException as err:
            raise ConsumeError(f"cannot read positions and watermarks: {err}") from err
        return lag

    def commit(self) -> None:
        """Make dead letters durable, then commit everything polled so far."""
        if not self._positions:
            return
        if self._dlq_producer.flush(30):
            raise ConsumeError("dead letters not acknowledged within 30 s; offsets not committed")
        offsets = [TopicPartition(t, p, o) for (t, p), o in self._positions.items()]
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as err:
            raise ConsumeError(f"commit failed: {err}") from err
        self._positions.clear()

    def close(self) -> None:
        """Leave the group (uncommitted records will be delivered again)."""
        self._dlq_producer.flush(10)
        self._consumer.close()
