"""The head of an event (cluster, time, source), read without the rest of the record.

The worker places a record it holds as bytes by its head alone and decodes the rest when it
releases it, so a head read must never differ from the full decode's, and a head the model
would refuse must not be read at all (the full decode then says why, at once).
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime

import pytest
from avro_damage import damaged
from test_compiled_reader import RandomRecords

from gpulens.pipeline.windows import event_time_ms
from gpulens.schemas.model.avro_schema import committed
from gpulens.schemas.model.exceptions import DecodeError
from gpulens.schemas.model.models import DeadLetter, Event
from gpulens.schemas.model.topics import DLQ, PODS, TopicSpec
from gpulens.schemas.wire.codec import AvroCodec
from gpulens.schemas.wire.event_head import EventHead, EventHeadReader
from gpulens.testing.examples import example_events

EVENT_TOPICS = list(example_events())


def decoded_head(codec: AvroCodec, spec: TopicSpec, value: bytes) -> EventHead | None:
    """The head of the full decode, or None where it refuses the record."""
    try:
        record = codec.decode(spec, value)
    except DecodeError:
        return None
    assert isinstance(record, Event)
    return EventHead(record.cluster, event_time_ms(record), record.source)


@pytest.mark.parametrize("spec", EVENT_TOPICS, ids=lambda s: s.name)
def test_the_head_of_every_record_the_codec_reads_is_read_alike(codec: AvroCodec, spec: TopicSpec) -> None:
    """Random records of every event topic: each one the codec reads has the same head read
    alone (heads the model refuses: the next tests)."""
    heads, records = EventHeadReader(codec), RandomRecords(random.Random(spec.name))
    schema = json.loads(committed(spec.record))
    read = 0
    for _ in range(200):
        value = codec.encode_dict(spec, records.value(schema))
        expected, got = decoded_head(codec, spec, value), heads.read(spec, value)
        if expected is not None:
            assert got == expected, value.hex()
            read += 1
    assert read > 0


@pytest.mark.parametrize("spec", EVENT_TOPICS, ids=lambda s: s.name)
def test_a_damaged_record_never_gets_another_head_than_its_decode(codec: AvroCodec, spec: TopicSpec) -> None:
    heads = EventHeadReader(codec)
    value = codec.encode(spec, example_events("head")[spec])
    for candidate in damaged(value, random.Random(spec.name)):
        got = heads.read(spec, candidate)
        expected = decoded_head(codec, spec, candidate)
        if got is not None and expected is not None:
            assert got == expected, candidate.hex()


def test_a_head_the_model_refuses_is_left_to_the_full_decode(codec: AvroCodec) -> None:
    heads, pod = EventHeadReader(codec), example_events("head")[PODS]
    refused = {
        "no cluster": pod.model_construct(**{**dict(pod), "cluster": ""}),
        "no source": pod.model_construct(**{**dict(pod), "source": ""}),
        "in 2100": pod.model_construct(**{**dict(pod), "event_time": datetime(2100, 1, 1, tzinfo=UTC)}),
        "in 1999": pod.model_construct(**{**dict(pod), "event_time": datetime(1999, 12, 31, tzinfo=UTC)}),
    }
    for why, record in refused.items():
        value = codec.encode_dict(PODS, record.model_dump())
        assert heads.read(PODS, value) is None, why
        assert decoded_head(codec, PODS, value) is None, why
    good = codec.encode(PODS, pod)
    not_utf8 = good.replace(pod.source.encode(), b"\xff" * len(pod.source.encode()), 1)
    assert heads.read(PODS, not_utf8) is None


def test_a_record_of_another_schema_gets_no_head(codec: AvroCodec) -> None:
    """A body written with a schema that is not the topic's own is resolved by the full decode."""
    letter = DeadLetter(
        event_id="x", failed_at=datetime(2026, 1, 1, tzinfo=UTC), source_topic=PODS.name,
        source_partition=0, source_offset=0, reason="avro-decode-error", detail="-", consumer="g",
    )  # fmt: skip
    value = codec.encode(DLQ, letter)
    assert EventHeadReader(codec).read(PODS, value) is None
    pod = codec.encode(PODS, example_events("head")[PODS])
    assert EventHeadReader(codec).read(PODS, b"\x01" + pod[1:]) is None  # not our framing
