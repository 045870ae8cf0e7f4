"""The allocation worker as a process: replay -> worker -> rows equal to the CSV, also across kill -9.

One test replays the whole Alibaba trace, on a platform of its own; the others prove what holds
on any trace (a kill, a restart, shards) with the head of it, against the oracle of that slice:
a worker of a new group reads every record the module's earlier tests left, so a whole trace
left there would be read again by each of them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from alert_oracle import SAMPLES, idle_alerts_from_csv, stale_alerts_from_csv
from allocation_oracle import expected_rows
from confluent_kafka import Consumer, Producer, TopicPartition
from module_platform_fixtures import module_platform_fixtures
from pod_events import T0, at, leaving_at_a_window_start
from prometheus_client import REGISTRY
from trace_slices import head_of
from worker_support import (
    EPOCH,
    PODS_CSV,
    RowReader,
    assert_rows_equal_the_csv,
    gpulens,
    replay,
    spawn,
    start_worker,
    thread_nices,
    wait_reading,
    worker_log,
    worker_metrics,
)

from gpulens.pipeline.operators import StateOperator
from gpulens.pipeline.running import StreamWorker, WorkerOptions
from gpulens.platform import free_port, private_platform
from gpulens.producers.replay import genai_duty
from gpulens.schemas.kafka.sharding import Shard
from gpulens.schemas.model.ids import event_id
from gpulens.schemas.model.models import Alert, DeadLetter, Watermark
from gpulens.schemas.model.topics import ALERTS, DLQ, GPU_SAMPLES, PODS, STATE_PODS, WATERMARKS, entity_key
from gpulens.schemas.wire.codec import AvroCodec
from gpulens.testing.examples import example_events

SLICE_PODS = 1_000
"""Pods of the trace's head a slice replays: 884 GPU pods, still spanning the trace's 3,585 hours."""
PACED_SPEED = "1000000"
"""Trace seconds per wall second of a paced replay of the slice: its 3,585 hours take 13 s."""


platform, config_file = module_platform_fixtures()


@pytest.fixture
def pods_slice(tmp_path: Path) -> Path:
    return head_of(PODS_CSV, SLICE_PODS, tmp_path / "pods.csv")


@pytest.fixture
def processes():
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def test_replay_through_the_worker_gives_the_csv_rows(own_platform, own_codec, unique, spawned) -> None:
    """The whole trace, on a platform of its own (see the module's docstring)."""
    platform, config_file = own_platform
    cluster = f"e2e-{unique}"
    reader = RowReader(platform, own_codec, cluster)
    spawned.append(start_worker(config_file, f"g-{unique}"))
    spawned.append(replay(config_file, cluster))
    try:
        rows = reader.read_until(len(expected_rows(PODS_CSV, 3600)), 180)
    finally:
        reader.close()
    assert_rows_equal_the_csv(rows)
    assert rows[-1].gpus_allocated_end == 0.0


def test_a_pod_deleted_at_a_window_start_is_not_in_that_windows_maximum(
    platform, codec, config_file, unique, processes
) -> None:
    """Issue 14's example: the window [3600, 7200) holds at most 0.5 GPUs, not 2.5."""
    cluster = f"edge-{unique}"
    producer = Producer(platform.kafka.librdkafka())
    for event in leaving_at_a_window_start(cluster):
        producer.produce(PODS.name, key=entity_key(cluster, event.uid), value=codec.encode(PODS, event))
    final = Watermark(
        event_id=event_id(cluster, "smoke", "final"), cluster=cluster, event_time=at(3700), source="smoke",
        final=True,
    )  # fmt: skip
    producer.produce(WATERMARKS.name, key=cluster.encode(), value=codec.encode(WATERMARKS, final))
    assert producer.flush(30) == 0
    reader = RowReader(platform, codec, cluster)
    processes.append(start_worker(config_file, f"g-{unique}"))
    try:
        rows = reader.read_until(2, 120)
        rows = reader.read_until(3, 3)  # a third row would be a window the watermark did not close
    finally:
        reader.close()
    assert [(r.window_start, r.gpus_allocated_max, r.gpus_allocated_end) for r in rows] == [
        (T0, 2.5, 2.5),
        (at(3600), 0.5, 0.5),
    ]


def dead_letters_of(platform, codec: AvroCodec, group: str) -> list[DeadLetter]:
    """Every committed dead letter the consumer group ``group`` wrote so far (the DLQ read to its end)."""
    consumer = Consumer(
        platform.kafka.librdkafka(**{"group.id": f"dlq-{group}", "isolation.level": "read_committed"})
    )
    partitions = [TopicPartition(DLQ.name, p) for p in range(DLQ.partitions)]
    ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in partitions}
    consumer.assign([TopicPartition(DLQ.name, p, 0) for p, end in ends.items() if end > 0])
    letters: list[DeadLetter] = []
    deadline = time.monotonic() + 60
    try:
        while any(tp.offset < ends[tp.partition] for tp in consumer.position(consumer.assignment())):
            assert time.monotonic() < deadline, "the DLQ is read to its end within 60 s"
            decoded = (
                codec.decode(DLQ, m.value()) for m in consumer.consume(10_000, 0.5) if m.error() is None
            )
            letters += [letter for letter in decoded if letter.consumer == group]
    finally:
        consumer.close()
    return letters


