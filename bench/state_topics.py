"""The compacted state topics on the embedded broker: records kept against rows written.

    python -m bench.state_topics [--nodes 1250] [--seconds 1200] [--min-rows 10000]

On a private platform (noida-db, which never compacts), ``gpulens simulate``'s records for
``--nodes`` nodes of 8 GPUs over ``--seconds`` simulated seconds (pods coming and going), then
the worker's ``state`` processor alone, in-process, until it has processed them, compacting its
topics itself with ``--min-rows`` (:mod:`gpulens.pipeline.compaction`; 0: not at all). Per state
topic: the rows the worker wrote (what the broker would keep without the writer's compaction),
the records it keeps (each partition's end less its start: transaction markers included), and
the live keys. Then the keys and values the worker holds for them. Prints, never asserts.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from prometheus_client import REGISTRY

from bench.worker_throughput import input_count, publish_fleet
from gpulens.pipeline.compaction import WriterCompaction
from gpulens.pipeline.operators import StateOperator
from gpulens.pipeline.running import StreamWorker, WorkerOptions
from gpulens.platform import private_platform
from gpulens.schemas.kafka.topic_admin import create_topics
from gpulens.schemas.wire.codec import AvroCodec, registry_client


def kept(consumer: Consumer, topic: str, partitions: int) -> int:
    total = 0
    for partition in range(partitions):
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
        total += high - low
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1250, help="Simulated nodes (8 GPUs each).")
    parser.add_argument("--seconds", type=float, default=1200.0, help="Simulated seconds.")
    parser.add_argument("--min-rows", type=int, default=10_000, help="compaction_min_rows (0: off).")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, private_platform(Path(tmp)) as settings:
        create_topics(settings.kafka)
        codec = AvroCodec(registry_client(settings.registry.url))
        print(f"... publishing {args.nodes:,} nodes over {args.seconds:g} simulated s", flush=True)
        publish_fleet(settings, codec, args.nodes, args.seconds)
        operator = StateOperator()
        expected = input_count(settings, [operator])
        options = WorkerOptions(group_id="bench-state", idle_ms=500, compaction_min_rows=args.min_rows)
        worker = StreamWorker(settings.kafka, codec, [operator], options)
        while worker.processed < expected:
            worker.step()
        stop = threading.Event()
        stop.set()
        worker.run(stop)  # commits the last cycle (and its rewrite), then stops
        rows_out = "gpulens_worker_rows_out_total"
        written = {
            spec.name: int(REGISTRY.get_sample_value(rows_out, {"topic": spec.name}) or 0)
            for spec in operator.compacted
        }
        compaction = WriterCompaction(settings.kafka, operator.compacted, min_rows=args.min_rows)
        live = compaction.restore()  # what a restart learns: the live rows, read back
        probe = Consumer(settings.kafka.librdkafka(**{"group.id": "bench-state-probe"}))
        print(f"\n{'topic':<30} {'rows written':>13} {'records kept':>13} {'live keys':>10}")
        totals = [0, 0, 0]
        for spec in operator.compacted:
            name = spec.name
            row = (written[name], kept(probe, name, spec.partitions), compaction.live_rows(name))
            totals = [a + b for a, b in zip(totals, row, strict=True)]
            print(f"{spec.name:<30} {row[0]:>13,} {row[1]:>13,} {row[2]:>10,}")
        print(f"{'total':<30} {totals[0]:>13,} {totals[1]:>13,} {totals[2]:>10,}")
        probe.close()
        held = compaction.held_bytes()
        print(f"\nthe worker holds {live:,} live rows: {held / 1e6:.1f} MB of keys and values")


if __name__ == "__main__":
    main()
