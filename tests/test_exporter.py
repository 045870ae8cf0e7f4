"""The Prometheus exporter against the real broker: Primus-Lens's names with the newest rows' values.

Records are published first and the exporter started after (it must rebuild the state from the
topics, as after a restart), then more while it runs; every check scrapes /metrics over HTTP
and parses it with prometheus-client's own parser. By default it never reads the GPU sample
stream (the node agents serve per-GPU gauges: tests/test_agent_metrics.py); its per-GPU mode
serves them from each node's newest batch on gpulens.state.gpu-samples.v1.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from gpulens.consumers.prometheus import EXPORTED_TOPICS, PER_GPU_TOPICS, Exporter, ExporterSettings
from gpulens.consumers.prometheus.collecting import IDLE_KINDS
from gpulens.consumers.prometheus.state import LatestState
from gpulens.schemas.kafka.topic_admin import create_topics
from gpulens.schemas.model.models import (
    Alert,
    AlertState,
    ClusterGpuAllocation,
    GpuSample,
    GpuSampleBatch,
    IdleGpuHours,
    NodeGpuAllocation,
    Record,
    WorkloadGpuUsage,
)
from gpulens.schemas.model.topics import (
    ALERTS,
    CLUSTER_ALLOCATION,
    GPU_SAMPLES,
    IDLE_GPU_HOURS,
    NODE_ALLOCATION,
    STATE_GPU_SAMPLES,
    WORKLOAD_USAGE,
    TopicSpec,
    record_key,
)
from gpulens.schemas.wire.codec import AvroCodec
from gpulens.testing.memory import traced_bytes

T0 = datetime(2024, 5, 1, tzinfo=UTC)
WINDOW = timedelta(seconds=30)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


# --- records ------------------------------------------------------------------------------------


def cluster_row(cluster: str, window: int, *, capacity: float, allocated: float, pending: int):
    start = T0 + window * WINDOW
    return ClusterGpuAllocation(
        event_id=f"{cluster}/{window}",
        cluster=cluster,
        window_start=start,
        window_end=start + WINDOW,
        gpu_capacity=capacity,
        gpus_allocated_avg=allocated,
        gpus_allocated_max=allocated,
        gpus_allocated_end=allocated,
        allocation_rate_avg=allocated / capacity,
        pods_running_end=int(allocated),
        pods_pending_end=pending,
    )


def node_row(cluster: str, node: str, window: int, *, rate: float) -> NodeGpuAllocation:
    start = T0 + window * WINDOW
    return NodeGpuAllocation(
        event_id=f"{cluster}/{node}/{window}",
        cluster=cluster,
        node=node,
        window_start=start,
        window_end=start + WINDOW,
        gpu_capacity=8,
        gpus_allocated_avg=8 * rate,
        gpus_allocated_max=8,
        gpus_allocated_end=8 * rate,
        allocation_rate_avg=rate,
        pods_running_end=1,
    )


def workload_row(cluster: str, uid: str, window: int, *, usage: float, gpus: float) -> WorkloadGpuUsage:
    start = T0 + window * WINDOW
    return WorkloadGpuUsage(
        event_id=f"{cluster}/{uid}/{window}",
        cluster=cluster,
        workload_uid=uid,
        workload_kind="PyTorchJob",
        workload_name=f"job-{uid}",
        namespace="ml",
        window_start=start,
        window_end=start + WINDOW,
        gpus_allocated_avg=gpus,
        gpus_allocated_max=gpus,
        gpus_allocated_end=gpus,
        utilization_avg=usage,
        utilization_max=usage,
        samples=10,
        pods_active_end=2,
    )


def sample_batch(cluster: str, node: str, second: int, utilization: tuple[float, float]) -> GpuSampleBatch:
    return GpuSampleBatch(
        event_id=f"{cluster}/{node}/{second}",
        cluster=cluster,
        event_time=T0 + timedelta(seconds=second),
        source="node-agent",
        node=node,
        samples=[
            GpuSample(
                device_id=f"gpu-{i}",
                index=i,
                utilization_pct=u,
                power_watts=300 + u,
                memory_used_bytes=int(u) << 30,
            )
            for i, u in enumerate(utilization)
        ],
    )


def idle_row(cluster: str, hour: int, device: str, uid: str, **hours: float) -> IdleGpuHours:
    start = T0 + timedelta(hours=hour)
    return IdleGpuHours(
        event_id=f"{cluster}/{hour}/{device}/{uid}",
        cluster=cluster,
        window_start=start,
        window_end=start + timedelta(hours=1),
        node="n1",
        device_id=device,
        workload_uid=uid,
        workload_kind="PyTorchJob" if uid else "",
        workload_name=f"job-{uid}" if uid else "",
        namespace="ml" if uid else "",
        **{f"{kind}_gpu_hours": hours.get(kind, 0.0) for kind in (*IDLE_KINDS, "unallocated")},
    )


def alert(cluster: str, name: str, entity: str, state: AlertState, second: int) -> Alert:
    return Alert(
        event_id=f"{cluster}/{name}/{entity}/{state}",
        cluster=cluster,
        event_time=T0 + timedelta(seconds=second),
        source="gpulens-worker",
        alert=name,
        state=state,
        entity=entity,
        since=T0,
        message=f"{name} {entity}",
    )


def publish(platform, codec: AvroCodec, records: Iterable[tuple[TopicSpec, Record]]) -> None:
    producer = Producer(platform.kafka.librdkafka(**{"linger.ms": 5}))
    for spec, record in records:
        producer.produce(spec.name, key=record_key(spec, record), value=codec.encode(spec, record))
    assert producer.flush(30) == 0


# --- scraping -----------------------------------------------------------------------------------


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=5) as response:
        return parse(response.read().decode())


def parse(text: str) -> Samples:
    """Every sample of a scrape, by name and labels."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def of_cluster(samples: Samples, cluster: str) -> Samples:
    return {k: v for k, v in samples.items() if ("cluster", cluster) in k[1]}


