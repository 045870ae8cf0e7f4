"""The worker's `latest` processor: each node's newest GPU sample batch on the compacted
gpulens.state.gpu-samples.v1, at most one per node per --latest-every of event time.

`gpulens worker --processors latest` runs as a process on a private platform; what it writes
is read back and compared with the batches a rule computed here picks (a node's first, then
the first at least the interval after the last one kept), byte for byte. A fleet's backlog,
read by column in-process, goes out as it was published: the same body under the state
topic's schema id.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from prometheus_client import REGISTRY
from test_exporter import sample_batch
from test_worker import committed_values

from gpulens.pipeline.operators import LatestSamplesOperator
from gpulens.pipeline.running import StreamWorker, WorkerOptions
from gpulens.schemas.model.models import GpuSampleBatch, Watermark
from gpulens.schemas.model.topics import DLQ, GPU_SAMPLES, STATE_GPU_SAMPLES, WATERMARKS, record_key

EVERY_S = 10
BY_COLUMN = "gpulens_worker_sample_batches_by_column_total"
AS_BYTES = "gpulens_worker_records_held_as_bytes_total"
T0 = datetime(2024, 5, 1, tzinfo=UTC)  # sample_batch's epoch


@pytest.fixture
def platform(module_platform):
    return module_platform[0]


def due(seconds: list[int], every_s: int) -> list[int]:
    """The sample times republished: the first, then each one at least ``every_s`` after the last kept."""
    kept: list[int] = []
    for second in seconds:
        if not kept or second - kept[-1] >= every_s:
            kept.append(second)
    return kept


def read_cluster(
    platform, codec, cluster: str, count: int, timeout: float = 90
) -> list[tuple[GpuSampleBatch, bytes]]:
    """The batches of ``cluster`` on the state topic, each with its wire bytes."""
    consumer = Consumer(
        platform.kafka.librdkafka(
            **{
                "group.id": f"latest-{cluster}",
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
            }
        )
    )
    consumer.subscribe([STATE_GPU_SAMPLES.name])
    found: list[tuple[GpuSampleBatch, bytes]] = []
    deadline = time.monotonic() + timeout
    try:
        while len(found) < count:
            assert time.monotonic() < deadline, f"{len(found)} of {count} batches in time"
            message = consumer.poll(0.2)
            if message is None or message.error() is not None:
                continue
            batch = codec.decode(STATE_GPU_SAMPLES, message.value())
            if batch.cluster == cluster:
                assert message.key() == record_key(STATE_GPU_SAMPLES, batch)
                found.append((batch, message.value()))
        end = time.monotonic() + 1.0  # and nothing more
        while time.monotonic() < end:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                batch = codec.decode(STATE_GPU_SAMPLES, message.value())
                assert batch.cluster != cluster, f"one batch too many: {batch.node} at {batch.event_time}"
    finally:
        consumer.close()
    return found


def test_each_nodes_batch_is_republished_at_most_once_per_interval(
    platform, module_platform, codec, unique, spawned
):
    cluster, nodes = f"latest-{unique}", ("n0", "n1")
    seconds = {"n0": list(range(0, 61, 2)), "n1": [1, 4, 9, 11, 20, 29, 31, 45, 47, 58]}
    batches = [sample_batch(cluster, n, s, (float(s), 100.0 - s)) for n in nodes for s in seconds[n]]
    end = Watermark(
        event_id=f"{cluster}/end",
        cluster=cluster,
        event_time=T0 + timedelta(seconds=90),
        source="node-agent",
        final=True,
    )
    producer = Producer(platform.kafka.librdkafka())
    for batch in batches:
        producer.produce(
            GPU_SAMPLES.name, key=record_key(GPU_SAMPLES, batch), value=codec.encode(GPU_SAMPLES, batch)
        )
    producer.produce(WATERMARKS.name, key=record_key(WATERMARKS, end), value=codec.encode(WATERMARKS, end))
    assert producer.flush(30) == 0

    config = module_platform[1]
    log = config.parent / f"worker-latest-{unique}.log"
    command = [sys.executable, "-m", "gpulens", "--config", str(config), "worker", "--processors", "latest",
               "--latest-every", str(EVERY_S), "--group", f"latest-{unique}"]  # fmt: skip
    with log.open("wb") as stderr:
        spawned.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr))

    want = [b for n in nodes for b in batches if b.node == n and b.event_time in {
        T0 + timedelta(seconds=s) for s in due(seconds[n], EVERY_S)}]  # fmt: skip
    assert len(want) == 7 + 5  # n0: 0, 10, ..., 60; n1: 1, 11, 29, 45, 58
    got = [batch for batch, _ in read_cluster(platform, codec, cluster, len(want))]
    for node in nodes:  # in event-time order per node, each exactly as published
        assert [b for b in got if b.node == node] == [b for b in want if b.node == node], log.read_text()


def publish(platform, codec, batches: list[GpuSampleBatch]) -> list[bytes]:
    """Publishes ``batches`` on the sample topic; their wire bytes."""
    producer = Producer(platform.kafka.librdkafka(**{"linger.ms": 50}))
    values = [codec.encode(GPU_SAMPLES, batch) for batch in batches]
    for batch, value in zip(batches, values, strict=True):
        producer.produce(GPU_SAMPLES.name, key=record_key(GPU_SAMPLES, batch), value=value)
    assert producer.flush(30) == 0
    return values


@pytest.mark.parametrize("hold_columns", [50_000, 0], ids=["read-when-fetched", "held-as-bytes"])
def test_batches_read_by_column_go_out_as_published_under_the_state_topics_schema_id(
    platform, codec, unique, hold_columns: int
) -> None:
    """Read by column when fetched, or (``hold_columns`` 0: every batch held as its bytes,
    placed by its head) by column when released: the same bodies go out."""
    cluster, nodes, seconds = f"columns-{unique}", [f"n{i}" for i in range(60)], range(0, 21, 2)
    batches = [sample_batch(cluster, n, s, (float(s), 50.0)) for s in seconds for n in nodes]
    values = dict(zip((b.event_id for b in batches), publish(platform, codec, batches), strict=True))
    probe = Consumer(platform.kafka.librdkafka(**{"group.id": f"probe-{unique}"}))
    backlog = sum(
        probe.get_watermark_offsets(TopicPartition(GPU_SAMPLES.name, p), timeout=10)[1]
        for p in range(GPU_SAMPLES.partitions)
    )
    probe.close()
    by_column, as_bytes = (REGISTRY.get_sample_value(name) or 0.0 for name in (BY_COLUMN, AS_BYTES))
    worker = StreamWorker(
        platform.kafka,
        codec,
        [LatestSamplesOperator(EVERY_S * 1000)],
        WorkerOptions(f"columns-{unique}", idle_ms=0, hold_columns=hold_columns),
    )
    deadline = time.monotonic() + 60
    while worker.processed < backlog:
        assert time.monotonic() < deadline, f"{worker.processed} of {backlog} records processed"
        worker.step()
    stopped = threading.Event()
    stopped.set()
    worker.run(stopped)  # commits and closes it
    read = (REGISTRY.get_sample_value(BY_COLUMN) or 0.0) - by_column
    assert read >= len(batches) / 2, f"{read:.0f} of {len(batches)} batches read by column"
    held = (REGISTRY.get_sample_value(AS_BYTES) or 0.0) - as_bytes
    if hold_columns:  # never reached: every batch held as it was read, by column
        assert held == 0, f"{held:.0f} batches held as bytes"
    else:  # all but the first, which made the source heard
        assert held >= len(batches) - 1, f"{held:.0f} batches held as bytes"

    state_id = (
        SchemaRegistryClient({"url": platform.registry.url})
        .get_latest_version(STATE_GPU_SAMPLES.subject)
        .schema_id
    )
    got = read_cluster(platform, codec, cluster, len(nodes) * len(due(list(seconds), EVERY_S)))
    assert sorted((b.node, b.event_time) for b, _ in got) == sorted(
        (n, T0 + timedelta(seconds=s)) for n in nodes for s in due(list(seconds), EVERY_S)
    )
    for batch, value in got:
        assert value == bytes([0]) + state_id.to_bytes(4, "big") + values[batch.event_id][5:]


def test_a_batch_held_as_bytes_whose_body_is_cut_is_dead_lettered_when_released(
    platform, codec, unique
) -> None:
    """Held as bytes (``hold_columns`` 0), a batch is placed by its head alone; when the release
    reads the batches by column, its cut body is refused: dead-lettered with the full decode's
    reason, every other batch read by column and republished."""
    cluster, group, nodes = f"cut-{unique}", f"cut-{unique}", [f"n{i}" for i in range(80)]
    batches = [sample_batch(cluster, n, s, (float(s), 50.0)) for s in (0, EVERY_S) for n in nodes]
    values = [codec.encode(GPU_SAMPLES, batch) for batch in batches]
    cut = len(nodes) + 20  # n20's second batch: its source heard long before
    values[cut] = values[cut][:-3]
    producer = Producer(platform.kafka.librdkafka(**{"linger.ms": 50}))
    for batch, value in zip(batches, values, strict=True):
        producer.produce(GPU_SAMPLES.name, key=record_key(GPU_SAMPLES, batch), value=value)
    assert producer.flush(30) == 0
    by_column = REGISTRY.get_sample_value(BY_COLUMN) or 0.0
    options = WorkerOptions(group, idle_ms=0, hold_columns=0)
    worker = StreamWorker(platform.kafka, codec, [LatestSamplesOperator(EVERY_S * 1000)], options)
    deadline = time.monotonic() + 60
    while worker.processed < len(batches):
        assert time.monotonic() < deadline, f"{worker.processed} of {len(batches)} records processed"
        worker.step()
    stopped = threading.Event()
    stopped.set()
    worker.run(stopped)  # commits and closes it

    letters = [codec.decode(DLQ, v) for v in committed_values(platform, DLQ.name)]
    assert [(d.reason, d.value) for d in letters if d.consumer == group] == [
        ("avro-decode-error", values[cut])
    ]
    assert (REGISTRY.get_sample_value(BY_COLUMN) or 0.0) - by_column >= len(batches) / 2
    got = read_cluster(platform, codec, cluster, len(batches) - 1)
    assert sorted((b.node, b.event_time) for b, _ in got) == sorted(
        (b.node, b.event_time) for i, b in enumerate(batches) if i != cut
    )
