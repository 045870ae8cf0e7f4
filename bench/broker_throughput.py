"""Avro records through the embedded broker: encode, produce, consume + decode, events/s.

    python -m bench.broker_throughput [--records N] [--broker noida|tansu]

Starts a private platform (free ports, temporary state), so it never touches a running one.
Each figure is one process on this machine; the broker shares the same cores.
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from gpulens.config import GPULensSettings
from gpulens.platform import private_platform
from gpulens.schemas.kafka.topic_admin import create_topics
from gpulens.schemas.model.topics import GPU_SAMPLES, PODS, TopicSpec, record_key
from gpulens.schemas.wire.codec import AvroCodec, registry_client
from gpulens.testing.examples import example_events


def _rate(count: int, seconds: float) -> str:
    return f"{count / seconds:>12,.0f}/s"


def bench_topic(
    settings: GPULensSettings, codec: AvroCodec, spec: TopicSpec, records: int
) -> list[tuple[str, str, str]]:
    event = example_events()[spec]
    topic = TopicSpec(f"bench.{spec.name}.{os.getpid()}", spec.record, spec.key_field, 6)
    create_topics(settings.kafka, [topic])
    values = event.model_dump()
    size = len(codec.encode(topic, event))
    rows = []

    start = time.perf_counter()
    payloads = [codec.encode_dict(topic, {**values, "event_id": str(i)}) for i in range(records)]
    rows.append((spec.record.__name__, f"encode ({size} B)", _rate(records, time.perf_counter() - start)))

    producer = Producer(
        settings.kafka.librdkafka(
            **{"linger.ms": 20, "batch.num.messages": 10_000, "queue.buffering.max.messages": 1_000_000}
        )
    )
    key = record_key(spec, event)
    start = time.perf_counter()
    for payload in payloads:
        producer.produce(topic.name, key=key, value=payload)
        producer.poll(0)
    producer.flush(120)
    rows.append((spec.record.__name__, "produce", _rate(records, time.perf_counter() - start)))

    for mode in ("consume + decode to dict", "consume + decode to model"):
        consumer = Consumer(
            settings.kafka.librdkafka(
                **{
                    "group.id": f"bench-{mode}-{os.getpid()}",
                    "auto.offset.reset": "earliest",
                    "enable.auto.commit": False,
                }
            )
        )
        consumer.assign([TopicPartition(topic.name, p, 0) for p in range(6)])
        decode = codec.decode_dict if "dict" in mode else codec.decode
        seen = 0
        start = time.perf_counter()
        while seen < records:
            for message in consumer.consume(10_000, 1.0):
                if message.error() is None:
                    decode(topic, message.value() or b"")
                    seen += 1
        rows.append((spec.record.__name__, mode, _rate(records, time.perf_counter() - start)))
        consumer.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=200_000, help="records per topic (default 200,000)")
    parser.add_argument("--broker", choices=["noida", "tansu"], default="noida")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, private_platform(Path(tmp), broker=args.broker) as settings:
        codec = AvroCodec(registry_client(settings.registry.url))
        rows = []
        for spec in (PODS, GPU_SAMPLES):
            print(f"... {spec.record.__name__}: {args.records:,} records", flush=True)
            rows += bench_topic(settings, codec, spec, args.records)
    print(f"\nbroker {args.broker}, {os.cpu_count()} cores, one client process\n")
    print(f"{'record':<16} {'step':<28} {'events':>14}")
    for record, step, rate in rows:
        print(f"{record:<16} {step:<28} {rate:>14}")
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\nclient peak RSS {peak_mb:,.0f} MB")


if __name__ == "__main__":
    main()
