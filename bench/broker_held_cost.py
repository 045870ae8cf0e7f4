"""The embedded broker's CPU and memory by how much it holds, under the same steady stream.

    python -m bench.broker_held_cost [--rate 3000] [--value-bytes 700] [--holds 2000,20000,60000]

On a broker of its own (noida-db as `gpulens up` runs it: free port, temporary directory, its
malloc settings), one producer writes ``--rate`` records a second of ``--value-bytes`` random
bytes (incompressible, so the MB held are the MB written; zstd as every GPULens producer) to six
partitions, and every ``--cut-every`` s DeleteRecords keeps the newest ``hold`` records of the
topic, as `gpulens retention` keeps what the pipeline has not consumed yet. Per hold, after
``--settle`` s, it measures over ``--measure`` s the broker's CPU (% of one core), its RSS
(least and most, every 0.1 s) and how long it took to acknowledge each record (p50, p99,
max): what every producer on the machine waits. Then it asks five times where the records
stamped from the middle of what it holds begin (ListOffsets by time over the six partitions:
the question a worker behind asks for its watermark barriers; `gpulens retention` asks it too,
for its horizon) and prints the median answer's time. The first hold is the baseline: the same
stream with next to nothing held, what producing and deleting alone cost.

noida-db rewrites its whole state to one JSON file while anything changes, one save after the
other ("The broker's loss window" in the README), so its CPU and RSS follow what it holds, not
what flows through it. Prints the figures; never asserts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

from confluent_kafka import Consumer, IsolationLevel, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from bench.e2e_probes import usage
from gpulens.infra.broker import noida_argv
from gpulens.infra.glibc_malloc import FIXED_BOUNDS_ENV
from gpulens.infra.launching import ServiceManager, ServiceSpec
from gpulens.platform import free_port

TOPIC, PARTITIONS = "held-cost-bench", 6


def _cut(admin: AdminClient, reader: Consumer, hold: int) -> None:
    """Delete all but the newest ``hold`` records of the topic (spread over its partitions)."""
    cuts = []
    for partition in range(PARTITIONS):
        low, high = reader.get_watermark_offsets(TopicPartition(TOPIC, partition), timeout=10)
        if high - low > hold // PARTITIONS:
            cuts.append(TopicPartition(TOPIC, partition, high - hold // PARTITIONS))
    if cuts:
        for done in admin.delete_records(cuts, request_timeout=30).values():
            done.result()


def _question_s(admin: AdminClient, at_ms: int) -> float:
    """Seconds the broker takes to say where each partition's records stamped at ``at_ms`` or
    later begin (ListOffsets by time, as the worker's barriers and `gpulens retention` ask)."""
    started = time.monotonic()
    wanted = {TopicPartition(TOPIC, p): OffsetSpec.for_timestamp(at_ms) for p in range(PARTITIONS)}
    answers = admin.list_offsets(wanted, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=60)
    for answer in answers.values():
        answer.result()
    return time.monotonic() - started


def _acked(latencies: list[float] | None, sent: float, err: object, _message: object) -> None:
    if latencies is not None and err is None:
        latencies.append(time.monotonic() - sent)


def run(args: argparse.Namespace, servers: str, pid: int) -> None:
    admin = AdminClient({"bootstrap.servers": servers})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result()
    producer = Producer({"bootstrap.servers": servers, "compression.type": "zstd", "linger.ms": 20})
    reader = Consumer({"bootstrap.servers": servers, "group.id": "held-cost-bench"})
    values = [os.urandom(args.value_bytes) for _ in range(1_000)]
    written = 0
    print(f"{args.rate:,} records/s of {args.value_bytes} B to {PARTITIONS} partitions", flush=True)
    print(
        "records held   MB held   broker CPU   broker RSS (least-most)   acknowledged after (p50 / p99 / max)"
    )
    for hold in args.holds:
        started, cut_at, measured_from = time.monotonic(), 0.0, None
        rss: list[int] = []
        latencies: list[float] = []
        while (elapsed := time.monotonic() - started) < args.settle + args.measure:
            tick = time.monotonic()
            acked = partial(_acked, latencies if elapsed >= args.settle else None, tick)
            for _ in range(args.rate // 10):
                value = values[written % len(values)]
                while True:
                    try:
                        producer.produce(TOPIC, value, partition=written % PARTITIONS, on_delivery=acked)
                        break
                    except BufferError:  # the broker is not acknowledging: wait for it
                        producer.poll(0.1)
                written += 1
                producer.poll(0)
            if tick - cut_at >= args.cut_every:
                cut_at = tick
                _cut(admin, reader, hold)
            if elapsed >= args.settle:
                now = usage([pid])
                if now is None:
                    raise SystemExit("the broker is gone")
                if measured_from is None:
                    measured_from = (time.monotonic(), now.cpu_s)
                rss.append(now.rss_kb // 1024)
            while (left := tick + 0.1 - time.monotonic()) > 0:
                producer.poll(left)  # acknowledgements are timed as they come
        end = usage([pid])
        assert measured_from is not None and end is not None
        cpu = (end.cpu_s - measured_from[1]) / (time.monotonic() - measured_from[0])
        middle_ms = round((time.time() - hold / args.rate / 2) * 1000)  # what a consumer behind asks
        questions = [_question_s(admin, middle_ms) for _ in range(5)]
        mb = hold * args.value_bytes / 1e6
        ms = [round(1000 * s) for s in statistics.quantiles(latencies, n=100)]
        print(
            f"{hold:>12,}   {mb:7.0f}   {100 * cpu:8.0f} %   {min(rss):>5,}-{max(rss):,} MB"
            f"   {ms[49]:,} / {ms[98]:,} / {round(1000 * max(latencies)):,} ms"
            f"   {round(1000 * statistics.median(questions)):,} ms",
            flush=True,
        )
    producer.flush(30)
    reader.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=int, default=3_000, help="records produced a second")
    parser.add_argument("--value-bytes", type=int, default=700)
    parser.add_argument(
        "--holds",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[2_000, 20_000, 60_000, 150_000, 300_000],
        help="records the broker holds, one measurement each (the first is the baseline)",
    )
    parser.add_argument("--cut-every", type=float, default=2.0, help="seconds between two deletions")
    parser.add_argument("--settle", type=float, default=20.0, help="seconds before measuring each hold")
    parser.add_argument("--measure", type=float, default=40.0, help="seconds measured per hold")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="broker-held-cost-") as tmp:
        port = free_port()
        spec = ServiceSpec(
            "kafka",
            noida_argv("127.0.0.1", port, Path(tmp) / "kafka"),
            "127.0.0.1",
            port,
            env=dict(FIXED_BOUNDS_ENV),
        )
        services = ServiceManager(Path(tmp))
        services.start(spec)
        try:
            run(args, f"127.0.0.1:{port}", services.status(spec.name).pid or 0)
        finally:
            services.stop(spec.name)


if __name__ == "__main__":
    main()
