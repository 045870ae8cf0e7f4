"""The gateway's batch check: its compiled fast path agrees with an exact decode on every verdict.

The validator matches each topic's encoding with a regular expression and decodes exactly only
what the expression does not match. These tests take a real record of every topic, damage it
in every way a byte can be damaged (cut short, one byte changed, one byte too many, another
key) and compare the validator's verdict with one made independently here: fastavro through
the codec, then the record's key.
"""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import cast

import pytest
from avro_damage import damaged

from producers.gateway.exceptions import InvalidBatch, RejectReason
from producers.gateway.validating import BatchValidator, compile_shape
from protos.gateway.v1 import ingest_pb2
from schemas.codec import AvroCodec
from schemas.examples import example_events
from schemas.exceptions import DecodeError
from schemas.models import Record
from schemas.topics import NODES, PODS, STORAGE, TopicSpec, record_key

TOPICS = list(example_events())
"""The topics agents and watchers send: every one schemas.examples has a record for."""


def encoded(codec: AvroCodec, spec: TopicSpec) -> tuple[bytes, bytes]:
    record = example_events("validation")[spec]
    return record_key(spec, record), codec.encode(spec, record)


def exactly_publishable(codec: AvroCodec, spec: TopicSpec, key: bytes, value: bytes) -> bool:
    """The reference verdict: the value decodes whole and the key is its record's."""
    try:
        values = codec.decode_dict(spec, value)
    except DecodeError:
        return False
    return key == record_key(spec, cast(Record, SimpleNamespace(**values)))


def verdict(validator: BatchValidator, spec: TopicSpec, key: bytes, value: bytes) -> bool:
    batch = ingest_pb2.EventBatch(
        batch_id="b", events=[ingest_pb2.Event(topic=spec.name, key=key, value=value)]
    )
    try:
        validator.check(batch)
    except InvalidBatch:
        return False
    return True


@pytest.mark.parametrize("spec", TOPICS, ids=lambda s: s.name)
def test_the_fast_path_covers_the_records_agents_and_watchers_send(codec: AvroCodec, spec: TopicSpec) -> None:
    key, value = encoded(codec, spec)
    shape = compile_shape(spec, codec.schema_id(spec))
    assert shape is not None
    assert shape.accepts(key, value)


@pytest.mark.parametrize("spec", TOPICS, ids=lambda s: s.name)
def test_damaged_records_get_the_verdict_of_an_exact_decode(codec: AvroCodec, spec: TopicSpec) -> None:
    key, value = encoded(codec, spec)
    validator = BatchValidator(codec)
    rng = random.Random(spec.name)
    disagreements = [
        candidate
        for candidate in damaged(value, rng)
        if verdict(validator, spec, key, candidate) != exactly_publishable(codec, spec, key, candidate)
    ]
    assert not disagreements, f"{len(disagreements)} verdicts differ, e.g. {disagreements[0].hex()}"


@pytest.mark.parametrize("spec", TOPICS, ids=lambda s: s.name)
def test_a_record_under_another_key_is_refused_as_a_key_mismatch(codec: AvroCodec, spec: TopicSpec) -> None:
    key, value = encoded(codec, spec)
    batch = ingest_pb2.EventBatch(
        batch_id="b", events=[ingest_pb2.Event(topic=spec.name, key=key + b"x", value=value)]
    )
    with pytest.raises(InvalidBatch) as refused:
        BatchValidator(codec).check(batch)
    assert refused.value.reason == RejectReason.KEY_MISMATCH


def test_a_record_larger_than_the_producer_takes_is_refused_as_too_large(codec: AvroCodec) -> None:
    key, value = encoded(codec, STORAGE)
    batch = ingest_pb2.EventBatch(
        batch_id="b", events=[ingest_pb2.Event(topic=STORAGE.name, key=key, value=value)]
    )
    with pytest.raises(InvalidBatch) as refused:
        BatchValidator(codec, max_record_bytes=len(value)).check(batch)
    assert refused.value.reason == RejectReason.TOO_LARGE


def test_a_good_batch_comes_back_by_topic_in_the_order_sent(codec: AvroCodec) -> None:
    events = [(spec, *encoded(codec, spec)) for spec in (PODS, NODES, PODS)]
    batch = ingest_pb2.EventBatch(
        batch_id="b", events=[ingest_pb2.Event(topic=s.name, key=k, value=v) for s, k, v in events]
    )
    checked = BatchValidator(codec).check(batch)
    assert checked == {
        PODS.name: [
            {"key": events[0][1], "value": events[0][2]},
            {"key": events[2][1], "value": events[2][2]},
        ],
        NODES.name: [{"key": events[1][1], "value": events[1][2]}],
    }
