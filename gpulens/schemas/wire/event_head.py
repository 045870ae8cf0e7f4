"""The head every event starts with, read without the rest of the record.

Every event's committed schema begins with ``event_id``, ``cluster``, ``event_time`` and
``source`` (:class:`~gpulens.schemas.model.models.Event`). That is all the worker needs to place
a record it holds for event-time order (cluster, time) and to hear its source; the rest it needs
only when the record is released. A worker digesting a 100,000-GPU cluster's start holds most of
the start's 107,000 pod, container, workload, node and inventory records, and decoded each of
them twice: in full when fetched, then dropped to its wire bytes and decoded again when released
(a third of its CPU over the start, half of it the first decode).

It is sound, not complete: a head comes back only from a body written with the topic's own
committed schema, one the codec knows already (an id it never saw, as junk's are, is left to the
full decode, which asks the registry once), and only where the model would accept those four
fields (a cluster and a source not empty, a time in [2000, 2100), UTF-8 text); else None, and
the full decode decides.
What the head leaves unread (the event id, the body) is checked when the record is decoded in
full: a record refused then is dead-lettered then, with the full decode's reason.
"""

from __future__ import annotations

import json
from typing import NamedTuple

from gpulens.schemas.model.avro_schema import committed
from gpulens.schemas.model.exceptions import DecodeError, RegistryError
from gpulens.schemas.model.models import EARLIEST, LATEST
from gpulens.schemas.model.topics import TopicSpec
from gpulens.schemas.wire.codec import MAGIC, AvroCodec

_HEAD_FIELDS = [
    {"name": "event_id", "type": "string"},
    {"name": "cluster", "type": "string"},
    {"name": "event_time", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "source", "type": "string"},
]
_FRAMING = 5
_LOWEST_MS, _BEYOND_MS = round(EARLIEST.timestamp() * 1000), round(LATEST.timestamp() * 1000)


class EventHead(NamedTuple):
    """What places an event held for event-time order."""

    cluster: str
    event_ms: int
    source: str


class EventHeadReader:
    """Reads the heads of one consumer's events (module docstring)."""

    def __init__(self, codec: AvroCodec) -> None:
        self._codec = codec
        self._readable: dict[tuple[bytes, str], bool] = {}
        """Per framing header and topic: whether its bodies start with the head."""

    def read(self, topic: TopicSpec, value: bytes) -> EventHead | None:
        """The head of ``value``, an event on ``topic``; None where only a full decode can tell."""
        if len(value) <= _FRAMING or value[0] != MAGIC or not self._starts_with_head(topic, value[:_FRAMING]):
            return None
        try:
            pos = _skip_string(value, _FRAMING)
            cluster, pos = _string(value, pos)
            event_ms, pos = _long(value, pos)
            source, _ = _string(value, pos)
        except (IndexError, ValueError):  # truncated, a negative length, not UTF-8
            return None
        if not cluster or not source or not _LOWEST_MS <= event_ms < _BEYOND_MS:
            return None
        return EventHead(cluster, event_ms, source)

    def _starts_with_head(self, topic: TopicSpec, framing: bytes) -> bool:
        key = (framing, topic.name)
        readable = self._readable.get(key)
        if readable is None:
            schema_id = int.from_bytes(framing[1:])
            if not self._codec.knows_schema(schema_id):  # junk's random ids: the full decode asks
                return False  # the registry once, not twice
            try:
                ours = self._codec.writes_committed(topic, schema_id)
            except (DecodeError, RegistryError):  # unknown id, registry away: the full decode says
                return False
            fields = json.loads(committed(topic.record)).get("fields", [])[: len(_HEAD_FIELDS)]
            head = [{"name": f["name"], "type": f["type"]} for f in fields]
            readable = self._readable[key] = ours and head == _HEAD_FIELDS
        return readable


def _long(data: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint (Avro int and long) at ``pos``, and the position after it."""
    n = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        n |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (n >> 1) ^ -(n & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def _span(data: bytes, pos: int) -> tuple[int, int]:
    size, pos = _long(data, pos)
    if size < 0 or pos + size > len(data):
        raise ValueError(f"a string of {size} bytes at {pos} of {len(data)}")
    return pos, pos + size


def _skip_string(data: bytes, pos: int) -> int:
    return _span(data, pos)[1]


def _string(data: bytes, pos: int) -> tuple[str, int]:
    start, end = _span(data, pos)
    return data[start:end].decode(), end
