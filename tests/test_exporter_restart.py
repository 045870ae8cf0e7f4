"""An exporter starts from its state, not from history: killed with SIGKILL and restarted, it
shows what an exporter that never stopped shows, reads only what came after its checkpoint
(and the tail of the samples), and answers scrapes while it catches up.

The exporters run in the per-GPU mode, so that every kind of series it can hold is checked
(each node's newest sample batch from gpulens.state.gpu-samples.v1). The expected series are
the newest rows computed here from what the test published.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from test_exporter import (
    Samples,
    alert,
    cluster_row,
    gpu_series,
    node_row,
    of_cluster,
    parse,
    publish,
    sample_batch,
    scrape,
    series,
    workload_row,
    workload_series,
)
from test_state_log import committed_records

from gpulens.consumers.prometheus import PER_GPU_TOPICS, Exporter, ExporterSettings
from gpulens.consumers.prometheus.checkpointing import ExporterCheckpoint, state_log_topic
from gpulens.consumers.prometheus.state import LatestState
from gpulens.platform import free_port
from gpulens.schemas.kafka.state_log import SNAPSHOT_MARKER, StateLog
from gpulens.schemas.kafka.topic_admin import create_topics, topic_partitions
from gpulens.schemas.model.models import Alert, AlertState, Record
from gpulens.schemas.model.topics import (
    ALERTS,
    CLUSTER_ALLOCATION,
    NODE_ALLOCATION,
    STATE_GPU_SAMPLES,
    WORKLOAD_USAGE,
    TopicSpec,
)

NODES = [f"n{i}" for i in range(12)]
WORKLOAD_ROUNDS = 10
MAX_AGE_WINDOWS = 2

Published = list[tuple[TopicSpec, Record]]


# --- what is published, and what it must show --------------------------------------------------


def round_of(cluster: str, r: int) -> Published:
    """Round ``r``: every series moves. Workload ``w`` runs for three times WORKLOAD_ROUNDS from
    round ``w * WORKLOAD_ROUNDS`` on (so some end while others start),
    each node's GPU samples change, and the alert of entity ``e`` opens or resolves by turns."""
    rows: Published = [
        (CLUSTER_ALLOCATION, cluster_row(cluster, r, capacity=96, allocated=r % 96, pending=r % 5))
    ]
    rows += [
        (NODE_ALLOCATION, node_row(cluster, n, r, rate=((r + i) % 8) / 8)) for i, n in enumerate(NODES[:4])
    ]
    rows += [
        (WORKLOAD_USAGE, workload_row(cluster, f"w{w}", r, usage=float(r + w), gpus=float(w % 8 + 1)))
        for w in range(r // WORKLOAD_ROUNDS, r // WORKLOAD_ROUNDS + 3)
    ]
    rows += [
        (STATE_GPU_SAMPLES, sample_batch(cluster, n, r, (float((r + i) % 100), float((r * i) % 100))))
        for i, n in enumerate(NODES)
    ]
    if r % 3 == 0:
        entity = f"gpu-{r % 5}"
        state = AlertState.OPENED if (r // 3) % 2 == 0 else AlertState.RESOLVED
        rows.append((ALERTS, alert(cluster, "GpuIdle", entity, state, r)))
    return rows


def rounds(cluster: str, first: int, end: int) -> Published:
    return [row for r in range(first, end) for row in round_of(cluster, r)]


def expected(cluster: str, published: Published) -> Samples:
    """The newest row of every series, from the published rows in order (independent of the
    exporter's code): newest window / sample time wins, ended workloads are gone, an alert is
    open while its entity's last event opened it."""
    newest: dict[tuple[object, ...], Record] = {}
    open_alerts: dict[tuple[str, str], bool] = {}
    for _, row in published:
        when = getattr(row, "window_start", None) or row.event_time
        match row:
            case Alert():
                open_alerts[(row.alert, row.entity)] = row.state == AlertState.OPENED
                continue
        key = (type(row).__name__, getattr(row, "node", None), getattr(row, "workload_uid", None))
        old = newest.get(key)
        if old is None or when >= (getattr(old, "window_start", None) or old.event_time):
            newest[key] = row
    out: Samples = {}
    workload_ends = [r.window_end for (kind, *_), r in newest.items() if kind == "WorkloadGpuUsage"]
    for (kind, *_), row in newest.items():
        match kind:
            case "ClusterGpuAllocation":
                out |= dict(
                    [
                        series("gpu_allocation_rate", row.allocation_rate_avg, cluster=cluster),
                        series("cluster_gpu_capacity", row.gpu_capacity, cluster=cluster),
                        series("cluster_gpus_allocated", row.gpus_allocated_end, cluster=cluster),
                        series("cluster_gpu_pods_pending", row.pods_pending_end, cluster=cluster),
                    ]
                )
            case "NodeGpuAllocation":
                out |= dict(
                    [
                        series(
                            "node_k8s_gpu_allocation_rate",
                            row.allocation_rate_avg,
                            cluster=cluster,
                            node=row.node,
                        )
                    ]
                )
            case "WorkloadGpuUsage":
                if (max(workload_ends) - row.window_end) <= MAX_AGE_WINDOWS * (
                    row.window_end - row.window_start
                ):
                    out |= workload_series(
                        cluster, row.workload_uid, usage=row.utilization_avg, gpus=row.gpus_allocated_end
                    )
            case "GpuSampleBatch":
                for s in row.samples:
                    out |= gpu_series(cluster, row.node, s.index, s.utilization_pct)
    names = {name for name, _ in open_alerts}
    for name in names:
        count = sum(is_open for (n, _), is_open in open_alerts.items() if n == name)
        out |= dict([series("gpulens_alerts_open", count, cluster=cluster, alert=name)])
    return out


# --- exporter processes -------------------------------------------------------------------------


@dataclasses.dataclass
class ExporterProcess:
    """`gpulens exporter` on a fixed port, as a process that can be killed and started again."""

    config: Path
    group: str
    log: Path
    env: dict[str, str]
    port: int = dataclasses.field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def start(self, spawned: list[subprocess.Popen[bytes]]) -> float:
        """Start it; the monotonic time of the start."""
        command = [sys.executable, "-m", "gpulens", "--config", str(self.config), "exporter",
                   "--port", str(self.port), "--group", self.group]  # fmt: skip
        started = time.monotonic()
        with self.log.open("ab") as stderr:
            self.process = subprocess.Popen(
                command, stdout=subprocess.DEVNULL, stderr=stderr, env={**os.environ, **self.env}
            )
        spawned.append(self.process)
        return started

    def kill(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def metrics(self) -> Samples:
        """A scrape, empty while nothing answers."""
        assert self.process is not None and self.process.poll() is None, self.log.read_text()
        try:
            return scrape(self.url)
        except OSError:
            return {}

    def wait(self, condition: Callable[[Samples], bool], what: str, timeout: float = 60) -> Samples:
        deadline = time.monotonic() + timeout
        while not condition(samples := self.metrics()):
            if time.monotonic() > deadline:
                pytest.fail(
                    f"{self.group}: timed out waiting for {what}; last scrape: {sorted(samples.items())}"
                )
            time.sleep(0.1)
        return samples


def total(samples: Samples, name: str, topics: set[str] | None = None) -> float:
    """Sum of ``name`` over its series (of ``topics`` only, if given)."""
    return sum(
        v
        for (n, labels), v in samples.items()
        if n == name and (topics is None or dict(labels).get("topic") in topics)
    )


def caught_up(samples: Samples) -> bool:
    """No lag on any topic (a partition resumed at its end and not fetched since counts as read)."""
    lags = [v for (name, _), v in samples.items() if name == "gpulens_consumer_lag_records"]
    return bool(lags) and not any(lags)


def restored(samples: Samples) -> bool:
    return samples.get(("gpulens_exporter_restored", frozenset())) == 1


@pytest.fixture
def exporter_factory(config_file: Path, unique: str) -> Iterator:
    def make(name: str, **settings: object) -> ExporterProcess:
        env = {f"GPULENS_EXPORTER__{k.upper()}": str(v) for k, v in settings.items()}
        env.setdefault("GPULENS_EXPORTER__CHECKPOINT_INTERVAL_S", "0.3")
        env.setdefault("GPULENS_EXPORTER__LAG_INTERVAL_S", "0.2")
        env.setdefault("GPULENS_EXPORTER__PER_GPU", "true")
        group = f"exporter-{name}-{unique}"
        return ExporterProcess(config_file, group, config_file.parent / f"{group}.log", env)

    yield make


def checkpointed_offsets(platform, group: str) -> dict[tuple[str, int], int]:
    """The input offsets an exporter's state log holds now (read as a restart reads them)."""
    offsets = {}
    for raw, value in StateLog(platform.kafka, state_log_topic(group)).restore().entries.items():
        kind, *where = json.loads(raw)
        if kind == "offset":
            offsets[(where[0], where[1])] = int(value)
    return offsets


def ends(platform) -> dict[tuple[str, int], int]:
    """The end offset of every exported partition."""
    consumer = Consumer(platform.kafka.librdkafka(**{"group.id": "ends-probe"}))
    try:
        return {
            (tp.topic, tp.partition): consumer.get_watermark_offsets(tp, timeout=10, cached=False)[1]
            for tp in topic_partitions(platform.kafka, PER_GPU_TOPICS, offset=0)
        }
    finally:
        consumer.close()


def wait_checkpointed(platform, group: str, timeout: float = 60) -> None:
    """Wait until the exporter's state log covers every record published so far."""
    deadline = time.monotonic() + timeout
    while behind := {
        p: o for p, o in ends(platform).items() if checkpointed_offsets(platform, group).get(p, 0) < o
    }:
        assert time.monotonic() < deadline, f"{group}: not checkpointed up to the ends: {behind}"
        time.sleep(0.2)


# --- tests --------------------------------------------------------------------------------------


def test_an_exporter_killed_mid_stream_shows_after_its_restart_what_an_uninterrupted_one_shows(
    platform, codec, unique, exporter_factory, spawned
) -> None:
    cluster = f"kill-{unique}"
    published = rounds(cluster, 0, 20)
    publish(platform, codec, published)
    killed, uninterrupted = exporter_factory("killed"), exporter_factory("uninterrupted")
    killed.start(spawned)
    uninterrupted.start(spawned)

    # more rounds while both run; the first is killed once it has read and checkpointed some
    r, deadline = 20, time.monotonic() + 120
    while total(killed.metrics(), "gpulens_exporter_state_records_written_total") == 0 or r < 30:
        assert time.monotonic() < deadline, f"the exporter never checkpointed: {killed.log.read_text()}"
        publish(platform, codec, rows := round_of(cluster, r))
        published += rows
        r += 1
    killed.kill()
    assert killed.process is not None and killed.process.returncode == -signal.SIGKILL
    downtime = rounds(cluster, r, r + 20)
    publish(platform, codec, downtime)
    published += downtime
    killed.start(spawned)

    want = expected(cluster, published)
    assert any(name == "consumer_pod_gpu_usage" for name, _ in want) and len(want) > 60
    after = killed.wait(
        lambda s: restored(s) and of_cluster(s, cluster) == want, "the newest rows after restart"
    )
    never = uninterrupted.wait(lambda s: of_cluster(s, cluster) == want, "the newest rows, uninterrupted")
    assert of_cluster(after, cluster) == of_cluster(never, cluster)
    assert after[("gpulens_exporter_restored_series", frozenset())] > 0, "the state came from the state log"


def test_a_restarted_exporter_reads_what_came_after_its_checkpoint_and_the_tail_of_the_samples(
    platform, codec, unique, exporter_factory, spawned
) -> None:
    cluster, tail = f"tail-{unique}", 20
    exporter = exporter_factory("tail", sample_tail_records=tail)
    history = rounds(cluster, 0, 40)
    publish(platform, codec, history)
    exporter.start(spawned)
    exporter.wait(lambda s: of_cluster(s, cluster) == expected(cluster, history), "the history")
    wait_checkpointed(platform, exporter.group)
    exporter.kill()

    downtime = rounds(cluster, 40, 80)
    publish(platform, codec, downtime)
    exporter.start(spawned)
    want = expected(cluster, history + downtime)
    samples = exporter.wait(
        lambda s: restored(s) and of_cluster(s, cluster) == want and caught_up(s), "the newest rows, no lag"
    )

    derived = {t.name for t in PER_GPU_TOPICS if t is not STATE_GPU_SAMPLES}
    derived_after = sum(1 for spec, _ in downtime if spec is not STATE_GPU_SAMPLES)
    samples_after = sum(1 for spec, _ in downtime if spec is STATE_GPU_SAMPLES)
    read_derived = total(samples, "gpulens_exporter_records_in_total", derived)
    read_samples = total(samples, "gpulens_exporter_records_in_total", {STATE_GPU_SAMPLES.name})
    assert read_derived <= derived_after, "derived records before the checkpoint were read again"
    assert read_samples <= STATE_GPU_SAMPLES.partitions * tail < samples_after, (
        "more than the tail of the samples"
    )
    assert samples[("gpulens_exporter_sample_records_skipped", frozenset())] >= samples_after - read_samples
    assert samples[("gpulens_exporter_restored_series", frozenset())] >= len(NODES) + 3


def test_scrapes_answer_within_a_second_while_a_large_sample_backlog_is_read(platform, codec, unique) -> None:
    """In-process on private topics (a backlog on the catalog's would slow every later reader):
    the exporter serves before it reads, and reading never keeps a scrape waiting."""
    topics = [dataclasses.replace(t, name=f"{t.name}.{unique}", partitions=1) for t in PER_GPU_TOPICS]
    create_topics(platform.kafka, topics)
    samples_topic = next(t for t in topics if t.record is STATE_GPU_SAMPLES.record)
    cluster, backlog, nodes = f"backlog-{unique}", 60_000, 200
    producer = Producer(platform.kafka.librdkafka(**{"linger.ms": 20}))
    values = [
        codec.encode(samples_topic, sample_batch(cluster, f"m{n}", 0, (50.0, 60.0))) for n in range(nodes)
    ]
    for i in range(backlog):
        while True:
            try:
                producer.produce(
                    samples_topic.name, key=f"{cluster}/m{i % nodes}".encode(), value=values[i % nodes]
                )
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(60) == 0

    settings = ExporterSettings(
        port=0, group_id=f"exporter-{unique}", sample_tail_records=backlog, poll_records=5_000, per_gpu=True
    )
    started = time.monotonic()
    exporter = Exporter(platform.kafka, codec, settings, topics=topics)
    host, port = exporter.serve()
    stop = threading.Event()
    thread = threading.Thread(target=exporter.run, args=(stop,), name="exporter")
    thread.start()
    latencies: list[float] = []
    try:
        url = f"http://{host}:{port}/metrics"
        lag = (
            "gpulens_consumer_lag_records",
            frozenset({("consumer", settings.group_id), ("topic", samples_topic.name)}),
        )
        first = None
        deadline = time.monotonic() + 120
        while True:
            asked = time.monotonic()
            with urllib.request.urlopen(url, timeout=30) as response:
                text = response.read().decode()
            latencies.append(time.monotonic() - asked)  # answered; parsing it is the client's time
            first = first or time.monotonic() - started
            samples = parse(text)
            if restored(samples) and samples.get(lag) == 0:
                break
            assert time.monotonic() < deadline, "the backlog was not read in time"
        read = total(samples, "gpulens_exporter_records_in_total", {samples_topic.name})
    finally:
        stop.set()
        thread.join(30)
    print(
        f"first scrape {first:.3f} s after start; {len(latencies)} scrapes while reading {read:.0f} "
        f"records, slowest {max(latencies):.3f} s"
    )
    assert read == backlog, "the whole backlog was read while scrapes were answered"
    assert len(latencies) > 3, "scrapes were taken while the backlog was read"
    assert first < 1.0, "the first scrape waited for the state"
    # measured 0.15-0.8 s at worst on the shared 2-core machine (a ~10 ms render of 1,200 series
    # sharing the GIL with the decoding thread): generous, the point is that none waits for the reading
    assert max(latencies) < 2.0


def test_a_write_that_changes_every_series_writes_each_once_as_the_snapshot(platform, codec, unique) -> None:
    """11,000 node series, every one newer at each write: a due snapshot holds the write's
    changes, so each write puts every series on the state log once, not as changes and then a
    snapshot of the same series."""
    group = f"every-series-{unique}"
    topic = state_log_topic(group)
    admin = AdminClient(platform.kafka.librdkafka())
    # compact only: the broker refuses the cuts, so the whole log stays to be counted
    admin.create_topics([NewTopic(topic, 1, 1, config={"cleanup.policy": "compact"})])[topic].result(30)
    checkpoint = ExporterCheckpoint(platform.kafka, codec, group_id=group, topics=[NODE_ALLOCATION])
    state = LatestState()
    try:
        for window in range(3):
            for i in range(11_000):
                state.apply(node_row("c", f"node-{i}", window, rate=0.5))
            checkpoint.write(state, {})
    finally:
        checkpoint.close()
    records = committed_records(platform.kafka, topic)
    entries = sum(1 for record in records if not record.key().startswith(SNAPSHOT_MARKER))
    assert entries == 3 * 11_000, "each write: its 11,000 series, once"
