"""Rows/s into ClickHouse through the sink, by table and batch size (printed, never asserted).

    python -m bench.sink_throughput [--records N]

Starts a private platform (free ports, temporary state). For each record type and batch
size: publish N records on a private topic, start the sink from the beginning into a fresh
database, and time until every row is in. The whole path is measured: consume, decode
(Avro + validation), map, columnar insert over HTTP into the embedded chDB endpoint, commit.
Sink, broker and ClickHouse share this machine's cores.

Before the runs, the conflicting-duplicate check the sink makes per record
(:class:`~consumers.clickhouse.duplicates.DuplicateGuard`) is timed alone on the same records:
first sight (each id new) and a resend (each id known, same content), beside the decode of the
same records for scale, with the memory it holds per remembered id.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import threading
import time
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path

from clickhouse_connect.driver.exceptions import DatabaseError
from confluent_kafka import Producer

from consumers.clickhouse.client import get_client
from consumers.clickhouse.duplicates import DuplicateGuard
from consumers.clickhouse.rows import rows_of
from consumers.clickhouse.settings import SinkSettings
from consumers.clickhouse.sinking import run_sink
from gpulens.platform import private_platform
from schemas.codec import AvroCodec, registry_client
from schemas.consuming import Decoded
from schemas.examples import example_events
from schemas.models import Event
from schemas.topic_admin import create_topics
from schemas.topics import GPU_SAMPLES, NODES, PODS, TopicSpec, record_key

GPUS = 8


def _records(spec: TopicSpec, count: int) -> list[Event]:
    event = example_events("bench")[spec]
    start = datetime.now(UTC) - timedelta(hours=1)
    update: dict[str, object] = {}
    if spec is GPU_SAMPLES:
        sample = event.samples[0]  # type: ignore[attr-defined]
        update["samples"] = [
            sample.model_copy(update={"device_id": f"gpu-{i}", "index": i}) for i in range(GPUS)
        ]
    key = {NODES: "node", PODS: "uid", GPU_SAMPLES: "node"}[spec]
    return [
        event.model_copy(
            update={
                **update,
                "event_id": f"e{n}",
                "event_time": start + timedelta(milliseconds=n),
                key: f"{key}-{n % 2000}",
            }
        )
        for n in range(count)
    ]


def bench(
    settings, codec: AvroCodec, spec: TopicSpec, records: list[Event], batch_rows: int, run: int
) -> str:
    topic = dataclasses.replace(spec, name=f"bench.{spec.name}.{run}")
    create_topics(settings.kafka, [topic])
    producer = Producer(
        settings.kafka.librdkafka(**{"linger.ms": 20, "queue.buffering.max.messages": 1_000_000})
    )
    for record in records:
        producer.produce(topic.name, key=record_key(topic, record), value=codec.encode(topic, record))
        producer.poll(0)
    producer.flush(120)
    tables = {table.name: 0 for table, _ in rows_of(Decoded(topic.name, 0, 0, None, records[0]))}
    for table, _ in (pair for r in records for pair in rows_of(Decoded(topic.name, 0, 0, None, r))):
        tables[table.name] += 1
    clickhouse = settings.clickhouse.model_copy(update={"database": f"bench_{run}"})
    client = get_client(settings.clickhouse)
    stop = threading.Event()
    sink = SinkSettings(batch_rows=batch_rows, batch_seconds=0.5)
    thread = threading.Thread(
        target=run_sink,
        args=(settings.kafka, codec, clickhouse, sink, stop),
        kwargs={"topics": [topic], "group_id": f"bench-{run}"},
    )
    started = time.perf_counter()
    thread.start()
    last = list(tables)[-1]  # a history or time-series table: one row per event, never collapsed
    while True:
        try:
            if client.command(f"SELECT count() FROM bench_{run}.{last}") >= tables[last]:
                break
        except DatabaseError:  # the database does not exist until the sink migrated it
            pass
        time.sleep(0.05)
    elapsed = time.perf_counter() - started
    stop.set()
    thread.join()
    rows = sum(tables.values())
    names = " + ".join(f"{name} ({count:,})" for name, count in tables.items())
    return (
        f"{spec.record.__name__:<15} batch {batch_rows:>7,} rows  {names:<48} "
        f"{rows / elapsed:>10,.0f} rows/s  {len(records) / elapsed:>8,.0f} records/s"
    )


def guard_cost(codec: AvroCodec, spec: TopicSpec, records: list[Event]) -> str:
    """Per-record time of the duplicate check on first sight and on a resend, and bytes per id."""
    pairs = [(record, codec.encode(spec, record)) for record in records]
    tracemalloc.start()
    remembered = DuplicateGuard(horizon=2 * len(records))  # every id stays remembered
    before = tracemalloc.get_traced_memory()[0]
    for record, value in pairs:
        remembered.conflict(record, value)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    held += sum(sys.getsizeof(record.event_id) for record in records)  # the sink's records die, the ids stay
    guard = DuplicateGuard(horizon=2 * len(records))
    started = time.perf_counter()
    for record, value in pairs:
        guard.conflict(record, value)
    first = time.perf_counter() - started
    started = time.perf_counter()
    conflicts = sum(guard.conflict(record, value) is not None for record, value in pairs)
    again = time.perf_counter() - started
    assert conflicts == 0
    started = time.perf_counter()
    for _record, value in pairs:
        codec.decode(spec, value)
    decode = time.perf_counter() - started
    per = 1e6 / len(records)
    return (
        f"{spec.record.__name__:<15} duplicate check: {first * per:.2f} µs/record first seen, "
        f"{again * per:.2f} µs/record resent (decoding it: {decode * per:.2f} µs), "
        f"{held / len(records):.0f} bytes per remembered id (its event_id included)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000, help="records per run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory, private_platform(Path(directory)) as settings:
        codec = AvroCodec(registry_client(settings.registry.url))
        run = 0
        for spec in (GPU_SAMPLES, PODS, NODES):
            print(guard_cost(codec, spec, _records(spec, args.records)), flush=True)
        for spec in (GPU_SAMPLES, PODS, NODES):
            records = _records(spec, args.records)
            for batch_rows in (10_000, 100_000):
                run += 1
                print(bench(settings, codec, spec, records, batch_rows, run), flush=True)


if __name__ == "__main__":
    main()
