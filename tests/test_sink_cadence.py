"""The sink writes GPU samples every ``batch_seconds`` and every other table every
``state_batch_seconds``, and commits a topic's offsets only once its rows are written.

Each write is a part per table in ClickHouse, however few rows it holds (``python -m
bench.insert_cost``): the small tables of pods, workloads and containers are written less often
than the samples. On the real broker, registry and embedded engine.
"""

from __future__ import annotations

import time

from confluent_kafka import Consumer, Producer, TopicPartition
from sink_support import FAST, SinkThread, sample_batches, wait_for

from gpulens.schemas.model.topics import GPU_SAMPLES, PODS
from gpulens.testing.examples import example_events


def _committed(platform, sink: SinkThread, spec) -> int:
    """The sink group's committed offsets over ``spec``'s partitions, summed (-1: none)."""
    topic = sink.topics[spec.name]
    consumer = Consumer(platform.kafka.librdkafka(**{"group.id": sink.group}))
    try:
        offsets = consumer.committed(
            [TopicPartition(topic.name, p) for p in range(topic.partitions)], timeout=10
        )
    finally:
        consumer.close()
    return sum(tp.offset for tp in offsets if tp.offset >= 0) if any(tp.offset >= 0 for tp in offsets) else -1


def _pod(cluster: str):
    return example_events(cluster)[PODS]


def test_samples_are_stored_while_a_pod_waits_for_its_own_pace(platform, codec, unique) -> None:
    pace = 10.0
    sink = SinkThread(platform, codec, unique, FAST.model_copy(update={"state_batch_seconds": pace})).start()
    try:
        sink.wait_rows("gpu_samples", 0)  # migrated
        published = time.monotonic()
        sink.publish(PODS, [_pod(unique)])
        sink.publish(GPU_SAMPLES, sample_batches(unique, 20))
        sink.wait_rows("gpu_samples", 20 * 8)
        wait_for(lambda: _committed(platform, sink, GPU_SAMPLES) == 20, 30, "the samples' offsets committed")
        if time.monotonic() - published < pace * 0.9:  # else this machine was too slow to tell
            assert sink.scalar("SELECT count() FROM pods") == 0, "the pod was written at the samples' pace"
            assert _committed(platform, sink, PODS) == -1, "the pod's offset was committed before its row"
        sink.wait_rows("pods", 1)
        assert time.monotonic() - published >= pace
        wait_for(lambda: _committed(platform, sink, PODS) == 1, 30, "the pod's offset committed")
    finally:
        sink.stop()


def test_a_stopped_sink_writes_and_commits_the_rows_it_holds_at_either_pace(platform, codec, unique) -> None:
    sink = SinkThread(platform, codec, unique, FAST.model_copy(update={"state_batch_seconds": 600.0})).start()
    try:
        sink.wait_rows("gpu_samples", 0)
        sink.publish(GPU_SAMPLES, sample_batches(unique, 5))
        sink.wait_rows("gpu_samples", 5 * 8)
        sink.publish(PODS, [_pod(unique)])
        time.sleep(1)  # polled into the batch that waits 600 s
    finally:
        sink.stop()
    assert sink.scalar("SELECT count() FROM pods FINAL") == 1
    assert (_committed(platform, sink, PODS), _committed(platform, sink, GPU_SAMPLES)) == (1, 5)


def test_junk_alone_on_a_slow_topic_is_committed_with_the_samples(platform, codec, unique) -> None:
    """Nothing of the pods topic waits to be written: its dead-lettered records' offsets go with
    the next samples' commit, not after ``state_batch_seconds``."""
    sink = SinkThread(platform, codec, unique, FAST.model_copy(update={"state_batch_seconds": 600.0})).start()
    try:
        sink.wait_rows("gpu_samples", 0)
        producer = Producer(platform.kafka.librdkafka())
        for n in range(3):
            producer.produce(sink.topics[PODS.name].name, key=b"junk", value=b"not avro %d" % n)
        assert producer.flush(10) == 0
        sink.publish(GPU_SAMPLES, sample_batches(unique, 5))
        wait_for(lambda: _committed(platform, sink, PODS) == 3, 60, "the junk's offsets committed")
    finally:
        sink.stop()