def test_a_replay_after_the_smoke_check_is_not_late(platform, codec, config_file, unique, processes) -> None:
    """Smoke records are stamped now: in the configured cluster they made a later replay of a
    past trace into it late, record by record (issue 14). They have a cluster of their own."""
    cluster, group = f"real-{unique}", f"g-{unique}"
    env = {**os.environ, "GPULENS_CLUSTER": cluster}
    subprocess.run(gpulens(config_file, "smoke"), check=True, capture_output=True, env=env)
    reader = RowReader(platform, codec, cluster)
    processes.append(start_worker(config_file, group))
    replaying = gpulens(config_file, "replay", "alibaba-v2023", "--part", "nodes")
    processes.append(spawn(replaying, config_file.parent / f"replay-{cluster}.log", env=env))
    try:
        rows = reader.read_until(1, 120)
    finally:
        reader.close()
    assert [(d.reason, d.source_topic) for d in dead_letters_of(platform, codec, group)] == []
    assert [(r.window_start, r.gpu_capacity) for r in rows[:1]] == [(EPOCH, 6212.0)]


def test_a_worker_killed_mid_stream_and_restarted_loses_and_repeats_nothing(
    platform, codec, config_file, unique, processes, pods_slice
) -> None:
    """The replay is paced, so the windows close over its 13 s and the kill lands between them."""
    cluster = f"kill-{unique}"
    group = f"g-{unique}"
    reader = RowReader(platform, codec, cluster)
    try:
        first = start_worker(config_file, group)
        processes.append(first)
        wait_reading(first, worker_log(config_file, group))
        replaying = replay(config_file, cluster, "--speed", PACED_SPEED, pods=pods_slice)
        processes.append(replaying)
        assert len(reader.read_until(300, 120)) >= 300, "the worker produced nothing before the kill"
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        assert replaying.poll() is None, "the kill came mid-stream: the replay was still publishing"
        processes.append(start_worker(config_file, group))
        rows = reader.read_until(len(expected_rows(pods_slice, 3600)), 180)
        rows = reader.read_until(len(rows) + 1, 3)  # one more row would be a duplicate: look for it
    finally:
        reader.close()
    assert_rows_equal_the_csv(rows, pods_slice)