def wait_for(url: str, condition: Callable[[Samples], bool], what: str, timeout: float = 30) -> Samples:
    """Scrape until ``condition`` holds; fail with the last scrape after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(url)
        if condition(samples):
            return samples
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}; last scrape: {sorted(samples.items())}")
        time.sleep(0.1)


def series(
    metric: str, value: float, /, **labels: str
) -> tuple[tuple[str, frozenset[tuple[str, str]]], float]:
    return (metric, frozenset(labels.items())), value


def gpu_series(cluster: str, node: str, index: int, utilization: float) -> Samples:
    labels = {"cluster": cluster, "node": node, "gpu_id": str(index), "device_id": f"gpu-{index}"}
    return dict(
        [
            series("gpu_utilization", utilization, **labels),
            series("gpu_socket_power_watts", 300 + utilization, **labels),
            series("gpu_memory_used_bytes", float(int(utilization) << 30), **labels),
        ]
    )


def workload_series(cluster: str, uid: str, *, usage: float, gpus: float) -> Samples:
    labels = {"cluster": cluster, "namespace": "ml", "kind": "PyTorchJob", "name": f"job-{uid}", "uid": uid}
    return dict(
        [
            series("consumer_pod_gpu_usage", usage, **labels),
            series("consumer_pod_gpu_allocated", gpus, **labels),
            series("consumer_pod_active", 2, **labels),
        ]
    )


# --- the command, on the catalog topics ------------------------------------------------------------


@pytest.fixture
def exporter_process(config_file: Path, unique: str) -> Iterator[Callable[..., str]]:
    """Starts `gpulens exporter --port 0` as a process (with ``GPULENS_EXPORTER__*`` settings);
    gives its /metrics URL (read from its log)."""
    started: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(**settings: object) -> str:
        log = config_file.parent / f"exporter-{unique}-{len(started)}.log"
        command = [sys.executable, "-m", "gpulens", "--config", str(config_file), "exporter", "--port", "0",
                   "--group", f"exporter-{unique}-{len(started)}"]  # fmt: skip
        env = {**os.environ, **{f"GPULENS_EXPORTER__{k.upper()}": str(v) for k, v in settings.items()}}
        with log.open("wb") as stderr:
            process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, env=env)
        started.append((process, log))
        deadline = time.monotonic() + 30
        while (found := re.search(r"serving (http://\S+/metrics)", log.read_text())) is None:
            assert process.poll() is None, f"exporter exited: {log.read_text()}"
            assert time.monotonic() < deadline, f"exporter did not serve in time: {log.read_text()}"
            time.sleep(0.1)
        return found.group(1)

    try:
        yield start
    finally:
        for process, log in started:
            process.terminate()
            try:
                assert process.wait(20) == 0, log.read_text()
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait()


def every_kind(cluster: str) -> list[tuple[TopicSpec, Record]]:
    """Rows of every exported topic for ``cluster``, some out of order, and GPU samples both on
    the sample stream and as each node's newest batch."""
    return [
        (CLUSTER_ALLOCATION, cluster_row(cluster, 0, capacity=16, allocated=8, pending=3)),
        (CLUSTER_ALLOCATION, cluster_row(cluster, 2, capacity=16, allocated=12, pending=1)),
        # an older window arriving last (a replay, a late partition) hides nothing
        (CLUSTER_ALLOCATION, cluster_row(cluster, 1, capacity=16, allocated=4, pending=5)),
        (NODE_ALLOCATION, node_row(cluster, "n1", 0, rate=0.25)),
        (NODE_ALLOCATION, node_row(cluster, "n1", 1, rate=0.875)),
        (NODE_ALLOCATION, node_row(cluster, "n2", 1, rate=0.5)),
        (WORKLOAD_USAGE, workload_row(cluster, "w1", 1, usage=40.0, gpus=4)),
        (WORKLOAD_USAGE, workload_row(cluster, "w1", 2, usage=55.5, gpus=6)),
        (STATE_GPU_SAMPLES, sample_batch(cluster, "n1", 5, (10.0, 20.0))),
        (STATE_GPU_SAMPLES, sample_batch(cluster, "n1", 10, (3.0, 97.0))),
        (GPU_SAMPLES, sample_batch(cluster, "n1", 5, (10.0, 20.0))),
        (GPU_SAMPLES, sample_batch(cluster, "n1", 10, (3.0, 97.0))),
        (GPU_SAMPLES, sample_batch(cluster, "n2", 10, (55.0, 66.0))),  # on the stream only
        (IDLE_GPU_HOURS, idle_row(cluster, 0, "gpu-0", "w1", idle=1.0)),
        (IDLE_GPU_HOURS, idle_row(cluster, 0, "gpu-1", "w2", active=1.0)),  # w2 holds nothing an hour later
        (IDLE_GPU_HOURS, idle_row(cluster, 1, "gpu-0", "w1", active=0.25, memory_idle=0.5, unmeasured=0.25)),
        (IDLE_GPU_HOURS, idle_row(cluster, 1, "gpu-1", "w1", idle=0.5)),
        (IDLE_GPU_HOURS, idle_row(cluster, 1, "gpu-1", "", unallocated=0.5)),
        (ALERTS, alert(cluster, "GpuIdle", "gpu-0", AlertState.OPENED, 600)),
        (ALERTS, alert(cluster, "GpuIdle", "gpu-0", AlertState.RESOLVED, 700)),
        (ALERTS, alert(cluster, "NodeNotReady", "n2", AlertState.OPENED, 650)),
    ]


