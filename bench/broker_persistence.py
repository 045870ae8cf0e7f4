"""The embedded broker's loss window: when noida-db saves, what a SIGKILL loses, how long a clean stop takes.

    python -m bench.broker_persistence [--mb 1000] [--value-bytes 1000] [--end clean|kill]

On a broker of its own (noida-db, free port, temporary directory), started and stopped by
:class:`gpulens.infra.launching.ServiceManager` as `gpulens infra up|down` do:

1. publishes ``--mb`` megabytes of values with an idempotent producer (``acks=all``) and
   counts the records the broker acknowledged;
2. watches the broker's snapshot file (``kafka.json``) for ``--watch-s`` seconds and prints
   each save: when it landed and its size (noida-db rewrites the whole state as one JSON file
   every time, so the interval grows with the data held: that interval is the loss window);
3. ends the broker: ``clean`` times ``ServiceManager.stop`` (SIGTERM, then waiting while the
   broker works), ``kill`` sends SIGKILL right after a fresh burst of ``--burst`` acknowledged
   records;
4. starts it again and counts the records on the topic (end offsets): acknowledged minus
   found is what was lost.

Prints the figures; never asserts.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from gpulens.infra.broker import noida_argv
from gpulens.infra.launching import ServiceManager, ServiceSpec
from gpulens.platform import free_port

TOPIC, PARTITIONS = "persistence-bench", 6


def publish(servers: str, records: int, value: bytes) -> int:
    """Publish ``records`` values; how many the broker acknowledged."""
    acked = 0

    def delivered(err: object, _message: object) -> None:
        nonlocal acked
        acked += err is None

    producer = Producer({"bootstrap.servers": servers, "enable.idempotence": True, "linger.ms": 20})
    for i in range(records):
        while True:
            try:
                producer.produce(TOPIC, key=i.to_bytes(8, "big"), value=value, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    producer.flush(600)
    return acked


def stored(servers: str) -> int:
    """Records on the topic: the sum of its partitions' end offsets (asked until the broker answers:
    it accepts connections before it has loaded its snapshot)."""
    consumer = Consumer({"bootstrap.servers": servers, "group.id": "persistence-bench"})
    try:
        while True:
            try:
                return sum(
                    consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)[1]
                    for p in range(PARTITIONS)
                )
            except KafkaException as err:
                print(f"  broker not answering yet: {err}", flush=True)
    finally:
        consumer.close()


def snapshot(data_dir: Path) -> tuple[float, int] | None:
    """(mtime, size) of the broker's snapshot file, None before the first save."""
    try:
        stat = (data_dir / "kafka.json").stat()
    except OSError:
        return None
    return stat.st_mtime, stat.st_size


def watch_saves(data_dir: Path, seconds: float) -> None:
    """Print every save that lands within ``seconds``."""
    last, deadline = snapshot(data_dir), time.monotonic() + seconds
    previous_at: float | None = None
    while time.monotonic() < deadline:
        now = snapshot(data_dir)
        if now is not None and now != last:
            gap = "" if previous_at is None else f", {now[0] - previous_at:.1f} s after the previous one"
            print(f"  save: {now[1] / 1e9:.2f} GB snapshot{gap}", flush=True)
            previous_at, last = now[0], now
        time.sleep(0.1)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=int, default=1000, help="megabytes of values to publish")
    parser.add_argument("--value-bytes", type=int, default=1000)
    parser.add_argument("--watch-s", type=float, default=30.0, help="how long to watch saves")
    parser.add_argument("--end", choices=("clean", "kill"), default="clean")
    parser.add_argument("--burst", type=int, default=10_000, help="records published just before a kill")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    with tempfile.TemporaryDirectory(prefix="broker-persistence-") as tmp:
        state, port = Path(tmp), free_port()
        servers = f"127.0.0.1:{port}"
        data_dir = state / "kafka"
        spec = ServiceSpec("kafka", noida_argv("127.0.0.1", port, data_dir), "127.0.0.1", port)
        services = ServiceManager(state)
        services.start(spec)
        try:
            admin = AdminClient({"bootstrap.servers": servers})
            admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result()
            records = args.mb * 1_000_000 // args.value_bytes
            began = time.monotonic()
            acked = publish(servers, records, b"v" * args.value_bytes)
            pid = services.status("kafka").pid or 0
            print(
                f"published {acked:,} of {records:,} records ({args.mb} MB of values) acknowledged "
                f"in {time.monotonic() - began:.0f} s; broker RSS {rss_mb(pid):,.0f} MB",
                flush=True,
            )
            watch_saves(data_dir, args.watch_s)
            if args.end == "kill":
                acked += publish(servers, args.burst, b"v" * args.value_bytes)
                before = snapshot(data_dir)
                os.killpg(pid, signal.SIGKILL)
                age = "none" if before is None else f"{time.time() - before[0]:.1f} s old"
                print(f"SIGKILL {args.burst:,} records after the watch; last snapshot {age}", flush=True)
                services.stop("kafka")
            else:
                began = time.monotonic()
                services.stop("kafka")
                print(
                    f"clean stop (SIGTERM, waited for exit) took {time.monotonic() - began:.1f} s", flush=True
                )
            began = time.monotonic()
            services.start(spec, timeout=3600)
            found = stored(servers)
            print(f"restart took {time.monotonic() - began:.1f} s (until it answered)", flush=True)
            print(
                f"acknowledged {acked:,}, found after restart {found:,}, lost {acked - found:,}", flush=True
            )
        finally:
            services.stop("kafka")


if __name__ == "__main__":
    main()