def test_a_worker_holding_records_as_bytes_gives_the_csv_rows(
    platform, codec, config_file, unique, processes, pods_slice
) -> None:
    """--hold-decoded 0: every record held for event-time order waits as its wire bytes and is
    decoded when released (most placed by their heads alone); the rows are the CSV's all the same."""
    cluster, group = f"bytes-{unique}", f"g-{unique}"
    reader = RowReader(platform, codec, cluster)
    port = free_port()
    try:
        hold = ("--hold-decoded", "0", "--metrics-port", str(port))
        processes.append(start_worker(config_file, group, *hold))
        processes.append(replay(config_file, cluster, pods=pods_slice))
        rows = reader.read_until(len(expected_rows(pods_slice, 3600)), 180)
        rows = reader.read_until(len(rows) + 1, 3)  # one more row would be a duplicate: look for it
        metrics = wait_caught_up(port, group, 60)
    finally:
        reader.close()
    assert_rows_equal_the_csv(rows, pods_slice)
    held = metrics.get("gpulens_worker_records_held_as_bytes_total", 0)
    assert held >= SLICE_PODS, f"only {held:.0f} records were held as bytes: the path was not taken"


def wait_caught_up(port: int, group: str, deadline_s: float) -> dict[str, float]:
    """Wait until the worker's committed offsets reach the ends of its inputs."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            metrics = worker_metrics(port)
        except OSError:
            metrics = {}
        if "gpulens_consumer_lag_records" in metrics and metrics["gpulens_consumer_lag_records"] == 0:
            return metrics
        time.sleep(0.5)
    raise AssertionError(f"worker {group} did not catch up within {deadline_s} s")


def test_a_restarted_worker_restores_its_state_and_reads_only_what_came_after(
    platform, codec, config_file, unique, processes, pods_slice
) -> None:
    cluster, group = f"restore-{unique}", f"g-{unique}"
    reader = RowReader(platform, codec, cluster)
    try:
        port = free_port()
        first = start_worker(config_file, group, "--metrics-port", str(port))
        processes.append(first)
        processes.append(replay(config_file, cluster, pods=pods_slice))
        reader.read_until(len(expected_rows(pods_slice, 3600)), 180)
        before = wait_caught_up(port, group, 60)
        assert before["gpulens_worker_records_in_total"] > SLICE_PODS, "the first worker read the replay"
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        port = free_port()
        processes.append(start_worker(config_file, group, "--metrics-port", str(port)))
        after = wait_caught_up(port, group, 60)
    finally:
        reader.close()
    assert after["gpulens_worker_restored_state_keys"] > 0, "state came back from the state logs"
    assert after.get("gpulens_worker_records_in_total", 0) == 0, "nothing was read twice"


def test_a_niced_worker_runs_every_thread_at_its_lower_priority(config_file, unique, processes) -> None:
    """`--nice` lowers the priority of every thread of the worker: those started at import (numpy's
    OpenBLAS pool) and librdkafka's, which fetch and produce, too."""
    group = f"nice-{unique}"
    worker = start_worker(config_file, group, "--nice", "7")
    processes.append(worker)
    wait_reading(worker, worker_log(config_file, group, "--nice", "7"))
    nices = thread_nices(worker.pid)
    assert len(nices) > 5, "librdkafka's threads run"
    assert {nice for _, nice in nices} == {os.nice(0) + 7}


def test_two_worker_shards_split_the_clusters_and_each_gets_its_rows_once(
    platform, codec, config_file, unique, processes, pods_slice
) -> None:
    names = (f"shard{n}-{unique}" for n in range(100))
    by_shard = {Shard(0, 2): "", Shard(1, 2): ""}
    for name in names:
        for shard in by_shard:
            if shard.owns_cluster(name.encode()) and not by_shard[shard]:
                by_shard[shard] = name
    readers = {cluster: RowReader(platform, codec, cluster) for cluster in by_shard.values()}
    for shard in by_shard:
        processes.append(start_worker(config_file, f"g-{unique}", "--shard", str(shard)))
    for cluster in by_shard.values():
        processes.append(replay(config_file, cluster, pods=pods_slice))
    try:
        for reader in readers.values():
            rows = reader.read_until(len(expected_rows(pods_slice, 3600)), 240)
            rows = reader.read_until(len(rows) + 1, 2)  # a row of the other shard would be a duplicate
            assert_rows_equal_the_csv(rows, pods_slice)
    finally:
        for reader in readers.values():
            reader.close()


