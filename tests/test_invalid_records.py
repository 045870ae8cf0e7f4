"""Records that break the event model's rules, or reuse an event id with other content, are
dead-lettered where they are consumed: the sink (real broker, real engine) and the worker name
the field and value at fault, and the sink keeps the first record of an id."""

from __future__ import annotations

import math
import threading
import tracemalloc
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from confluent_kafka import Producer
from sink_support import SinkThread, dead_letters

from gpulens.consumers.clickhouse.duplicates import DuplicateGuard
from gpulens.pipeline.operators import StateOperator
from gpulens.pipeline.running import StreamWorker, WorkerOptions
from gpulens.schemas.kafka.sharding import Shard
from gpulens.schemas.model.models import Record
from gpulens.schemas.model.topics import GPU_SAMPLES, NODES, PODS, TopicSpec, entity_key, record_key
from gpulens.schemas.wire.codec import AvroCodec
from gpulens.testing.examples import example_events


@pytest.fixture
def sink(platform, codec, unique):
    running = SinkThread(platform, codec, unique).start()
    yield running
    running.stop()


def produce(
    platform, sink: SinkThread, codec: AvroCodec, spec: TopicSpec, record: Record, **changes: Any
) -> None:
    """``record`` with ``changes`` on the sink's copy of ``spec``, written as any producer could:
    valid Avro, no model check."""
    topic = sink.topics[spec.name]
    producer = Producer(platform.kafka.librdkafka())
    producer.produce(
        topic.name,
        key=record_key(topic, record),
        value=codec.encode_dict(topic, {**record.model_dump(), **changes}),
    )
    assert producer.flush(30) == 0


def test_records_breaking_the_models_rules_are_dead_lettered_naming_field_and_value(
    platform, codec, sink, unique
):
    cluster, at = f"rules-{unique}", datetime.now(UTC) - timedelta(minutes=5)
    events = example_events(cluster, at=at)
    samples, pod, node = events[GPU_SAMPLES], events[PODS], events[NODES]
    nan_sample = {**samples.samples[0].model_dump(), "utilization_pct": math.nan}
    over_sample = {**samples.samples[0].model_dump(), "utilization_pct": 100.5}
    produce(platform, sink, codec, PODS, pod, event_id="negative", uid="pod-negative", gpu_amount=-1.0)
    produce(
        platform, sink, codec, GPU_SAMPLES, samples, event_id="nan", node="node-nan", samples=[nan_sample]
    )
    produce(
        platform, sink, codec, GPU_SAMPLES, samples, event_id="over", node="node-over", samples=[over_sample]
    )
    produce(
        platform,
        sink,
        codec,
        NODES,
        node,
        event_id="1970",
        node="node-1970",
        event_time=datetime(1970, 1, 2, tzinfo=UTC),
    )
    produce(
        platform,
        sink,
        codec,
        NODES,
        node,
        event_id="2200",
        node="node-2200",
        event_time=datetime(2200, 1, 1, tzinfo=UTC),
    )
    sink.publish(PODS, [pod])  # the valid record after them is stored
    sink.wait_rows("pods", 1, f"cluster = '{cluster}'")

    letters = dead_letters(platform, codec, {t.name for t in sink.topics.values()}, 5)
    details = sorted(letter.detail for letter in letters)
    assert {letter.reason for letter in letters} == {"invalid-record"}
    assert details == [
        "GpuSampleBatch.samples.0.utilization_pct: Input should be a finite number (value: nan)",
        "GpuSampleBatch.samples.0.utilization_pct: Input should be less than or equal to 100 (value: 100.5)",
        "NodeEvent.event_time: Input should be greater than or equal to 2000-01-01T00:00:00Z "
        "(value: 1970-01-02T00:00:00+00:00)",
        "NodeEvent.event_time: Input should be less than 2100-01-01T00:00:00Z "
        "(value: 2200-01-01T00:00:00+00:00)",
        "PodEvent.gpu_amount: Input should be greater than or equal to 0 (value: -1.0)",
    ]
    assert sink.scalar(f"SELECT count() FROM pods FINAL WHERE cluster = '{cluster}'") == 1
    assert sink.scalar(f"SELECT count() FROM nodes FINAL WHERE cluster = '{cluster}'") == 0
    assert sink.scalar(f"SELECT count() FROM gpu_samples WHERE cluster = '{cluster}'") == 0


