"""Rows/s into ClickHouse through the sink, by table and batch size (printed, never asserted).

    python -m bench.sink_throughput [--records N] [--cpu-only]

Starts a private platform (free ports, temporary state). For each record type and batch
size: publish N records on a private topic, start the sink from the beginning into a fresh
database, and time until every row is in. The whole path is measured: consume, decode
(Avro + validation), map, columnar insert over HTTP into the embedded chDB endpoint, commit.
Sink, broker and ClickHouse share this machine's cores.

Before the runs, the conflicting-duplicate check the sink makes per record
(:class:`~gpulens.consumers.clickhouse.duplicates.DuplicateGuard`) is timed alone on the same records:
first sight (each id new) and a resend (each id known, same content), beside the decode of the
same records for scale, with the memory it holds per remembered id.

Then GPU samples per CPU-second, the same records three ways in the same run: the sink with
ClickHouse decoding the batches (``FORMAT AvroConfluent``), the sink decoding them in Python,
and a bare client inserting the same rows, already decoded, into chDB in its own process (the
floor); and device changes per CPU-second (those of a cluster's start, every device added),
ClickHouse decoding them and Python decoding them. CPU is user + system seconds from /proc, of
this process (the sink thread) and of the ClickHouse holder, over the time from the sink's
start until every row is in.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import threading
import time
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast

from clickhouse_connect.driver.exceptions import DatabaseError
from confluent_kafka import Producer

from bench.e2e_probes import usage
from gpulens.config import GPULensSettings
from gpulens.consumers.clickhouse.client import get_client
from gpulens.consumers.clickhouse.duplicates import DuplicateGuard
from gpulens.consumers.clickhouse.migrating import migrate
from gpulens.consumers.clickhouse.rows import DECODED_BY_CLICKHOUSE, rows_of
from gpulens.consumers.clickhouse.rows import GPU_SAMPLES as SAMPLES_TABLE
from gpulens.consumers.clickhouse.settings import ClickHouseSettings, SinkSettings
from gpulens.consumers.clickhouse.sinking import run_sink
from gpulens.pipeline.device_changes import diff
from gpulens.platform import CLICKHOUSE, manager, private_platform
from gpulens.producers.simulate.simulating import ClusterSimulation
from gpulens.producers.simulate.specs import SimulationSpec
from gpulens.schemas.kafka.consuming import Decoded
from gpulens.schemas.kafka.topic_admin import create_topics
from gpulens.schemas.model.models import DeviceInventory, Event
from gpulens.schemas.model.topics import DEVICE_CHANGELOG, GPU_SAMPLES, NODES, PODS, TopicSpec, record_key
from gpulens.schemas.wire.codec import AvroCodec, registry_client
from gpulens.testing.examples import example_events

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


@dataclasses.dataclass(frozen=True)
class Run:
    """One sink run: wall time, rows per table, CPU seconds of the sink and of the holder over
    the whole run, and once started (from the first rows in: no imports, migrations, connects)."""

    elapsed_s: float
    tables: dict[str, int]
    sink_cpu_s: float
    holder_cpu_s: float
    steady_rows: int
    steady_sink_cpu_s: float
    steady_holder_cpu_s: float


def _cpu_s(pid: int) -> float:
    measured = usage([pid])
    assert measured is not None, f"process {pid} is gone"
    return measured.cpu_s


def bench(
    settings: GPULensSettings,
    codec: AvroCodec,
    spec: TopicSpec,
    records: list[Event],
    sink: SinkSettings,
    run: int,
) -> Run:
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
    holder = manager(settings).status(CLICKHOUSE).pid
    assert holder is not None, "the ClickHouse holder is not running"
    registry_url = settings.registry.url if sink.decode_in_clickhouse else None
    thread = threading.Thread(
        target=run_sink,
        args=(settings.kafka, codec, clickhouse, sink, stop),
        kwargs={"topics": [topic], "group_id": f"bench-{run}", "registry_url": registry_url},
    )
    cpu_before = (_cpu_s(os.getpid()), _cpu_s(holder))
    started = time.perf_counter()
    thread.start()
    last = list(tables)[-1]  # a history or time-series table: one row per event, never collapsed
    steady_from: tuple[int, float, float] | None = None
    while True:
        try:
            # a single UInt64 value: clickhouse-connect returns it as an int
            count = cast(int, client.command(f"SELECT count() FROM bench_{run}.{last}"))
        except DatabaseError:  # the database does not exist until the sink migrated it
            count = 0
        if count >= tables[last]:
            break
        if count and steady_from is None:  # started: migrated, imported, first batch in
            steady_from = (count, _cpu_s(os.getpid()), _cpu_s(holder))
        time.sleep(0.25)
    elapsed = time.perf_counter() - started
    now = (_cpu_s(os.getpid()), _cpu_s(holder))
    stop.set()
    thread.join()
    start_rows, *at_start = steady_from or (0, *cpu_before)
    return Run(
        elapsed,
        tables,
        now[0] - cpu_before[0],
        now[1] - cpu_before[1],
        tables[last] - start_rows,
        now[0] - at_start[0],
        now[1] - at_start[1],
    )


def rate_line(spec: TopicSpec, records: list[Event], sink: SinkSettings, run: Run) -> str:
    rows = sum(run.tables.values())
    names = " + ".join(f"{name} ({count:,})" for name, count in run.tables.items())
    native = sink.decode_in_clickhouse and spec.record in DECODED_BY_CLICKHOUSE
    how = "ClickHouse decodes" if native else "Python decodes"
    return (
        f"{spec.record.__name__:<15} batch {sink.batch_rows:>7,} rows  {how:<18} {names:<48} "
        f"{rows / run.elapsed_s:>10,.0f} rows/s  {len(records) / run.elapsed_s:>8,.0f} records/s"
    )


def bare_insert(records: list[Event], batch_rows: int) -> tuple[int, float]:
    """GPU sample rows inserted into gpu_samples by a bare in-process chDB client, already
    decoded and mapped (not timed): the rows and the CPU seconds of this process for the inserts."""
    rows = [row for r in records for _, row in rows_of(Decoded(GPU_SAMPLES.name, 0, 0, None, r))]
    with tempfile.TemporaryDirectory() as directory:
        clickhouse = ClickHouseSettings(url=f"chdb://{directory}/chdb", database="bare")
        for _line in migrate(clickhouse, samples_ttl_days=30):
            pass
        client = get_client(clickhouse, database="bare")
        started = _cpu_s(os.getpid())
        for at in range(0, len(rows), batch_rows):
            columns = list(zip(*rows[at : at + batch_rows], strict=True))
            client.insert(
                SAMPLES_TABLE.name, columns, column_names=SAMPLES_TABLE.columns, column_oriented=True
            )
        cpu = _cpu_s(os.getpid()) - started
        assert client.command("SELECT count() FROM gpu_samples") == len(rows)
        client.close()
    return len(rows), cpu


def cpu_lines(
    settings: GPULensSettings,
    codec: AvroCodec,
    spec: TopicSpec,
    records: list[Event],
    batch_rows: int,
    first_run: int,
) -> list[str]:
    """Rows per CPU-second of ``records``, ClickHouse decoding them and Python decoding them."""
    what = "samples" if spec is GPU_SAMPLES else "rows"
    lines = []
    for run, native in enumerate((True, False), start=first_run):
        sink = SinkSettings(batch_rows=batch_rows, batch_seconds=0.5, decode_in_clickhouse=native)
        result = bench(settings, codec, spec, records, sink, run)
        rows = sum(result.tables.values())
        cpu = result.sink_cpu_s + result.holder_cpu_s
        steady = result.steady_sink_cpu_s + result.steady_holder_cpu_s
        lines.append(
            f"{spec.record.__name__}, {'ClickHouse' if native else 'Python':<10} decodes: {rows:,} {what} in "
            f"{result.elapsed_s:.2f} s, CPU sink {result.sink_cpu_s:.2f} s + holder "
            f"{result.holder_cpu_s:.2f} s = {cpu:.2f} s"
            f" -> {rows / cpu:>9,.0f} {what}/CPU-s (sink + holder); once started: "
            f"{result.steady_rows:,} {what}, sink {result.steady_sink_cpu_s:.2f} s + holder "
            f"{result.steady_holder_cpu_s:.2f} s -> {result.steady_rows / steady:>9,.0f} {what}/CPU-s"
        )
    return lines


def bare_line(records: list[Event], batch_rows: int) -> str:
    samples, cpu = bare_insert(records, batch_rows)
    return (
        f"bare in-process chDB insert of the decoded rows: {samples:,} samples, CPU {cpu:.2f} s "
        f"-> {samples / cpu:>9,.0f} samples/CPU-s"
    )


def device_changes(count: int) -> list[Event]:
    """``count`` device changes as a cluster's start brings them (every GPU and RDMA port of
    each node added), derived by the worker's own diff from simulated inventories."""
    spec = SimulationSpec(
        nodes=count // 16 + 1, gpus_per_node=8, interval_s=2, start=datetime.now(UTC), duration_s=1
    )
    inventories = [item for _, item in ClusterSimulation(spec).events() if isinstance(item, DeviceInventory)]
    changes: list[Event] = [change for inventory in inventories for change in diff(None, inventory)]
    return changes[:count]


