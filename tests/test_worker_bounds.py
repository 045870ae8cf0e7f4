"""No record's event time can stop the worker (issue 13): bounds, long gaps, SIGTERM.

- A far-future PodEvent (2090: within the models' range, far ahead of the wall clock and its
  cluster) goes to the DLQ as ``event-time-out-of-bounds``, a 1970 one as ``invalid-record``
  (outside the models' range); the worker stays up, and the replayed cluster they claim to
  belong to gets exactly the rows computed from the CSV (the head of the trace: its 3,585 hours).
- A cluster whose data resumes a day later gets every window's rows, once, and the worker's
  peak RSS grows by far less than those rows would take as objects.
- SIGTERM in the middle of such a gap ends the worker within seconds; a restart gives the
  rows an uninterrupted run gives, each once.

The expected gap rows are plain arithmetic on what the test published, not the aggregator.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from allocation_oracle import expected_rows
from confluent_kafka import Consumer, Producer, TopicPartition
from module_platform_fixtures import module_platform_fixtures
from prometheus_client.parser import text_string_to_metric_families
from trace_slices import head_of

from gpulens.config import GPULensSettings
from gpulens.platform import free_port
from gpulens.producers.replay.locating import traces_dir
from gpulens.schemas.kafka.sharding import Shard
from gpulens.schemas.model.ids import event_id
from gpulens.schemas.model.models import (
    ChangeType,
    ClusterGpuAllocation,
    DeadLetter,
    NodeGpuAllocation,
    Record,
    Watermark,
)
from gpulens.schemas.model.topics import (
    CLUSTER_ALLOCATION,
    DLQ,
    NODE_ALLOCATION,
    NODES,
    PODS,
    WATERMARKS,
    TopicSpec,
    entity_key,
)
from gpulens.schemas.wire.codec import AvroCodec
from gpulens.testing.examples import example_events

PODS_CSV = traces_dir() / "alibaba-gpu-v2023" / "openb_pod_list_default.csv"
EPOCH = datetime(2023, 1, 1, tzinfo=UTC)
WINDOW_S = 30
GAP_START = datetime(2024, 3, 1, tzinfo=UTC)
"""Inside the span of the public traces: far behind the wall clock, and in bounds."""


platform, config_file = module_platform_fixtures()


def gpulens(config: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "gpulens", "--config", str(config), *args]


def start(command: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log.open("ab") as stderr:
        return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, env=env)


def start_worker(config: Path, group: str, *options: str) -> subprocess.Popen[bytes]:
    command = gpulens(config, "worker", "--group", group, "--source-timeout", "1", *options)
    return start(command, config.parent / f"worker-{group}.log")


class TopicReader:
    """Committed records of some topics, decoded, kept when ``keep`` says so."""

    def __init__(self, platform: GPULensSettings, codec: AvroCodec, specs: list[TopicSpec], keep) -> None:
        self._consumer = Consumer(
            platform.kafka.librdkafka(**{"group.id": "bounds-reader", "isolation.level": "read_committed"})
        )
        self._consumer.assign([TopicPartition(s.name, p, 0) for s in specs for p in range(s.partitions)])
        self._specs = {s.name: s for s in specs}
        self._codec, self._keep = codec, keep
        self.records: list[Record] = []

    def read_until(self, done, deadline_s: float) -> list[Record]:
        """Read until ``done(records)`` or the deadline; then what was read."""
        deadline = time.monotonic() + deadline_s
        while not done(self.records) and time.monotonic() < deadline:
            for message in self._consumer.consume(10_000, 0.5):
                if message.error() is None:
                    record = self._codec.decode(self._specs[message.topic()], message.value())
                    if self._keep(record):
                        self.records.append(record)
        return self.records

    def close(self) -> None:
        self._consumer.close()


def publish(
    platform: GPULensSettings, codec: AvroCodec, records: list[tuple[TopicSpec, bytes, Record | bytes]]
) -> None:
    """``records`` on their topics, each encoded (bytes: as they are)."""
    producer = Producer(platform.kafka.librdkafka(**{"linger.ms": 20}))
    for spec, key, record in records:
        value = record if isinstance(record, bytes) else codec.encode(spec, record)
        while True:
            try:
                producer.produce(spec.name, key=key, value=value)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(60) == 0


# --- bounds ------------------------------------------------------------------------------------


@pytest.mark.parametrize("hold", ["10000", "0"], ids=["decoded-when-fetched", "held-as-bytes"])
def test_far_future_1970_and_cut_records_go_to_the_dlq_and_the_cluster_keeps_its_rows(
    platform, codec, config_file, unique, spawned, tmp_path, hold
) -> None:
    """``--hold-decoded 0``: every record is held as its bytes, placed by its head alone, so the
    cut record (its head whole) is refused when released instead of when fetched."""
    cluster, group = f"bounds-{unique}", f"g-{unique}"
    pod = example_events(cluster, source="rogue", at=EPOCH + timedelta(hours=1))[PODS]
    rogue = [
        pod.model_copy(update={"event_id": f"{name}-{unique}", "event_time": at})
        for name, at in (
            ("future", datetime(2090, 1, 1, tzinfo=UTC)),
            ("past", datetime(1970, 1, 1, tzinfo=UTC)),
        )
    ]
    key = entity_key(cluster, pod.uid)
    publish(platform, codec, [(PODS, key, r) for r in rogue])
    cut = codec.encode(PODS, pod.model_copy(update={"event_id": f"cut-{unique}"}))[:-3]
    publish(platform, codec, [(PODS, key, cut)])
    rows = TopicReader(platform, codec, [CLUSTER_ALLOCATION], lambda r: r.cluster == cluster)
    letters = TopicReader(platform, codec, [DLQ], lambda r: r.consumer == group)
    options = ("--window", "3600", "--no-nodes", "--processors", "allocation", "--hold-decoded", hold)
    worker = start_worker(config_file, group, *options)
    spawned.append(worker)
    pods = head_of(PODS_CSV, 1_000, tmp_path / "pods.csv")
    replaying = gpulens(config_file, "replay", "alibaba-v2023", "--pods", str(pods))
    env = {**os.environ, "GPULENS_CLUSTER": cluster}
    spawned.append(start(replaying, config_file.parent / f"replay-{cluster}.log", env))
    expected = expected_rows(pods, 3600)
    try:
        got = rows.read_until(lambda r: len(r) >= len(expected), 180)
        got = rows.read_until(lambda r: len(r) > len(expected), 2)  # a further row would be wrong
        dead = letters.read_until(lambda r: len(r) >= 3, 60)
    finally:
        rows.close()
        letters.close()
    assert worker.poll() is None, "the worker is still up"
    assert all(isinstance(r, ClusterGpuAllocation) for r in got)
    assert len({r.event_id for r in got}) == len(got)
    assert [int((r.window_start - EPOCH).total_seconds()) for r in got] == [e.window_start for e in expected]
    assert [r.gpus_allocated_avg for r in got] == pytest.approx(
        [e.gpus_allocated_avg for e in expected], abs=1e-6
    )
    assert [r.gpus_allocated_end for r in got] == pytest.approx(
        [e.gpus_allocated_end for e in expected], abs=1e-6
    )
    assert [r.pods_running_end for r in got] == [e.pods_running_end for e in expected]
    assert all(isinstance(d, DeadLetter) for d in dead)
    reasons = {d.reason: d.detail for d in dead}
    assert sorted(reasons) == ["avro-decode-error", "event-time-out-of-bounds", "invalid-record"]
    assert all(d.source_topic == PODS.name for d in dead)
    assert "2090-01-01" in reasons["event-time-out-of-bounds"], "ahead of the wall clock and the cluster"
    assert "event_time" in reasons["invalid-record"], "1970 is outside the models' range"


# --- a day's gap ---------------------------------------------------------------------------------


def gap_records(cluster: str, nodes: int, gap: timedelta) -> list[tuple[TopicSpec, bytes, Record]]:
    """``nodes`` nodes of 8 GPUs, each full with one pod from GAP_START; after ``gap`` the pod of
    node 0 is deleted, then the source's final watermark."""
    base = example_events(cluster, source="gap", at=GAP_START)
    out: list[tuple[TopicSpec, bytes, Record]] = []
    for n in range(nodes):
        node = base[NODES].model_copy(update={"event_id": f"{cluster}-n{n}", "node": f"n{n:04d}"})
        out.append((NODES, entity_key(cluster, node.node), node))
    for n in range(nodes):
        pod = base[PODS].model_copy(
            update={"event_id": f"{cluster}-p{n}", "uid": f"p{n}", "node": f"n{n:04d}"}
        )
        out.append((PODS, entity_key(cluster, pod.uid), pod))
    end = GAP_START + gap
    gone = base[PODS].model_copy(
        update={"event_id": f"{cluster}-gone", "uid": "p0", "node": "n0000", "type": ChangeType.DELETED,
                "phase": "Succeeded", "event_time": end}
    )  # fmt: skip
    out.append((PODS, entity_key(cluster, "p0"), gone))
    final = Watermark(
        event_id=event_id(cluster, "gap", "final"), cluster=cluster, event_time=end, source="gap", final=True
    )
    out.append((WATERMARKS, cluster.encode(), final))
    return out


