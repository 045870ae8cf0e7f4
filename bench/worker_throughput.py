"""Stream-worker throughput per processor, beside a plain consumer baseline, in events/s.

    python -m bench.worker_throughput

Publishes both real traces (Alibaba v2023: 21.5k pod/node events; GenAI: 52.6k events, mostly
GPU sample batches) to a private platform, then runs each processor in-process from offset 0
until it has processed every input record, and a plain confluent-kafka consumer that only
decodes the same records. One process, the broker on the same 2 cores. Prints, never asserts.
"""

from __future__ import annotations

import resource
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from gpulens.platform import private_platform
from pipeline.alerting import AlertRules
from pipeline.operators import AlertOperator, AllocationOperator, DeviceChangelogOperator, Operator
from pipeline.running import StreamWorker, WorkerOptions
from pipeline.windows import TumblingWindows
from producers.publishing import EventPublisher
from producers.replay import alibaba_v2023, genai_duty
from producers.replay.locating import traces_dir
from producers.replay.pacing import replay
from schemas.codec import AvroCodec, registry_client
from schemas.topic_admin import create_topics

HOUR = 3_600_000


def publish_traces(settings, codec: AvroCodec) -> None:
    traces = traces_dir()
    alibaba = alibaba_v2023.plan(
        alibaba_v2023.read_nodes(traces / "alibaba-gpu-v2023/openb_node_list_gpu_node.csv"),
        alibaba_v2023.read_pods(traces / "alibaba-gpu-v2023/openb_pod_list_default.csv"),
        cluster="alibaba",
        epoch=datetime(2023, 1, 1, tzinfo=UTC),
    )
    genai = genai_duty.plan(
        genai_duty.read_samples(traces / "alibaba-genai-2026/pod_gpu_duty_cycle_48pods.csv"), cluster="genai"
    )
    for events in (alibaba, genai):
        replay(events, EventPublisher(settings.kafka, codec))


def input_count(settings, operators: list[Operator]) -> int:
    probe = Consumer(settings.kafka.librdkafka(**{"group.id": "bench-probe"}))
    total = 0
    for spec in {s for op in operators for s in op.inputs}:
        for p in range(spec.partitions):
            total += probe.get_watermark_offsets(TopicPartition(spec.name, p), timeout=10)[1]
    probe.close()
    return total


def run_worker(settings, codec: AvroCodec, name: str, operators: list[Operator]) -> tuple[int, float]:
    expected = input_count(settings, operators)
    worker = StreamWorker(
        settings.kafka, codec, operators, WorkerOptions(group_id=f"bench-{name}", idle_ms=500)
    )
    stop = threading.Event()
    start = time.perf_counter()
    while worker.processed < expected:
        worker.step()
    elapsed = time.perf_counter() - start
    stop.set()
    worker.run(stop)
    return expected, elapsed


def baseline(settings, codec: AvroCodec, operators: list[Operator]) -> tuple[int, float]:
    """A plain consumer that only decodes the same input records (the floor of any processor)."""
    specs = {s.name: s for op in operators for s in op.inputs}
    expected = input_count(settings, operators)
    consumer = Consumer(
        settings.kafka.librdkafka(**{"group.id": "bench-baseline", "enable.auto.commit": False})
    )
    consumer.assign([TopicPartition(s.name, p, 0) for s in specs.values() for p in range(s.partitions)])
    seen = 0
    start = time.perf_counter()
    while seen < expected:
        for message in consumer.consume(10_000, 1.0):
            if message.error() is None:
                codec.decode(specs[message.topic()], message.value())
                seen += 1
    elapsed = time.perf_counter() - start
    consumer.close()
    return seen, elapsed


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, private_platform(Path(tmp)) as settings:
        create_topics(settings.kafka)
        codec = AvroCodec(registry_client(settings.registry.url))
        print("... publishing both traces", flush=True)
        publish_traces(settings, codec)
        cases: dict[str, list[Operator]] = {
            "allocation (30 s windows, per node)": [
                AllocationOperator(TumblingWindows(30_000), per_node=True)
            ],
            "allocation (1 h windows, cluster)": [
                AllocationOperator(TumblingWindows(3_600_000), per_node=False)
            ],
            "alerts": [AlertOperator(AlertRules())],
            "changelog": [DeviceChangelogOperator()],
        }
        rows = []
        for name, operators in cases.items():
            print(f"... {name}", flush=True)
            count, elapsed = baseline(settings, codec, operators)
            rows.append(("  baseline: consume + decode", count, count / elapsed))
            count, elapsed = run_worker(settings, codec, name.split()[0] + str(len(rows)), operators)
            rows.append((name, count, count / elapsed))
        print(f"\n{'processor':<38} {'records':>8} {'records/s':>10}")
        for name, count, rate in rows:
            print(f"{name:<38} {count:>8,} {rate:>10,.0f}")
        print(f"\npeak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MB")


if __name__ == "__main__":
    main()
