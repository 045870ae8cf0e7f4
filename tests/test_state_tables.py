"""State tables: the newest state of every entity on compacted topics, tombstones for the gone,
workloads counted from their pods, and nothing published twice across a worker's kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from pod_events import DEPLOYMENT, REPLICASET, T0
from pod_events import pod as pod_event

from gpulens.pipeline.state_tables import StateTables, Tombstone
from gpulens.producers.publishing import EventPublisher
from gpulens.schemas.model.models import (
    ChangeType,
    NodeEvent,
    PodEvent,
    WorkloadEvent,
    WorkloadState,
    WorkloadStatus,
)
from gpulens.schemas.model.topics import (
    NODES,
    PODS,
    STATE_INVENTORY,
    STATE_NODES,
    STATE_PODS,
    STATE_WORKLOADS,
    WORKLOADS,
    TopicSpec,
)
from gpulens.schemas.wire.codec import AvroCodec
from gpulens.testing.examples import example_events


def pod(
    cluster: str, uid: str, phase: str, second: int, change: ChangeType = ChangeType.MODIFIED
) -> PodEvent:
    return pod_event(cluster, uid, phase, second, [REPLICASET, DEPLOYMENT], change)


def workloads_of(rows) -> dict[str, WorkloadState]:
    return {r.uid: r for r in rows if isinstance(r, WorkloadState)}


def test_a_pod_counts_toward_every_owner_in_its_chain() -> None:
    rows = StateTables().process(pod("c", "p1", "Running", 1))
    states = workloads_of(rows)
    assert set(states) == {"rs-1", "deploy-1"}
    for state in states.values():
        assert (state.active_pods, state.gpus_held, state.gpu_request) == (1, 2.0, 2.0)
        assert state.status == WorkloadStatus.RUNNING
        assert state.top_uid == "deploy-1"
    assert states["rs-1"].parent_uid == "deploy-1"
    assert states["deploy-1"].parent_uid is None


def test_a_pending_pod_asks_for_gpus_but_holds_none() -> None:
    states = workloads_of(StateTables().process(pod("c", "p1", "Pending", 1)))
    assert (states["deploy-1"].gpu_request, states["deploy-1"].gpus_held) == (2.0, 0.0)


def test_a_workload_whose_pods_finished_is_done() -> None:
    tables = StateTables()
    tables.process(pod("c", "p1", "Running", 1))
    tables.process(pod("c", "p2", "Running", 2))
    done = workloads_of(tables.process(pod("c", "p1", "Succeeded", 3)))
    assert done["deploy-1"].active_pods == 1 and done["deploy-1"].status == WorkloadStatus.RUNNING
    done = workloads_of(tables.process(pod("c", "p2", "Succeeded", 4)))
    assert done["deploy-1"].active_pods == 0 and done["deploy-1"].status == WorkloadStatus.DONE
    assert done["deploy-1"].first_seen == T0 + timedelta(seconds=1)
    assert done["deploy-1"].last_seen == T0 + timedelta(seconds=4)


def test_a_deleted_workload_is_published_as_deleted_then_tombstoned() -> None:
    tables = StateTables()
    tables.process(pod("c", "p1", "Running", 1))
    template = example_events("c", at=T0)[WORKLOADS]
    assert isinstance(template, WorkloadEvent)
    gone = template.model_copy(
        update={"uid": "deploy-1", "type": ChangeType.DELETED, "event_time": T0 + timedelta(seconds=9)}
    )
    rows = tables.process(gone)
    assert isinstance(rows[0], WorkloadState) and rows[0].status == WorkloadStatus.DELETED
    assert rows[1] == Tombstone(STATE_WORKLOADS, b"c/deploy-1")


def test_a_deleted_pod_is_followed_by_its_tombstone() -> None:
    deleted = pod("c", "p1", "Running", 5, ChangeType.DELETED)
    rows = StateTables().process(deleted)
    assert rows[:2] == [deleted, Tombstone(STATE_PODS, b"c/p1")]
    assert workloads_of(rows)["deploy-1"].active_pods == 0


def test_a_pod_without_owners_is_a_workload_of_its_own() -> None:
    bare = pod("c", "p1", "Running", 1).model_copy(update={"owners": []})
    states = workloads_of(StateTables().process(bare))
    assert set(states) == {"p1"}
    state = states["p1"]
    assert (state.kind, state.name, state.top_uid, state.parent_uid) == ("Pod", "p1", "p1", None)
    assert (state.active_pods, state.gpus_held, state.status) == (1, 2.0, WorkloadStatus.RUNNING)


def test_a_bare_pods_workload_is_tombstoned_with_the_pod() -> None:
    tables = StateTables()
    tables.process(pod("c", "p1", "Running", 1).model_copy(update={"owners": []}))
    rows = tables.process(pod("c", "p1", "Running", 5, ChangeType.DELETED).model_copy(update={"owners": []}))
    assert workloads_of(rows)["p1"].status == WorkloadStatus.DELETED
    assert rows[-1] == Tombstone(STATE_WORKLOADS, b"c/p1")
    assert list(tables.live()) == [], "nothing is kept of a workload that is gone"


def test_a_deleted_node_takes_its_inventory_with_it() -> None:
    node = example_events("c", at=T0)[NODES]
    assert isinstance(node, NodeEvent)
    gone = node.model_copy(update={"type": ChangeType.DELETED})
    assert StateTables().process(gone)[1:] == [
        Tombstone(STATE_NODES, f"c/{node.node}".encode()),
        Tombstone(STATE_INVENTORY, f"c/{node.node}".encode()),
    ]


# --- through the worker process ---------------------------------------------------------------


def read_state(platform, topic: TopicSpec, cluster: str) -> list[tuple[bytes, bytes | None]]:
    """Every (key, value) of ``cluster`` on ``topic``, in offset order per partition."""
    consumer = Consumer(
        platform.kafka.librdkafka(**{"group.id": f"read-{cluster}", "enable.partition.eof": True})
    )
    consumer.assign([TopicPartition(topic.name, p, 0) for p in range(topic.partitions)])
    ends, out = set(), []
    deadline = time.monotonic() + 20
    try:
        while len(ends) < topic.partitions and time.monotonic() < deadline:
            for message in consumer.consume(1000, 0.5):
                error = message.error()
                if error is not None and error.code() == KafkaError._PARTITION_EOF:
                    ends.add(message.partition())
                elif error is None and (message.key() or b"").startswith(f"{cluster}/".encode()):
                    out.append((message.key() or b"", message.value()))
    finally:
        consumer.close()
    return out


def wait_for_count(platform, topic: TopicSpec, cluster: str, count: int, timeout: float = 90) -> list:
    deadline = time.monotonic() + timeout
    while True:
        rows = read_state(platform, topic, cluster)
        if len(rows) >= count or time.monotonic() > deadline:
            return rows
        time.sleep(0.5)


def pod_ends(platform) -> list[TopicPartition]:
    """The end offset of every partition of the pods topic now."""
    probe = Consumer(platform.kafka.librdkafka(**{"group.id": "probe"}))
    try:
        return [
            TopicPartition(PODS.name, p, probe.get_watermark_offsets(TopicPartition(PODS.name, p), 10)[1])
            for p in range(PODS.partitions)
        ]
    finally:
        probe.close()


@pytest.mark.parametrize(
    "offsets_lost", [False, True], ids=["offsets-committed", "offset-commit-not-visible-at-restart"]
)
def test_state_topics_hold_every_change_once_across_a_kill_and_restart(
    own_platform, own_codec: AvroCodec, unique: str, spawned, offsets_lost: bool
) -> None:
    """With ``offsets_lost`` the group's pod offsets are put back to before the test's records,
    as if the killed worker's last offset commit were not visible yet when it restarted: the
    restarted worker processes them again and must recognise their rows as published. On a
    platform of its own: the worker and the state reads see only this test's records, not the
    session's."""
    platform, config_file = own_platform
    codec = own_codec
    cluster = f"state-{unique}"
    command = [sys.executable, "-m", "gpulens", "--config", str(config_file), "worker"]
    command += ["--processors", "state", "--group", f"s-{unique}", "--idle-ms", "300"]

    def start() -> subprocess.Popen[bytes]:
        with (config_file.parent / f"worker-s-{unique}.log").open("ab") as log:
            process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
        spawned.append(process)
        return process

    publisher = EventPublisher(platform.kafka, codec)
    before = pod_ends(platform)
    first = [
        pod(cluster, "p1", "Pending", 1),
        pod(cluster, "p1", "Running", 2),
        pod(cluster, "p2", "Running", 3),
    ]
    for event in first:
        publisher.publish(PODS, event)
    publisher.flush()
    worker = start()
    assert len(wait_for_count(platform, STATE_PODS, cluster, 3)) == 3, "the worker published the pods"
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait()
    if offsets_lost:
        rewind = Consumer(platform.kafka.librdkafka(**{"group.id": f"s-{unique}"}))
        rewind.commit(offsets=before, asynchronous=False)
        rewind.close()

    start()
    publisher.publish(PODS, pod(cluster, "p2", "Running", 4, ChangeType.DELETED))
    publisher.flush()
    pods = wait_for_count(platform, STATE_PODS, cluster, 5)
    pods = wait_for_count(platform, STATE_PODS, cluster, 6, timeout=3)  # one more would be a repeat
    per_pod: dict[bytes, list[bool]] = {}
    for key, value in pods:
        per_pod.setdefault(key, []).append(value is None)
    assert per_pod == {
        f"{cluster}/p1".encode(): [False, False],
        f"{cluster}/p2".encode(): [False, False, True],
    }, "every change once, in order per pod, the deleted pod tombstoned"
    newest = {key: value for key, value in pods}
    p1 = codec.decode(STATE_PODS, newest[f"{cluster}/p1".encode()] or b"")
    assert (p1.phase, p1.event_time) == ("Running", T0 + timedelta(seconds=2))

    workloads = [
        codec.decode(STATE_WORKLOADS, v or b"") for _, v in read_state(platform, STATE_WORKLOADS, cluster)
    ]
    deployment = [w for w in workloads if w.uid == "deploy-1"]
    assert [w.active_pods for w in deployment] == [1, 1, 2, 1], "one state per pod change, none repeated"