def expected_gap_rows(nodes: int, gap: timedelta) -> tuple[dict[datetime, float], set[tuple[str, datetime]]]:
    """Cluster avg per window start, and the (node, window start) of every node row."""
    last = GAP_START + gap  # the deletion: inside the last window, which the final watermark closes
    last_start = GAP_START + timedelta(seconds=(gap.total_seconds() // WINDOW_S) * WINDOW_S)
    starts = [
        GAP_START + timedelta(seconds=WINDOW_S * k) for k in range(int(gap.total_seconds() // WINDOW_S) + 1)
    ]
    assert starts[-1] == last_start
    held_before = (last - last_start).total_seconds() / WINDOW_S
    cluster = {s: 8.0 * nodes for s in starts[:-1]} | {last_start: 8.0 * (nodes - 1) + 8.0 * held_before}
    node_rows = {(f"n{n:04d}", s) for n in range(nodes) for s in starts}
    return cluster, node_rows


def gap_readers(platform, codec, cluster: str) -> tuple[TopicReader, TopicReader]:
    return (
        TopicReader(platform, codec, [CLUSTER_ALLOCATION], lambda r: r.cluster == cluster),
        TopicReader(platform, codec, [NODE_ALLOCATION], lambda r: r.cluster == cluster),
    )


def assert_gap_rows_once(cluster_rows: list, node_rows: list, nodes: int, gap: timedelta) -> None:
    expected_cluster, expected_nodes = expected_gap_rows(nodes, gap)
    assert len({r.event_id for r in cluster_rows}) == len(cluster_rows), "a cluster window came twice"
    assert len({r.event_id for r in node_rows}) == len(node_rows), "a node window came twice"
    assert {r.window_start: r.gpus_allocated_avg for r in cluster_rows} == pytest.approx(expected_cluster)
    assert {(r.node, r.window_start) for r in node_rows} == expected_nodes
    assert all(isinstance(r, NodeGpuAllocation) for r in node_rows)


def vm_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


def wait_for(condition, deadline_s: float, what: str) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {deadline_s} s"
        time.sleep(0.2)


def caught_up(port: int, deadline_s: float) -> None:
    """The worker's committed offsets reached the ends of its inputs (what earlier tests left)."""

    def lag_is_zero() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                text = response.read().decode()
        except OSError:
            return False
        lags = [
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "gpulens_consumer_lag_records"
        ]
        return bool(lags) and sum(lags) == 0

    wait_for(lag_is_zero, deadline_s, "the worker caught up")


def start_gap_worker(config: Path, group: str, cluster: str, *options: str) -> subprocess.Popen[bytes]:
    """A worker with 30 s windows and node rows that keeps only ``cluster``: the clusters earlier
    tests left on the topics (months of replays) would be millions of such rows."""
    shard = next(Shard(i, 1000) for i in range(1000) if Shard(i, 1000).owns_cluster(cluster.encode()))
    return start_worker(
        config, group, "--window", str(WINDOW_S), "--processors", "allocation", "--no-overview",
        "--shard", str(shard), *options,
    )  # fmt: skip


def test_a_day_long_gap_gives_every_window_once_in_bounded_memory(
    platform, codec, config_file, unique, spawned
) -> None:
    cluster, group, nodes, gap = f"gap-{unique}", f"g-{unique}", 30, timedelta(days=1, seconds=10)
    port = free_port()
    worker = start_gap_worker(config_file, group, cluster, "--metrics-port", str(port))
    spawned.append(worker)
    caught_up(port, 120)
    Path(f"/proc/{worker.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS: the peak from now on
    baseline = vm_kb(worker.pid, "VmHWM")
    clusters, node_reader = gap_readers(platform, codec, cluster)
    publish(platform, codec, gap_records(cluster, nodes, gap))
    expected_cluster, expected_nodes = expected_gap_rows(nodes, gap)
    try:
        cluster_rows = clusters.read_until(lambda r: len(r) >= len(expected_cluster), 120)
        node_rows = node_reader.read_until(lambda r: len(r) >= len(expected_nodes), 120)
        peak = vm_kb(worker.pid, "VmHWM")
        node_rows = node_reader.read_until(lambda r: len(r) > len(expected_nodes), 2)
    finally:
        clusters.close()
        node_reader.close()
    assert_gap_rows_once(cluster_rows, node_rows, nodes, gap)
    grown_mb = (peak - baseline) / 1024
    print(
        f"{len(node_rows) + len(cluster_rows)} rows; "
        f"worker VmHWM {baseline / 1024:.0f} -> {peak / 1024:.0f} MB"
    )
    # As objects, these rows alone would take ~1 KB each (90 MB here): the worker holds one window's.
    assert grown_mb < 80, f"peak RSS grew by {grown_mb:.0f} MB"


def test_sigterm_mid_gap_stops_the_worker_within_seconds_and_a_restart_gives_every_window_once(
    platform, codec, config_file, unique, spawned
) -> None:
    cluster, group, nodes, gap = f"term-{unique}", f"g-{unique}", 10, timedelta(days=2, seconds=10)
    clusters, node_reader = gap_readers(platform, codec, cluster)
    publish(platform, codec, gap_records(cluster, nodes, gap))
    expected_cluster, expected_nodes = expected_gap_rows(nodes, gap)
    first = start_gap_worker(config_file, group, cluster)
    spawned.append(first)
    try:
        node_reader.read_until(lambda r: len(r) >= 10_000, 120)  # committed mid-gap: it is in the gap
        asked = time.monotonic()
        first.send_signal(signal.SIGTERM)
        first.wait(30)
        took = time.monotonic() - asked
        print(f"SIGTERM mid-gap: exited with {first.returncode} after {took:.2f} s")
        assert first.returncode == 0
        assert took < 5, f"the worker took {took:.1f} s to stop"
        before = len(node_reader.read_until(lambda _r: False, 1))
        assert before < len(expected_nodes), "the first worker was stopped in the middle of the gap"
        spawned.append(start_gap_worker(config_file, group, cluster))
        cluster_rows = clusters.read_until(lambda r: len(r) >= len(expected_cluster), 180)
        node_rows = node_reader.read_until(lambda r: len(r) >= len(expected_nodes), 180)
        cluster_rows = clusters.read_until(lambda r: len(r) > len(expected_cluster), 2)
    finally:
        clusters.close()
        node_reader.close()
    assert_gap_rows_once(cluster_rows, node_rows, nodes, gap)
