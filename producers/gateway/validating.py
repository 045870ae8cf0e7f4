"""Checking a batch before any of it is published: topic, wire format, Avro body, key.

The value must decode (Confluent wire format, a schema id the registry knows, an Avro body
that resolves to the topic's record schema with nothing left over) and its key must be the
one :func:`schemas.topics.record_key` gives that record. The model's own rules (pydantic
validators) are not run here: they cost ten times the Avro decode, and a consumer that meets
such a record dead-letters it as ``invalid-record`` like any other.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import SimpleNamespace
from typing import cast

from producers.gateway.exceptions import InvalidBatch, RejectReason
from protos.gateway.v1 import ingest_pb2
from schemas.codec import AvroCodec
from schemas.exceptions import DecodeError
from schemas.models import Record
from schemas.topics import CATALOG, DLQ, TopicSpec, record_key


class BatchValidator:
    """Raises :class:`InvalidBatch` naming the first bad event of a batch; silent for a good one."""

    def __init__(
        self, codec: AvroCodec, *, topics: Iterable[TopicSpec] = CATALOG, max_events: int = 10_000
    ) -> None:
        self._codec = codec
        self._topics = {spec.name: spec for spec in topics}
        self._max_events = max_events

    def check(self, batch: ingest_pb2.EventBatch) -> None:
        """Every event of ``batch`` is publishable, or :class:`InvalidBatch` (which event, why)."""
        if not batch.batch_id:
            raise InvalidBatch("", RejectReason.NO_BATCH_ID, "every batch needs an id (a UUID)")
        count = len(batch.events)
        if not count:
            raise InvalidBatch(batch.batch_id, RejectReason.EMPTY, "no events")
        if count > self._max_events:
            raise InvalidBatch(
                batch.batch_id, RejectReason.TOO_LARGE, f"{count} events, at most {self._max_events}"
            )
        for index, event in enumerate(batch.events):
            reason, detail = self._problem(event)
            if reason is not None:
                raise InvalidBatch(batch.batch_id, reason, f"topic {event.topic!r}: {detail}", index=index)

    def _problem(self, event: ingest_pb2.Event) -> tuple[RejectReason | None, str]:
        spec = self._topics.get(event.topic)
        if spec is None:
            return RejectReason.UNKNOWN_TOPIC, "not a topic of the catalog"
        if spec.name == DLQ.name:
            return RejectReason.DEAD_LETTER_TOPIC, "dead letters are written by consumers, not ingested"
        try:
            values = self._codec.decode_dict(spec, event.value)
        except DecodeError as err:
            return RejectReason(err.reason.value), err.detail
        # record_key reads only attributes: a namespace over the decoded fields costs a tenth of
        # a model (even an unvalidated model_construct), and this runs for every event.
        expected = record_key(spec, cast(Record, SimpleNamespace(**values)))
        if event.key != expected:
            return RejectReason.KEY_MISMATCH, f"key {event.key!r}, the record's key is {expected!r}"
        return None, ""