def guard_cost(codec: AvroCodec, spec: TopicSpec, records: list[Event]) -> str:
    """Per-record time of the duplicate check on first sight and on a resend, and bytes per id."""
    pairs = [(record, codec.encode(spec, record)) for record in records]
    tracemalloc.start()
    remembered = DuplicateGuard(horizon=2 * len(records))  # every id stays remembered
    before = tracemalloc.get_traced_memory()[0]
    for record, value in pairs:
        remembered.conflict(record, value)
    held = tracemalloc.get_traced_memory()[0] - before  # by hash: the ids die with the records
    tracemalloc.stop()
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
        f"{held / len(records):.0f} bytes per remembered id"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000, help="records per run")
    parser.add_argument("--cpu-only", action="store_true", help="only the samples per CPU-second")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory, private_platform(Path(directory)) as settings:
        codec = AvroCodec(registry_client(settings.registry.url))
        run = 0
        if not args.cpu_only:
            for spec in (GPU_SAMPLES, PODS, NODES):
                print(guard_cost(codec, spec, _records(spec, args.records)), flush=True)
            for spec in (GPU_SAMPLES, PODS, NODES):
                records = _records(spec, args.records)
                for batch_rows in (10_000, 100_000):
                    for native in (True, False) if spec is GPU_SAMPLES else (True,):
                        run += 1
                        sink = SinkSettings(
                            batch_rows=batch_rows, batch_seconds=0.5, decode_in_clickhouse=native
                        )
                        result = bench(settings, codec, spec, records, sink, run)
                        print(rate_line(spec, records, sink, result), flush=True)
        samples = _records(GPU_SAMPLES, args.records)
        for line in cpu_lines(settings, codec, GPU_SAMPLES, samples, 100_000, run + 1):
            print(line, flush=True)
        print(bare_line(samples, 100_000), flush=True)
        changes = device_changes(args.records)
        for line in cpu_lines(settings, codec, DEVICE_CHANGELOG, changes, 100_000, run + 3):
            print(line, flush=True)


if __name__ == "__main__":
    main()