def newest_rows(cluster: str) -> Samples:
    """What the exporter shows of :func:`every_kind` by default: no per-GPU series."""
    return (
        dict(
            [
                series("gpu_allocation_rate", 0.75, cluster=cluster),
                series("cluster_gpu_capacity", 16, cluster=cluster),
                series("cluster_gpus_allocated", 12, cluster=cluster),
                series("cluster_gpu_pods_pending", 1, cluster=cluster),
                series("node_k8s_gpu_allocation_rate", 0.875, cluster=cluster, node="n1"),
                series("node_k8s_gpu_allocation_rate", 0.5, cluster=cluster, node="n2"),
                series("gpulens_alerts_open", 0, cluster=cluster, alert="GpuIdle"),
                series("gpulens_alerts_open", 1, cluster=cluster, alert="NodeNotReady"),
            ]
        )
        | workload_series(cluster, "w1", usage=55.5, gpus=6)
        | idle_series(cluster)
    )


def idle_series(cluster: str) -> Samples:
    """The newest hour of :func:`every_kind`'s idle GPU-hours, in GPU-seconds: w1's over both its GPUs."""
    owner = {"cluster": cluster, "namespace": "ml", "kind": "PyTorchJob", "name": "job-w1", "uid": "w1"}
    hours = {"active": 0.25, "idle": 0.5, "memory_idle": 0.5, "unmeasured": 0.25}
    return dict(
        [series("owner_gpu_seconds", hours[kind] * 3600, **owner, usage=kind) for kind in IDLE_KINDS]
        + [series("cluster_unallocated_gpu_seconds", 1800, cluster=cluster)]
    )


