"""What GPU samples cost the exporter, per 10,000 published (printed, never asserted).

    python -m bench.exporter_samples [--nodes N] [--rounds R]

Starts a private platform and publishes R rounds of a fleet of N nodes (8 GPUs, one batch per
node every 2 s of event time) on gpulens.gpu.samples.v1, plus one aggregate row per node per
30 s, and, on gpulens.state.gpu-samples.v1, the batches the worker's `latest` processor keeps
(one per node per 15 s). Then drains that backlog, each reader in a fresh group, and prints the
CPU seconds of this process (the reader's threads, librdkafka's included) per 10,000 samples
published:

- bare client: a confluent-kafka consumer over the sample stream, no decoding, then with the
  project's decode of every batch (what any reader of the stream pays at least);
- the former exporter: the default topics and the sample stream (as before this change);
- the exporter now: the default topics only (the agents serve per-GPU gauges);
- the exporter's per-GPU mode: the default topics and each node's newest batch.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from gpulens.consumers.prometheus import EXPORTED_TOPICS, PER_GPU_TOPICS, Exporter, ExporterSettings
from gpulens.pipeline.latest_samples import LatestSamples
from gpulens.platform import private_platform
from gpulens.schemas.kafka.settings import KafkaSettings
from gpulens.schemas.kafka.topic_admin import create_topics
from gpulens.schemas.model.models import GpuSample, GpuSampleBatch, NodeGpuAllocation
from gpulens.schemas.model.topics import (
    GPU_SAMPLES,
    NODE_ALLOCATION,
    STATE_GPU_SAMPLES,
    TopicSpec,
    record_key,
)
from gpulens.schemas.wire.codec import AvroCodec, registry_client

T0 = datetime(2024, 5, 1, tzinfo=UTC)
CLUSTER = "bench"


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def batch(node: int, r: int) -> GpuSampleBatch:
    return GpuSampleBatch(
        event_id=f"s/{node}/{r}",
        cluster=CLUSTER,
        event_time=T0 + timedelta(seconds=2 * r),
        source="bench",
        node=f"node-{node}",
        samples=[
            GpuSample(
                device_id=f"gpu-{node}-{i}",
                index=i,
                utilization_pct=float((node + i + r) % 100),
                power_watts=300.0 + i,
                memory_used_bytes=(i + 1) << 30,
            )
            for i in range(8)
        ],
    )


def node_row(node: int, window: int) -> NodeGpuAllocation:
    start = T0 + timedelta(seconds=30 * window)
    return NodeGpuAllocation(
        event_id=f"n/{node}/{window}",
        cluster=CLUSTER,
        node=f"node-{node}",
        window_start=start,
        window_end=start + timedelta(seconds=30),
        gpu_capacity=8.0,
        gpus_allocated_avg=4.0,
        gpus_allocated_max=8.0,
        gpus_allocated_end=4.0,
        allocation_rate_avg=0.5,
        pods_running_end=1,
    )


def publish(kafka: KafkaSettings, codec: AvroCodec, nodes: int, rounds: int) -> dict[str, int]:
    """The backlog; records per topic."""
    producer = Producer(kafka.librdkafka(**{"linger.ms": 20}))
    latest = LatestSamples(every_ms=15_000)
    counts = dict.fromkeys((GPU_SAMPLES.name, STATE_GPU_SAMPLES.name, NODE_ALLOCATION.name), 0)

    def send(spec: TopicSpec, key: bytes, value: bytes) -> None:
        while True:
            try:
                producer.produce(spec.name, key=key, value=value)
                counts[spec.name] += 1
                return
            except BufferError:
                producer.poll(0.1)

    for r in range(rounds):
        for n in range(nodes):
            b = batch(n, r)
            value = codec.encode(GPU_SAMPLES, b)
            send(GPU_SAMPLES, record_key(GPU_SAMPLES, b), value)
            if latest.process(b):
                send(STATE_GPU_SAMPLES, record_key(STATE_GPU_SAMPLES, b), value)
            if r % 15 == 0:
                row = node_row(n, r // 15)
                send(NODE_ALLOCATION, record_key(NODE_ALLOCATION, row), codec.encode(NODE_ALLOCATION, row))
    assert producer.flush(120) == 0
    return counts


def bare(kafka: KafkaSettings, codec: AvroCodec, records: int, *, decode: bool) -> float:
    """CPU seconds to read ``records`` of the sample stream (decoding each, or not)."""
    consumer = Consumer(
        kafka.librdkafka(**{"group.id": f"bare-{time.monotonic_ns()}", "enable.auto.commit": False})
    )
    consumer.assign([TopicPartition(GPU_SAMPLES.name, p, 0) for p in range(GPU_SAMPLES.partitions)])
    started, read = cpu_s(), 0
    try:
        while read < records:
            for message in consumer.consume(5_000, 1.0):
                if message.error() is None:
                    if decode:
                        codec.decode(GPU_SAMPLES, message.value() or b"")
                    read += 1
        return cpu_s() - started
    finally:
        consumer.close()


def exporter(
    kafka: KafkaSettings, codec: AvroCodec, topics: Sequence[TopicSpec], counts: dict[str, int], name: str
) -> float:
    """CPU seconds for a new exporter over ``topics`` to take every record of them in."""
    settings = ExporterSettings(
        port=0, group_id=f"bench-{name}-{time.monotonic_ns()}", sample_tail_records=10**9, lag_interval_s=60
    )
    started = cpu_s()
    made = Exporter(kafka, codec, settings, topics=topics)
    made.start()
    done: Callable[[], bool] = lambda: all(  # noqa: E731
        (made.registry.get_sample_value("gpulens_exporter_records_in_total", {"topic": t.name}) or 0)
        >= counts.get(t.name, 0)
        for t in topics
    )
    try:
        while not done():
            made.step()
        return cpu_s() - started
    finally:
        made.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1_000, help="Nodes of 8 GPUs.")
    parser.add_argument("--rounds", type=int, default=30, help="Batches per node, 2 s of event time apart.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, private_platform(Path(tmp)) as platform:
        create_topics(platform.kafka)
        codec = AvroCodec(registry_client(platform.registry.url))
        counts = publish(platform.kafka, codec, args.nodes, args.rounds)
        per = 10_000 / (counts[GPU_SAMPLES.name] * 8)
        results = {
            "bare client, no decode": bare(platform.kafka, codec, counts[GPU_SAMPLES.name], decode=False),
            "bare client + decode": bare(platform.kafka, codec, counts[GPU_SAMPLES.name], decode=True),
            "exporter, former (reads samples)": exporter(
                platform.kafka, codec, (*EXPORTED_TOPICS, GPU_SAMPLES), counts, "former"
            ),
            "exporter, default (no samples)": exporter(platform.kafka, codec, EXPORTED_TOPICS, counts, "now"),
            "exporter, per_gpu (newest per node)": exporter(
                platform.kafka, codec, PER_GPU_TOPICS, counts, "per-gpu"
            ),
        }
    samples = counts[GPU_SAMPLES.name] * 8
    print(
        f"\n{args.nodes} nodes x 8 GPUs, {args.rounds} batches each: {samples:,} samples published "
        f"({counts[GPU_SAMPLES.name]:,} batches; {counts[STATE_GPU_SAMPLES.name]:,} on "
        f"{STATE_GPU_SAMPLES.name}; {counts[NODE_ALLOCATION.name]:,} node rows)"
    )
    print(f"{'reader':40} {'CPU s':>8} {'CPU s per 10k samples':>22}")
    for name, cpu in results.items():
        print(f"{name:40} {cpu:8.2f} {cpu * per:22.3f}")


if __name__ == "__main__":
    main()
