"""The gateway's batch check: its compiled fast path agrees with an exact decode on every verdict.

The validator matches each topic's encoding with a regular expression and decodes exactly only
what the expression does not match. These tests take a real record of every topic, damage it
in every way a byte can be damaged (cut short, one byte changed, one byte too many, another
key) and compare the validator's verdict with one made independently here: fastavro through
the codec, then the record's key.
"""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta

import pytest
from avro_damage import damaged

from gpulens.producers.gateway.exceptions import InvalidBatch, RejectReason
from gpulens.producers.gateway.validating import BatchValidator
from gpulens.protos.gateway.v1 import ingest_pb2
from gpulens.schemas.model.exceptions import DecodeError
from gpulens.schemas.model.models import EARLIEST, LATEST, Record
from gpulens.schemas.model.topics import GPU_SAMPLES, NODES, PODS, STORAGE, TopicSpec, record_key
from gpulens.schemas.wire.codec import AvroCodec
from gpulens.schemas.wire.publishable import compile_shape
from gpulens.testing.examples import example_events

TOPICS = list(example_events())
"""The topics agents and watchers send: every one gpulens.testing.examples has a record for."""


def encoded(codec: AvroCodec, spec: TopicSpec) -> tuple[bytes, bytes]:
    record = example_events("validation")[spec]
    return record_key(spec, record), codec.encode(spec, record)


def exactly_publishable(codec: AvroCodec, spec: TopicSpec, key: bytes, value: bytes) -> bool:
    """The reference verdict: the value decodes whole to a valid record and the key is its record's."""
    try:
        record = codec.decode(spec, value)
    except DecodeError:
        return False
    return key == record_key(spec, record)


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


def _edges(spec: TopicSpec, record: Record) -> list[Record]:
    """Copies of ``record`` with values at and beyond the model's bounds (times, amounts, %)."""
    ms = timedelta(milliseconds=1)
    times = [
        EARLIEST - ms,
        EARLIEST,
        EARLIEST + timedelta(days=200),
        LATEST - ms,
        LATEST,
        datetime(2039, 9, 8, tzinfo=UTC),
    ]
    copies: list[Record] = [record.model_construct(**{**dict(record), "event_time": t}) for t in times]
    if spec is GPU_SAMPLES:
        sample = record.samples[0]  # type: ignore[attr-defined]
        for pct in (0.0, -0.0, 100.0, 100.00000000000001, -1e-300, math.nan, math.inf, 5e-324):
            bad = sample.model_construct(**{**dict(sample), "utilization_pct": pct, "power_watts": pct})
            copies.append(record.model_construct(**{**dict(record), "samples": [bad]}))
    return copies


@pytest.mark.parametrize("spec", [NODES, PODS, GPU_SAMPLES, STORAGE], ids=lambda s: s.name)
def test_values_at_the_models_bounds_get_the_verdict_of_an_exact_decode(
    codec: AvroCodec, spec: TopicSpec
) -> None:
    validator = BatchValidator(codec)
    record = example_events("validation")[spec]
    for copy in _edges(spec, record):
        key, value = record_key(spec, copy), codec.encode_dict(spec, copy.model_dump())
        assert verdict(validator, spec, key, value) == exactly_publishable(codec, spec, key, value), copy