def test_a_sharded_worker_dead_letters_a_record_whose_key_names_another_cluster(
    platform, codec, unique
) -> None:
    honest = f"honest-{unique}"
    shard = Shard(next(i for i in range(1000) if Shard(i, 1000).owns_cluster(honest.encode())), 1000)
    pod = example_events(f"liar-{unique}")[PODS]
    producer = Producer(platform.kafka.librdkafka())
    producer.produce(PODS.name, key=entity_key(honest, pod.uid), value=codec.encode(PODS, pod))
    assert producer.flush(30) == 0
    worker = StreamWorker(
        platform.kafka, codec, [StateOperator()], WorkerOptions(group_id=f"liar-{unique}", shard=shard)
    )
    stop = threading.Event()
    running = threading.Thread(target=worker.run, args=(stop,))
    running.start()
    dlq = Consumer(
        platform.kafka.librdkafka(**{"group.id": f"dlq-{unique}", "auto.offset.reset": "earliest"})
    )
    dlq.subscribe([DLQ.name])
    letters: list[DeadLetter] = []
    deadline = time.monotonic() + 120
    try:
        while not letters and time.monotonic() < deadline:
            for message in dlq.consume(100, 0.5):
                if message.error() is None:
                    letter = codec.decode(DLQ, message.value())
                    if letter.consumer == f"liar-{unique}":
                        letters.append(letter)
    finally:
        dlq.close()
        stop.set()
        running.join(60)
    assert [(letter.reason, letter.source_topic) for letter in letters] == [("key-mismatch", PODS.name)]
    assert f"liar-{unique}" in letters[0].detail


@pytest.mark.parametrize("hold", [(), ("--hold-columns", "0")], ids=["columns", "batches-held-as-bytes"])
def test_genai_replay_through_the_worker_gives_the_csv_idle_alerts(
    platform, codec, config_file, unique, processes, tmp_path, hold: tuple[str, ...]
):
    """The head of the duty-cycle trace (222 alerts of 40 pods); test_alerting checks the
    whole trace's alerts through the operator. ``--hold-columns 0``: every sample batch held
    for event-time order waits as its bytes and is read by column when released."""
    cluster = f"idle-{unique}"
    samples = head_of(SAMPLES, 12_000, tmp_path / "duty.csv")
    expected = idle_alerts_from_csv(5.0, 600.0, samples)
    stale = stale_alerts_from_csv(300.0, samples)  # the worker's default --stale-after
    command = gpulens(
        config_file, "worker", "--processors", "alerts", "--group", f"a-{unique}", "--idle-ms", "3000",
        "--source-timeout", "1", *hold,
    )  # fmt: skip
    processes.append(spawn(command, config_file.parent / f"worker-a-{unique}.log"))
    replaying = gpulens(config_file, "replay", "genai-duty", "--samples", str(samples))
    processes.append(
        spawn(
            replaying,
            config_file.parent / f"replay-{cluster}.log",
            env={**os.environ, "GPULENS_CLUSTER": cluster},
        )
    )
    consumer = Consumer(
        platform.kafka.librdkafka(**{"group.id": f"alerts-{cluster}", "isolation.level": "read_committed"})
    )
    consumer.assign([TopicPartition(ALERTS.name, p, 0) for p in range(ALERTS.partitions)])
    alerts: list[Alert] = []
    deadline = time.monotonic() + 180
    try:
        while time.monotonic() < deadline and len(alerts) < len(expected) + len(stale):
            for message in consumer.consume(1000, 0.5):
                if message.error() is None:
                    alert = codec.decode(ALERTS, message.value())
                    if alert.cluster == cluster:
                        alerts.append(alert)
    finally:
        consumer.close()
    pod_of_gpu = {genai_duty.gpu_id(pod): pod for pod, _, _ in expected}
    published = {
        (pod_of_gpu[a.gpu_id], a.state.value, a.event_time.timestamp())
        for a in alerts
        if a.alert == "GpuIdle"
    }
    assert published == expected
    pod_of_node = {genai_duty.node_name(pod): pod for pod, _, _, _ in stale}
    assert {
        (pod_of_node[a.node or ""], a.state.value, a.event_time.timestamp(), a.since.timestamp())
        for a in alerts
        if a.alert == "GpuTelemetryStale"
    } == stale
    assert len(alerts) == len(published) + len(stale)