def test_a_conflicting_duplicate_is_dead_lettered_and_the_first_record_kept(platform, codec, sink, unique):
    cluster, at = f"conflict-{unique}", datetime.now(UTC) - timedelta(minutes=5)
    first = example_events(cluster, at=at)[PODS]
    conflicting = first.model_copy(update={"phase": "Failed", "gpu_amount": 1.0})
    other = first.model_copy(update={"event_id": "other", "uid": "pod-other"})
    sink.publish(PODS, [first, first, conflicting, other])  # a true resend is no conflict
    sink.wait_rows("pods", 2, f"cluster = '{cluster}'")

    [letter] = dead_letters(platform, codec, {sink.topics[PODS.name].name}, 1)
    assert letter.reason == "conflicting-duplicate"
    assert first.event_id in letter.detail
    assert letter.value == codec.encode(sink.topics[PODS.name], conflicting)
    assert letter.source_offset == 2
    kept = sink.client().query(
        "SELECT phase, gpu_amount FROM pods FINAL WHERE cluster = {c:String} AND uid = {u:String}",
        parameters={"c": cluster, "u": first.uid},
    )
    assert kept.result_rows == [(first.phase, first.gpu_amount)]
    assert sink.scalar(f"SELECT count() FROM pod_events FINAL WHERE cluster = '{cluster}'") == 2


def test_the_worker_dead_letters_records_breaking_the_models_rules(platform, codec, unique):
    cluster = f"junk-{unique}"
    shard = Shard(next(i for i in range(1000) if Shard(i, 1000).owns_cluster(cluster.encode())), 1000)
    pod = example_events(cluster)[PODS]
    producer = Producer(platform.kafka.librdkafka())
    for changes in ({"gpu_amount": -1.0}, {"event_time": datetime(2200, 1, 1, tzinfo=UTC)}):
        value = codec.encode_dict(PODS, {**pod.model_dump(), **changes})  # valid Avro, no model check
        producer.produce(PODS.name, key=entity_key(cluster, pod.uid), value=value)
    assert producer.flush(30) == 0
    group = f"junk-{unique}"
    worker = StreamWorker(
        platform.kafka, codec, [StateOperator()], WorkerOptions(group_id=group, shard=shard)
    )
    stop = threading.Event()
    running = threading.Thread(target=worker.run, args=(stop,))
    running.start()
    try:
        letters = dead_letters(platform, codec, {PODS.name}, 2, consumer=group)
    finally:
        stop.set()
        running.join(60)
    assert not running.is_alive()
    assert sorted((letter.reason, letter.detail.split(":")[0]) for letter in letters) == [
        ("invalid-record", "PodEvent.event_time"),
        ("invalid-record", "PodEvent.gpu_amount"),
    ]


def test_the_duplicate_check_remembers_a_bounded_horizon_of_ids(codec):
    pods = [example_events("horizon")[PODS].model_copy(update={"event_id": f"e{i}"}) for i in range(10)]
    guard = DuplicateGuard(horizon=4)
    for pod in pods[:3]:
        assert guard.conflict(pod, codec.encode(PODS, pod)) is None
    changed = pods[0].model_copy(update={"phase": "Failed"})
    assert guard.conflict(changed, codec.encode(PODS, changed)) is not None  # within the horizon
    for pod in pods[3:]:
        assert guard.conflict(pod, codec.encode(PODS, pod)) is None
    # Seven ids later, e0 is past the horizon (at most 4 ids): the conflict goes unseen.
    assert guard.conflict(changed, codec.encode(PODS, changed)) is None
    other_schema = b"\x00\xff\xff\xff\xff" + codec.encode(PODS, changed)[5:]
    assert guard.conflict(changed, other_schema) is None  # bytes differ by schema: no conflict


def test_the_duplicate_check_keeps_no_id_text():
    """A full horizon of ids, each made for its record and dropped after (as the sink's are),
    takes under 50 bytes an id (its newest tenth in a dict, the rest in arrays): the ids' text
    (81 bytes each) is not what is kept."""
    value = b"\x00\x00\x00\x00\x07" + bytes(300)
    guard = DuplicateGuard(horizon=200_000)
    tracemalloc.start()
    try:
        for i in range(200_000):
            guard.conflict_of(f"{i:032x}", value)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert held < 50 * 200_000
    assert guard.conflict_of(f"{199_999:032x}", value[:-1] + b"\x01") is not None  # still guarded
