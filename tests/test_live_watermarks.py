"""Issue 12's motivating case with live sources: a watcher's NodeEvents published after an
agent's samples of later instants still count at their own time.

Two sources of one cluster publish as live ones do, each with its own watermarks: the watcher
(nodes, pods) and a node agent (GPU samples, every 10 s). In the *late* cluster the agent
publishes everything first and vouches for all of it, while the watcher has published its
first nodes only and vouches for the instant after them; it keeps vouching for that instant
(as a live watcher stuck behind would), and its state changes come once the worker has read
and held the agent's samples. A worker (`gpulens worker`, allocation with its overview) must
give the late cluster the same rows as a cluster where both published in event-time order, and
the rows the test computes by hand from the records; no state change is dead-lettered or
restamped as late.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from module_platform_fixtures import module_platform_fixtures
from pod_events import T0, at
from test_worker import dead_letters_of
from worker_support import gpulens, spawn, worker_metrics

from gpulens.config import GPULensSettings
from gpulens.platform import free_port
from gpulens.producers.watermarking import progress_mark
from gpulens.schemas.model.ids import event_id
from gpulens.schemas.model.models import (
    ChangeType,
    Event,
    GpuSampleBatch,
    NodeEvent,
    PodEvent,
    Watermark,
)
from gpulens.schemas.model.topics import (
    CLUSTER_ALLOCATION,
    CLUSTER_OVERVIEW,
    GPU_SAMPLES,
    NODES,
    PODS,
    WATERMARKS,
    TopicSpec,
    record_key,
)
from gpulens.schemas.wire.codec import AvroCodec
from gpulens.testing.examples import example_events

WATCHER, AGENT = "k8s-watcher", "node-agent/n1"
WINDOW_S = 60
END_S = 200
TIMEOUT_S = 4
"""The worker's --source-timeout: also how long it waits for a new cluster's sources to speak."""


platform, config_file = module_platform_fixtures()


def node(cluster: str, name: str, second: int, *, ready: bool, change: ChangeType) -> NodeEvent:
    template = example_events(cluster, WATCHER, at=T0)[NODES]
    return template.model_copy(
        update={
            "event_id": event_id(cluster, name, str(second), str(ready)),
            "event_time": at(second),
            "type": change,
            "node": name,
            "ready": ready,
            "schedulable": True,
            "gpu_capacity": {"amd.com/gpu": 8.0},
            "gpu_allocatable": {"amd.com/gpu": 8.0},
        }
    )


def pod(cluster: str, second: int, change: ChangeType) -> PodEvent:
    template = example_events(cluster, WATCHER, at=T0)[PODS]
    return template.model_copy(
        update={
            "event_id": event_id(cluster, "train", str(second), change.value),
            "event_time": at(second),
            "type": change,
            "uid": "train",
            "name": "train",
            "phase": "Running",
            "node": "n1",
            "gpu_amount": 4.0,
            "owners": [],
        }
    )


def samples(cluster: str) -> list[GpuSampleBatch]:
    """n1's GPUs every 10 s, busier each time (the windows' mean utilization tells them apart)."""
    template = example_events(cluster, AGENT, at=T0)[GPU_SAMPLES]
    return [
        template.model_copy(
            update={
                "event_id": event_id(cluster, AGENT, str(second)),
                "event_time": at(second),
                "node": "n1",
                "samples": [s.model_copy(update={"utilization_pct": second / 4}) for s in template.samples],
            }
        )
        for second in range(0, END_S, 10)
    ]


def first_nodes(cluster: str) -> list[NodeEvent]:
    return [node(cluster, name, 0, ready=True, change=ChangeType.ADDED) for name in ("n1", "n2")]


def state_changes(cluster: str) -> list[Event]:
    """A pod holds 4 GPUs of n1 from 10 s to 150 s; n2 is not ready from 70 s to 130 s."""
    return [
        pod(cluster, 10, ChangeType.ADDED),
        node(cluster, "n2", 70, ready=False, change=ChangeType.MODIFIED),
        node(cluster, "n2", 130, ready=True, change=ChangeType.MODIFIED),
        pod(cluster, 150, ChangeType.DELETED),
    ]


def mark(cluster: str, source: str, second: int, *, final: bool = False) -> Watermark:
    watermark = progress_mark(cluster, source, at(second))
    return watermark.model_copy(update={"final": final, "event_id": f"{watermark.event_id}-{final}"})


TOPICS: dict[type, TopicSpec] = {
    NodeEvent: NODES,
    PodEvent: PODS,
    GpuSampleBatch: GPU_SAMPLES,
    Watermark: WATERMARKS,
}


@pytest.fixture
def publish(platform: GPULensSettings, codec: AvroCodec) -> Iterator[Callable[..., None]]:
    producer = Producer(platform.kafka.librdkafka(**{"enable.idempotence": True}))

    def send(*events: Event) -> None:
        """Publish ``events`` in this order, each acknowledged before the next (as one source's are)."""
        for event in events:
            spec = TOPICS[type(event)]
            producer.produce(spec.name, key=record_key(spec, event), value=codec.encode(spec, event))
            assert producer.flush(30) == 0

    yield send


def rows_of(
    platform: GPULensSettings, codec: AvroCodec, cluster: str, spec: TopicSpec, count: int
) -> list[Any]:
    """The first ``count`` committed rows of ``cluster`` on ``spec``, oldest window first."""
    consumer = Consumer(
        platform.kafka.librdkafka(
            **{"group.id": f"rows-{cluster}-{spec.name}", "isolation.level": "read_committed"}
        )
    )
    consumer.assign([TopicPartition(spec.name, p, 0) for p in range(spec.partitions)])
    rows: list[Any] = []
    deadline = time.monotonic() + 60
    try:
        while len(rows) < count:
            assert time.monotonic() < deadline, f"{len(rows)} of {count} {spec.name} rows of {cluster}"
            for message in consumer.consume(1000, 0.5):
                if message.error() is None and message.key() == cluster.encode():
                    rows.append(codec.decode(spec, message.value()))
    finally:
        consumer.close()
    return sorted(rows, key=lambda row: row.window_start)


def wait_for(condition: Callable[[], bool], what: str, *, every: Callable[[], None] = lambda: None) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        every()
        time.sleep(0.3)


def comparable(rows: list[Any]) -> list[dict[str, Any]]:
    return [row.model_dump(exclude={"event_id", "cluster"}) for row in rows]


def test_a_watchers_late_state_changes_count_at_their_own_time(
    platform, codec, config_file, unique, publish, spawned
) -> None:
    group, port = f"live-{unique}", free_port()
    in_order, late = f"in-order-{unique}", f"late-{unique}"
    command = gpulens(
        config_file, "worker", "--window", str(WINDOW_S), "--processors", "allocation", "--no-nodes",
        "--group", group, "--source-timeout", str(TIMEOUT_S), "--metrics-port", str(port),
    )  # fmt: skip
    spawned.append(spawn(command, config_file.parent / f"worker-{group}.log"))
    windows = END_S // WINDOW_S + 1  # the final watermarks close the window holding them

    # both sources in event-time order, each instant's records before the watermarks past them
    records: list[Event] = [*first_nodes(in_order), *state_changes(in_order), *samples(in_order)]
    for second in range(0, END_S, 10):
        publish(*(r for r in records if second <= (r.event_time - T0).total_seconds() < second + 10))
        publish(mark(in_order, WATCHER, second + 10), mark(in_order, AGENT, second + 10))
    publish(mark(in_order, WATCHER, END_S, final=True), mark(in_order, AGENT, END_S, final=True))
    expected_allocation = rows_of(platform, codec, in_order, CLUSTER_ALLOCATION, windows)
    expected_overview = rows_of(platform, codec, in_order, CLUSTER_OVERVIEW, windows)
    read = worker_metrics(port).get("gpulens_worker_records_in_total", 0.0)

    # the late cluster: the watcher's first nodes, then every sample the agent has, vouched for
    publish(*first_nodes(late), mark(late, WATCHER, 1))
    publish(*samples(late), mark(late, AGENT, END_S))

    def both_live() -> None:  # as live sources do: the watcher stuck at 1 s, the agent at its end
        publish(mark(late, WATCHER, 1), mark(late, AGENT, END_S))

    # held: the cluster's time is the watcher's 1 s, so only what lies at 0 s goes to the
    # operators (the two nodes and the first samples), once the worker's start wait is over
    wait_for(
        lambda: worker_metrics(port).get("gpulens_worker_records_in_total", 0.0) >= read + 3,
        "the late cluster's first instant processed",
        every=both_live,
    )
    assert worker_metrics(port)["gpulens_worker_buffered_records"] >= len(samples(late)) - 1
    publish(
        *state_changes(late), mark(late, WATCHER, END_S, final=True), mark(late, AGENT, END_S, final=True)
    )

    allocation = rows_of(platform, codec, late, CLUSTER_ALLOCATION, windows)
    overview = rows_of(platform, codec, late, CLUSTER_OVERVIEW, windows)
    assert comparable(allocation) == comparable(expected_allocation)
    assert comparable(overview) == comparable(expected_overview)
    # by hand, from the records: capacity and GPUs held at each window's end, n2 not ready at 70-130 s
    assert [(r.gpu_capacity, r.gpus_allocated_end) for r in allocation] == [(16, 4), (8, 4), (16, 0), (16, 0)]
    assert [r.nodes_not_ready for r in overview] == [0, 1, 0, 0]
    assert [r.gpu_samples for r in overview[:3]] == [6 * 2, 6 * 2, 6 * 2]  # 2 GPUs every 10 s
    assert overview[0].gpu_utilization_avg == pytest.approx(sum(s / 4 for s in range(0, 60, 10)) / 6)
    assert allocation[0].gpus_allocated_avg == pytest.approx(4 * 50 / 60)
    letters = dead_letters_of(platform, codec, group)
    assert [letter.reason for letter in letters] == [], "nothing dead-lettered, late or otherwise"
    assert worker_metrics(port).get("gpulens_worker_late_state_changes_total", 0.0) == 0
    assert all(r.window_start < T0 + timedelta(seconds=windows * WINDOW_S) for r in allocation)
