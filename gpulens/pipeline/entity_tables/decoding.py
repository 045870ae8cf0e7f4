"""Decoding source records, and dead-lettering the ones that cannot be decoded.

A record that can never be decoded goes to gpulens.dlq.v1 with the reason and is skipped:
it never stops the app. Dead letters are sent outside the faust transaction (flushed before
the record is acknowledged), so a kill -9 can send one twice, with the same event id.
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

from confluent_kafka import Producer
from faust.types import EventT

from gpulens.schemas.kafka.dead_letters import DeadLetterPublisher
from gpulens.schemas.kafka.settings import KafkaSettings
from gpulens.schemas.model.exceptions import DecodeError
from gpulens.schemas.model.models import Record
from gpulens.schemas.model.topics import TopicSpec
from gpulens.schemas.wire.codec import AvroCodec

R = TypeVar("R", bound=Record)


class Decoding:
    """Decodes the raw values of the app's events through one codec."""

    def __init__(self, kafka: KafkaSettings, codec: AvroCodec, *, consumer: str) -> None:
        self._codec = codec
        self._producer = Producer(kafka.producer(**{"enable.idempotence": True}))
        self._dead_letters = DeadLetterPublisher(self._producer, codec, consumer=consumer)

    async def decode(self, spec: TopicSpec, event: EventT[bytes], record: type[R]) -> R | None:
        """The record in ``event``, or None once it is in the DLQ."""
        message = event.message
        value = message.value if isinstance(message.value, bytes) else b""
        try:
            return self._codec.decode(spec, value, record)
        except DecodeError as err:
            self._dead_letters.send(
                message.topic,
                message.partition,
                message.offset,
                key=message.key if isinstance(message.key, bytes) else None,
                value=message.value if isinstance(message.value, bytes) else None,
                reason=err.reason.value,
                detail=err.detail,
            )
            await asyncio.to_thread(self._producer.flush, 30)
            return None

    def close(self) -> None:
        self._producer.flush(30)
