"""Checking a batch before any of it is published: its id, size, topics, and every record.

A batch is published whole or not at all, so every event of it is checked first: a topic of
the catalog other than the dead letters, a record the producer takes (its size), and a record
a consumer of the topic decodes whole under the key its record gives
(:mod:`gpulens.schemas.wire.publishable`: each topic's shape first, an exact check for what it
does not match). The first bad event refuses the batch, with the reason its clients and the
``gpulens_gateway_rejected_batches_total`` counter see (a core ``DecodeFailure`` becomes
the :class:`RejectReason` of the same name).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypedDict

from gpulens.producers.gateway.exceptions import InvalidBatch, RejectReason
from gpulens.protos.gateway.v1 import ingest_pb2
from gpulens.schemas.model.exceptions import DecodeError
from gpulens.schemas.model.topics import CATALOG, DLQ, TopicSpec
from gpulens.schemas.wire.codec import AvroCodec
from gpulens.schemas.wire.publishable import Shape, check_record, own_shape


class RawMessage(TypedDict):
    """One checked record, as ``confluent_kafka.Producer.produce_batch`` takes it."""

    key: bytes
    value: bytes


Checked = dict[str, list[RawMessage]]
"""A checked batch: its records by topic, each topic's in the order they were sent."""


class BatchValidator:
    """Checks batches whole: :class:`InvalidBatch` names the first bad event of a bad one."""

    def __init__(
        self,
        codec: AvroCodec,
        *,
        topics: Iterable[TopicSpec] = CATALOG,
        max_events: int = 10_000,
        max_record_bytes: int = 1_000_000,
    ) -> None:
        self._codec = codec
        self._topics = {spec.name: spec for spec in topics}
        self._max_events = max_events
        self._max_record_bytes = max_record_bytes
        self._shapes: dict[str, Shape | None] = {}

    def check(self, batch: ingest_pb2.EventBatch) -> Checked:
        """The records of ``batch`` by topic, every one publishable; else :class:`InvalidBatch`."""
        if not batch.batch_id:
            raise InvalidBatch("", RejectReason.NO_BATCH_ID, "every batch needs an id (a UUID)")
        events = batch.events
        if not events:
            raise InvalidBatch(batch.batch_id, RejectReason.EMPTY, "no events")
        if len(events) > self._max_events:
            raise InvalidBatch(
                batch.batch_id, RejectReason.TOO_LARGE, f"{len(events)} events, at most {self._max_events}"
            )
        limit = self._max_record_bytes
        sized = batch.ByteSize() <= limit  # then no record of it can be too large
        shapes = self._shapes
        checked: Checked = {}
        for index, event in enumerate(events):
            topic, key, value = event.topic, event.key, event.value
            shape = shapes[topic] if topic in shapes else self._shape(topic)
            if not (
                shape is not None and (sized or len(key) + len(value) <= limit) and shape.accepts(key, value)
            ) and (problem := self._problem(topic, key, value)):
                raise InvalidBatch(batch.batch_id, problem[0], f"topic {topic!r}: {problem[1]}", index=index)
            records = checked.get(topic)
            if records is None:
                records = checked[topic] = []
            records.append({"key": key, "value": value})
        return checked

    def _shape(self, topic: str) -> Shape | None:
        """The shape of ``topic``'s own schema, compiled on its first event; None: check exactly."""
        spec = self._topics.get(topic)
        if spec is None or spec.name == DLQ.name:
            return None
        shape = self._shapes[topic] = own_shape(self._codec, spec)
        return shape

    def _problem(self, topic: str, key: bytes, value: bytes) -> tuple[RejectReason, str] | None:
        """Why the record cannot be published, decided exactly (a full decode); None when it can."""
        spec = self._topics.get(topic)
        if spec is None:
            return RejectReason.UNKNOWN_TOPIC, "not a topic of the catalog"
        if spec.name == DLQ.name:
            return RejectReason.DEAD_LETTER_TOPIC, "dead letters are written by consumers, not ingested"
        size = len(key) + len(value)
        if size > self._max_record_bytes:
            return RejectReason.TOO_LARGE, f"a record of {size} bytes, at most {self._max_record_bytes}"
        try:
            check_record(self._codec, spec, key, value)
        except DecodeError as err:
            return RejectReason(err.reason.value), err.detail
        return None