def reads(samples: Samples, topic: str) -> bool:
    """The exporter measures its lag on ``topic``: it reads it."""
    return any(
        name == "gpulens_consumer_lag_records" and ("topic", topic) in labels for name, labels in samples
    )


def test_the_command_shows_the_newest_row_of_every_series_and_reads_no_samples(
    platform, codec, unique, exporter_process
) -> None:
    cluster = f"exp-{unique}"
    publish(platform, codec, every_kind(cluster))
    url = exporter_process()  # started after the records: a restart
    expected = newest_rows(cluster)
    samples = wait_for(
        url,
        lambda s: of_cluster(s, cluster) == expected and reads(s, ALERTS.name),
        f"the newest rows of {cluster}",
    )
    assert {t.name for t in EXPORTED_TOPICS if reads(samples, t.name)} == {t.name for t in EXPORTED_TOPICS}
    assert not reads(samples, GPU_SAMPLES.name) and not reads(samples, STATE_GPU_SAMPLES.name)
    assert not any(name.startswith("gpu_") and name != "gpu_allocation_rate" for name, _ in samples)


def test_the_per_gpu_mode_shows_each_nodes_newest_batch_and_never_reads_the_sample_stream(
    platform, codec, unique, exporter_process
) -> None:
    cluster = f"gpu-{unique}"
    publish(platform, codec, every_kind(cluster))
    url = exporter_process(per_gpu="true")
    # n2 reported on the sample stream only: it is not shown
    expected = newest_rows(cluster) | gpu_series(cluster, "n1", 0, 3.0) | gpu_series(cluster, "n1", 1, 97.0)
    # the lag is measured on a timer of its own: it may show after the rows
    samples = wait_for(
        url,
        lambda s: of_cluster(s, cluster) == expected and reads(s, STATE_GPU_SAMPLES.name),
        f"the newest rows of {cluster} and the lag on {STATE_GPU_SAMPLES.name}",
    )
    assert not reads(samples, GPU_SAMPLES.name)


