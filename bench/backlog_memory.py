"""A consumer's memory while it reads a backlog slowly, by broker and fetch settings.

    python -m bench.backlog_memory [--nodes 12500] [--seconds 20] [--brokers noida,tansu]

Per broker, on a private platform of its own, the fleet simulator publishes ``--seconds`` of
``--nodes`` nodes' records (8 GPUs a node, one GpuSampleBatch a node every 2 s; compressed as
every GPULens producer compresses). Then, once per fetch setting, a fresh process assigns a bare
confluent-kafka consumer to every partition of the GPU samples from offset 0 and reads 10
records every 0.1 s for 15 s, far slower than the backlog came: its peak RSS is what librdkafka
fetched ahead and holds. The settings: librdkafka's defaults (the baseline), a byte bound per
partition fetch (``max.partition.fetch.bytes``), a bound on the queue
(``queued.max.messages.kbytes``), and the pipeline's own pacing (``queued.min.messages`` 1,
``fetch.queue.backoff.ms``: ``KafkaSettings.streaming_consumer``). Prints the figures; never
asserts.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from gpulens.platform import private_platform
from gpulens.producers.publishing import EventPublisher
from gpulens.producers.simulate import ClusterSimulation, SimulationSpec, publish_simulation
from gpulens.schemas.kafka.topic_admin import create_topics
from gpulens.schemas.wire.codec import AvroCodec, registry_client

SETTINGS: dict[str, dict[str, int]] = {
    "librdkafka's defaults": {},
    "max.partition.fetch.bytes 64 KB": {"max.partition.fetch.bytes": 65_536},
    "queued.max.messages.kbytes 4 MB": {"queued.max.messages.kbytes": 4_096},
}

SLOW_READER = """
import json, sys, time
from confluent_kafka import Consumer, TopicPartition
from gpulens.schemas.model.topics import GPU_SAMPLES
def rss():
    return next(int(l.split()[1]) // 1024 for l in open('/proc/self/status') if l.startswith('VmRSS'))
before = rss()
conf = {"bootstrap.servers": sys.argv[2], "group.id": "backlog-memory", **json.loads(sys.argv[1])}
consumer = Consumer(conf)
consumer.assign([TopicPartition(GPU_SAMPLES.name, p, 0) for p in range(GPU_SAMPLES.partitions)])
read, peak, started = 0, 0, time.monotonic()
while time.monotonic() - started < 15:
    read += len(consumer.consume(10, 0.1))
    time.sleep(0.1)
    peak = max(peak, rss())
consumer.close()
print(json.dumps({"read": read, "before": before, "peak": peak}))
"""


def measure(broker: str, nodes: int, seconds: float) -> None:
    with private_platform(Path(tempfile.mkdtemp(prefix="backlog-memory-")), broker=broker) as settings:
        create_topics(settings.kafka)
        codec = AvroCodec(registry_client(settings.registry.url))
        spec = SimulationSpec(
            nodes=nodes, gpus_per_node=8, interval_s=2.0, start=datetime(2025, 1, 1, tzinfo=UTC),
            duration_s=seconds, cluster="backlog",
        )  # fmt: skip
        progress = publish_simulation(ClusterSimulation(spec), EventPublisher(settings.kafka, codec), speed=0)
        size = f"{nodes:,} nodes, {seconds:.0f} s"
        print(f"\n{broker}: {progress.records:,} records published ({size})", flush=True)
        print("| fetch settings | records read | RSS before MB | RSS peak MB |\n|---|---|---|---|")
        pacing = {
            k: v
            for k, v in settings.kafka.streaming_consumer().items()
            if k not in settings.kafka.librdkafka()
        }
        for name, conf in {**SETTINGS, "the pipeline's pacing": pacing}.items():
            argv = [sys.executable, "-c", SLOW_READER, json.dumps(conf), settings.kafka.bootstrap_servers]
            out = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
            print(f"| {name} | {out['read']:,} | {out['before']} | **{out['peak']}** |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=12_500)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--brokers", default="noida,tansu")
    args = parser.parse_args()
    for broker in args.brokers.split(","):
        measure(broker, args.nodes, args.seconds)


if __name__ == "__main__":
    main()