def test_a_worker_catching_up_on_a_backlog_holds_a_bounded_number_of_records(tmp_path: Path) -> None:
    """The backlog's partitions are fetched as the broker hands them out; past --hold records,
    the ones running ahead in event time wait, so the watermarks come in time to release."""
    with private_platform(tmp_path) as settings:
        config = tmp_path / "gpulens.toml"
        cluster = "backlog"
        # 100 nodes sampled every 2 s for 20 minutes, published over about 20 s (so that each
        # watermark vouches for what came before it, not for the whole backlog). The peak is
        # mostly what the broker hands out while the cluster's time waits for its sources (1 s):
        # of 50 nodes' 30,000 records 11,900-13,600 alone, 11,000-11,700 beside a CPU hog and
        # 15,100 once in a loaded suite; of 100 nodes' 60,000, 14,500-18,700.
        publish = gpulens(
            config, "simulate", "--cluster", cluster, "--nodes", "100", "--interval", "2",
            "--duration", "1200", "--speed", "60", "--seed", "3",
        )  # fmt: skip
        subprocess.run(publish, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        probe = Consumer(settings.kafka.librdkafka(**{"group.id": "probe"}))
        backlog = sum(
            probe.get_watermark_offsets(TopicPartition(GPU_SAMPLES.name, p), timeout=10)[1]
            for p in range(GPU_SAMPLES.partitions)
        )
        probe.close()
        assert backlog > 50_000, "100 nodes x 600 sample batches"
        port = free_port()
        hold = ["--hold", "2000", "--source-timeout", "1", "--metrics-port", str(port)]
        worker = spawn(gpulens(config, "worker", "--group", "hold", *hold), tmp_path / "worker.log")
        try:
            metrics = wait_caught_up(port, "hold", 240)
        finally:
            worker.terminate()
            worker.wait(30)
    peak = metrics["gpulens_worker_buffered_records_peak"]
    assert metrics["gpulens_worker_records_in_total"] >= backlog
    assert peak < backlog / 2, f"held {peak:.0f} records at once of a {backlog} record backlog"


def test_a_record_held_by_its_head_whose_body_is_refused_is_dead_lettered_when_released(
    own_platform, own_codec
) -> None:
    """Held as bytes (``hold_decoded`` 0), a record of a source the worker already hears is placed
    by its head alone; its cut body is refused when it is released: dead-lettered with the full
    decode's reason, the records around it applied, the final watermark ending the cluster."""
    settings, _ = own_platform
    first = example_events("heads", source="agent/n1", at=T0)[PODS]
    cut, last = (
        first.model_copy(update={"event_id": name, "uid": name, "event_time": T0 + timedelta(seconds=s)})
        for name, s in (("pod-cut", 1), ("pod-last", 2))
    )
    end = Watermark(
        event_id="end", cluster="heads", event_time=T0 + timedelta(seconds=10), source="agent/n1", final=True
    )
    producer = Producer(settings.kafka.librdkafka())
    key = entity_key("heads", first.uid)  # one partition: read in this order
    for value in (
        own_codec.encode(PODS, first),
        own_codec.encode(PODS, cut)[:-3],
        own_codec.encode(PODS, last),
    ):
        producer.produce(PODS.name, key=key, value=value)
    producer.produce(WATERMARKS.name, key=b"heads", value=own_codec.encode(WATERMARKS, end))
    assert producer.flush(30) == 0
    placed = REGISTRY.get_sample_value("gpulens_worker_records_placed_by_head_total") or 0.0
    options = WorkerOptions(group_id="heads", hold_decoded=0, source_timeout_s=1.0, idle_ms=0)
    worker = StreamWorker(settings.kafka, own_codec, [StateOperator()], options)
    deadline = time.monotonic() + 60
    while worker.processed < 3 and time.monotonic() < deadline:  # the three pods
        worker.step()
    stopped = threading.Event()
    stopped.set()
    worker.run(stopped)  # commits and closes it
    placed = (REGISTRY.get_sample_value("gpulens_worker_records_placed_by_head_total") or 0.0) - placed
    letters = [own_codec.decode(DLQ, v) for v in committed_values(settings, DLQ.name)]
    pods = [own_codec.decode(STATE_PODS, v) for v in committed_values(settings, STATE_PODS.name)]
    assert [(d.reason, d.source_offset) for d in letters] == [("avro-decode-error", 1)]
    assert sorted(p.uid for p in pods) == sorted([first.uid, "pod-last"])
    assert placed == 2, (
        "the cut record and the last were placed by their heads (the first made its source heard)"
    )


def committed_values(settings, topic: str) -> list[bytes]:
    """Every committed value on ``topic`` (all committed before: read until a poll brings none)."""
    consumer = Consumer(
        settings.kafka.librdkafka(**{"group.id": f"read-{topic}", "isolation.level": "read_committed"})
    )
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    values: list[bytes] = []
    while batch := consumer.consume(1000, 2.0):
        values += [m.value() for m in batch if m.error() is None]
    consumer.close()
    return values


def test_a_cycle_is_committed_once_old_enough_even_in_a_release(own_platform, own_codec) -> None:
    """A restart catching up releases tens of thousands of records at once: the cycle's age is
    checked per record, so its rows reach readers as it goes, not once the whole release is done."""
    settings, _ = own_platform
    pod = example_events("catch-up")[PODS]
    producer = Producer(settings.kafka.librdkafka())
    pods = 300
    for i in range(pods):
        copy = pod.model_copy(update={"uid": f"pod-{i}", "name": f"pod-{i}"})
        key, value = entity_key(copy.cluster, copy.uid), own_codec.encode(PODS, copy)
        producer.produce(PODS.name, key=key, value=value)
    assert producer.flush(30) == 0
    options = WorkerOptions(  # cycle_max_s as short: no cycle stretched for its commit's cost
        group_id="catch-up", idle_ms=0, cycle_s=1e-9, cycle_max_s=1e-9, cycle_records=10**9
    )
    worker = StreamWorker(settings.kafka, own_codec, [StateOperator()], options)
    before, steps = REGISTRY.get_sample_value("gpulens_worker_cycles_total") or 0.0, 0
    deadline = time.monotonic() + 60
    while worker.processed < pods and time.monotonic() < deadline:
        worker.step()
        steps += 1
    cycles = (REGISTRY.get_sample_value("gpulens_worker_cycles_total") or 0.0) - before
    stopped = threading.Event()
    stopped.set()
    worker.run(stopped)  # commits and closes it
    assert worker.processed == pods
    assert steps < pods / 10, "the records came in a few releases"
    assert cycles >= pods, f"{cycles:.0f} cycles committed for {pods} records in {steps} steps"


def test_a_cycle_lasts_cycle_s_while_commits_are_cheap_and_stretches_when_they_are_not() -> None:
    options = WorkerOptions(cycle_s=1.0, commit_share=0.1, cycle_max_s=10.0)
    assert options.next_cycle_s(0.02) == 1.0, "a 20 ms commit is 2 % of a 1 s cycle"
    assert options.next_cycle_s(0.3) == pytest.approx(3.0), "a 300 ms commit is a tenth of 3 s"
    assert options.next_cycle_s(4.0) == 10.0, "never past cycle_max_s"


def test_a_stretched_cycle_holds_as_many_more_records_as_it_lasts_longer() -> None:
    options = WorkerOptions(cycle_s=1.0, cycle_records=20_000, cycle_max_s=10.0)
    assert options.records_for(1.0) == 20_000
    assert options.records_for(3.0) == 60_000


def _cycles_while_streaming(
    settings, codec: AvroCodec, options: WorkerOptions, seconds: float
) -> tuple[float, int]:
    """Cycles a worker commits while a pod reaches it every step or so for ``seconds``, and the
    records it processed."""
    pod = example_events(options.group_id)[PODS]
    producer = Producer(settings.kafka.librdkafka())
    worker = StreamWorker(settings.kafka, codec, [StateOperator()], options)
    before = REGISTRY.get_sample_value("gpulens_worker_cycles_total") or 0.0
    deadline, sent = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        copy = pod.model_copy(update={"uid": f"pod-{sent}", "name": f"pod-{sent}"})
        producer.produce(PODS.name, key=entity_key(copy.cluster, copy.uid), value=codec.encode(PODS, copy))
        producer.poll(0)
        sent += 1
        worker.step(timeout=0.05)
    cycles = (REGISTRY.get_sample_value("gpulens_worker_cycles_total") or 0.0) - before
    stopped = threading.Event()
    stopped.set()
    worker.run(stopped)  # commits and closes it
    assert producer.flush(30) == 0 and worker.processed > 0
    return cycles, worker.processed


def test_cycles_stretch_so_that_commits_take_their_share_of_the_worker(own_platform, own_codec) -> None:
    """Each commit costs about as much whatever the cycle held (at 100,000 GPUs every workload's
    usage changes every 2 s): under load a cycle lasts its last commit's time / commit_share,
    up to cycle_max_s. A share no commit can keep within stretches every cycle to the most."""
    settings, _ = own_platform
    options = WorkerOptions(group_id="stretched", idle_ms=0, cycle_s=0.05, commit_share=1e-9, cycle_max_s=1.5)
    cycles, _ = _cycles_while_streaming(settings, own_codec, options, 6.0)
    assert cycles <= 6.0 / 1.5 + 1, f"{cycles:.0f} cycles in 6 s of 1.5 s cycles"
    assert REGISTRY.get_sample_value("gpulens_worker_cycle_seconds") == 1.5


def test_a_stretched_cycle_is_not_cut_short_by_the_records_that_fill_a_short_one(
    own_platform, own_codec
) -> None:
    """cycle_records fills a cycle of cycle_s; one stretched 30 times holds 30 times as many."""
    settings, _ = own_platform
    options = WorkerOptions(
        group_id="stretched-full", idle_ms=0, cycle_s=0.05, commit_share=1e-9, cycle_max_s=1.5,
        cycle_records=10,
    )  # fmt: skip
    cycles, processed = _cycles_while_streaming(settings, own_codec, options, 6.0)
    assert processed / options.cycle_records > 6.0 / 1.5 + 1, "more records came than short cycles hold"
    assert cycles <= 6.0 / 1.5 + 1, f"{cycles:.0f} cycles for {processed} records in 6 s of 1.5 s cycles"


def test_cycles_last_cycle_s_while_commits_keep_within_their_share(own_platform, own_codec) -> None:
    settings, _ = own_platform
    options = WorkerOptions(group_id="cheap", idle_ms=0, cycle_s=0.05, commit_share=1.0, cycle_max_s=1.5)
    cycles, _ = _cycles_while_streaming(settings, own_codec, options, 6.0)
    assert cycles >= 6.0 / 1.5 * 3, f"only {cycles:.0f} cycles in 6 s of 0.05 s cycles"