def test_the_commands_scrape_passes_promtool_and_the_client_parser(
    platform, codec, unique, promtool, exporter_process
) -> None:
    """What a Prometheus server ingests: every family once, each with one HELP and TYPE line."""
    cluster = f"prom-{unique}"
    publish(platform, codec, every_kind(cluster))
    url = exporter_process(per_gpu="true")  # every family it can serve
    wait_for(
        url,
        lambda s: (
            ("cluster_gpus_allocated", frozenset({("cluster", cluster)})) in s
            and any(name == "gpu_utilization" and ("cluster", cluster) in labels for name, labels in s)
            and any(name == "gpulens_consumer_lag_records" for name, _ in s)
            and s.get(("gpulens_exporter_batch_records_count", frozenset()), 0) >= 1
        ),
        "the rows, the lag and a batch in the scrape",
    )
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()

    checked = subprocess.run(
        [str(promtool), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    complaints = checked.stdout + checked.stderr
    assert checked.returncode == 0 and not complaints, complaints
    families = [f.name for f in text_string_to_metric_families(text)]
    assert len(families) == len(set(families)), sorted(n for n in families if families.count(n) > 1)
    helps = [line.split()[2] for line in text.splitlines() if line.startswith("# HELP ")]
    assert len(helps) == len(set(helps))


# --- the exporter in-process, on private topics ------------------------------------------------------


@pytest.fixture
def private_topics(platform, unique) -> dict[str, TopicSpec]:
    """The topics of the per-GPU mode under private names (one partition), by their catalog name."""
    topics = {t.name: dataclasses.replace(t, name=f"{t.name}.{unique}", partitions=1) for t in PER_GPU_TOPICS}
    create_topics(platform.kafka, topics.values())
    return topics


@pytest.fixture
def running_exporter(platform, codec, unique, private_topics) -> Iterator[tuple[str, str]]:
    """An exporter on the private topics in a thread; yields its /metrics URL and group."""
    group = f"exporter-{unique}"
    settings = ExporterSettings(port=0, group_id=group, lag_interval_s=0.2, per_gpu=True)
    exporter = Exporter(platform.kafka, codec, settings, topics=list(private_topics.values()))
    host, port = exporter.serve()
    stop = threading.Event()
    thread = threading.Thread(target=exporter.run, args=(stop,), name="exporter")
    thread.start()
    try:
        yield f"http://{host}:{port}/metrics", group
    finally:
        stop.set()
        thread.join(30)
        assert not thread.is_alive()


def test_ended_workloads_disappear_and_health_is_counted(
    platform, codec, unique, private_topics, running_exporter
) -> None:
    url, group = running_exporter
    cluster = f"exp-{unique}"
    workloads = private_topics[WORKLOAD_USAGE.name]
    publish(
        platform,
        codec,
        [
            (workloads, workload_row(cluster, "short", 0, usage=10.0, gpus=1)),
            (workloads, workload_row(cluster, "long", 0, usage=60.0, gpus=8)),
        ],
    )
    producer = Producer(platform.kafka.librdkafka())
    producer.produce(workloads.name, key=b"bad", value=b"not avro at all")
    assert producer.flush(30) == 0

    records_in = ("gpulens_exporter_records_in_total", frozenset({("topic", workloads.name)}))
    dead = (
        "gpulens_dead_letters_total",
        frozenset({("topic", workloads.name), ("reason", "bad-magic-byte"), ("consumer", group)}),
    )
    lag = ("gpulens_consumer_lag_records", frozenset({("consumer", group), ("topic", workloads.name)}))
    both = workload_series(cluster, "short", usage=10.0, gpus=1) | workload_series(
        cluster, "long", usage=60.0, gpus=8
    )
    samples = wait_for(
        url,
        lambda s: of_cluster(s, cluster) == both and s.get(dead) == 1 and s.get(lag) == 0,
        "two workloads, one dead letter, no lag",
    )
    assert samples[records_in] == 2
    assert samples[("gpulens_exporter_batch_records_count", frozenset())] >= 1
    assert samples[("gpulens_exporter_batch_records_sum", frozenset())] == 2
    assert samples[("gpulens_exporter_batch_duration_seconds_count", frozenset())] >= 1
    lag_series = {labels for name, labels in samples if name == lag[0] and ("consumer", group) in labels}
    assert lag_series == {
        frozenset({("consumer", group), ("topic", t.name)}) for t in private_topics.values()
    }

    # "short" ends; two windows later it is still shown, one more and it is gone
    publish(
        platform,
        codec,
        [(workloads, workload_row(cluster, "long", w, usage=60.0 + w, gpus=8)) for w in (1, 2)],
    )
    still = workload_series(cluster, "short", usage=10.0, gpus=1) | workload_series(
        cluster, "long", usage=62.0, gpus=8
    )
    wait_for(url, lambda s: of_cluster(s, cluster) == still, "a workload two windows behind kept")
    publish(platform, codec, [(workloads, workload_row(cluster, "long", 3, usage=63.0, gpus=8))])
    gone = workload_series(cluster, "long", usage=63.0, gpus=8)
    samples = wait_for(
        url, lambda s: of_cluster(s, cluster) == gone, "a workload three windows behind dropped"
    )
    assert samples[records_in] == 5


def test_a_series_holds_what_a_scrape_shows_and_its_bytes_not_the_decoded_row(codec) -> None:
    """An hour into a 100,000-GPU cluster the exporter holds 100,000 idle rows (one per GPU and
    owner); kept decoded beside their bytes, they took 168 MB (``python -m bench.exporter_memory``).
    8,000 such rows (8 GPUs a node, a workload every 4 GPUs) must take under half of what their
    decoded rows and bytes take."""
    rows = [
        idle_row("c", 0, f"gpu-{i % 8}", f"w{i // 4}", active=0.5, idle=0.5).model_copy(
            update={"node": f"node-{i // 8:05d}"}
        )
        for i in range(8_000)
    ]
    wires = [codec.encode(IDLE_GPU_HOURS, row) for row in rows]

    def filled() -> LatestState:
        state = LatestState()
        for wire in wires:
            state.apply(codec.decode(IDLE_GPU_HOURS, wire), wire)
        return state

    decoded, _ = traced_bytes(lambda: [(codec.decode(IDLE_GPU_HOURS, wire), wire) for wire in wires])
    held, state = traced_bytes(filled)
    assert len(state.snapshot().idle) == 8_000, "every row is a series of the newest window"
    assert held < decoded / 2, f"the state took {held / 1e6:.1f} MB, the decoded rows {decoded / 1e6:.1f} MB"
