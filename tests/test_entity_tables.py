"""`gpulens tables` (faust): the state topics hold what an independent fold of the published
events says, bad records go to the DLQ, a kill -9 loses and repeats nothing, and the HTTP views
answer for one pod, workload and node."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from pod_events import DEPLOYMENT, REPLICASET, T0, at, pod

from gpulens.config import GPULensSettings
from gpulens.pipeline.entity_tables import forwarded_topic
from gpulens.platform import free_port, private_platform
from gpulens.producers.publishing import EventPublisher
from gpulens.schemas.kafka.topic_admin import create_topics
from gpulens.schemas.model.models import (
    ChangeType,
    ContainerEvent,
    DeadLetter,
    DeviceChange,
    DeviceInventory,
    Event,
    NodeEvent,
    OwnerReference,
    PodEvent,
    WorkloadEvent,
    WorkloadState,
    WorkloadStatus,
)
from gpulens.schemas.model.topics import (
    CONTAINERS,
    DEVICE_CHANGELOG,
    DEVICE_INVENTORY,
    DLQ,
    NODES,
    PODS,
    STATE_CONTAINERS,
    STATE_INVENTORY,
    STATE_NODES,
    STATE_PODS,
    STATE_WORKLOADS,
    WORKLOADS,
    TopicSpec,
)
from gpulens.schemas.wire.codec import AvroCodec
from gpulens.testing.examples import example_events

JOB = OwnerReference(kind="Job", api_version="batch/v1", name="train", uid="job-9")
ACTIVE = {"Pending", "Running"}

SESSION_TIMEOUT_S = 6
"""`gpulens tables`' session timeout in its group (broker_session_timeout)."""

Rows = list[tuple[int, int, bytes, bytes | None]]
"""(partition, offset, key, value) of one cluster on one topic."""


# --- events -----------------------------------------------------------------------------------


def node(cluster: str, name: str, second: int, change: ChangeType) -> NodeEvent:
    template = example_events(cluster, at=T0)[NODES]
    assert isinstance(template, NodeEvent)
    return template.model_copy(
        update={"event_id": f"{name}-{second}", "event_time": at(second), "node": name, "type": change}
    )


def inventory(cluster: str, name: str, second: int, firmware: str) -> DeviceInventory:
    template = example_events(cluster, at=T0)[DEVICE_INVENTORY]
    assert isinstance(template, DeviceInventory)
    gpus = [gpu.model_copy(update={"firmware_version": firmware}) for gpu in template.gpus]
    return template.model_copy(
        update={"event_id": f"inv-{name}-{second}", "event_time": at(second), "node": name, "gpus": gpus}
    )


def container(cluster: str, name: str, second: int, change: ChangeType) -> ContainerEvent:
    template = example_events(cluster, at=T0)[CONTAINERS]
    assert isinstance(template, ContainerEvent)
    return template.model_copy(
        update={
            "event_id": f"c-{name}-{second}",
            "event_time": at(second),
            "container_name": name,
            "type": change,
        }
    )


def workload(
    cluster: str, uid: str, second: int, change: ChangeType, status: WorkloadStatus
) -> WorkloadEvent:
    template = example_events(cluster, at=T0)[WORKLOADS]
    assert isinstance(template, WorkloadEvent)
    return template.model_copy(
        update={
            "event_id": f"w-{uid}-{second}",
            "event_time": at(second),
            "uid": uid,
            "name": uid,
            "kind": "Job" if uid == "job-9" else "Deployment",
            "type": change,
            "status": status,
        }
    )


def scenario(cluster: str) -> list[tuple[TopicSpec, Event]]:
    """Every kind of change; a workload event and the pods of that workload may be applied in
    either order (different topics), and the expectation holds for both."""
    chain = [REPLICASET, DEPLOYMENT]
    return [
        (NODES, node(cluster, "node-a", 1, ChangeType.ADDED)),
        (NODES, node(cluster, "node-b", 1, ChangeType.ADDED)),
        (NODES, node(cluster, "node-b", 2, ChangeType.MODIFIED)),
        (NODES, node(cluster, "node-c", 1, ChangeType.ADDED)),
        (NODES, node(cluster, "node-c", 3, ChangeType.DELETED)),
        (DEVICE_INVENTORY, inventory(cluster, "node-a", 1, "MEC 177")),
        (DEVICE_INVENTORY, inventory(cluster, "node-a", 5, "MEC 178")),
        (DEVICE_INVENTORY, inventory(cluster, "node-b", 1, "MEC 177")),
        (CONTAINERS, container(cluster, "main", 1, ChangeType.ADDED)),
        (CONTAINERS, container(cluster, "side", 1, ChangeType.ADDED)),
        (CONTAINERS, container(cluster, "side", 4, ChangeType.DELETED)),
        (WORKLOADS, workload(cluster, "deploy-1", 0, ChangeType.ADDED, WorkloadStatus.RUNNING)),
        (WORKLOADS, workload(cluster, "job-9", 0, ChangeType.ADDED, WorkloadStatus.RUNNING)),
        (WORKLOADS, workload(cluster, "job-9", 9, ChangeType.MODIFIED, WorkloadStatus.FAILED)),
        (WORKLOADS, workload(cluster, "gone-1", 2, ChangeType.ADDED, WorkloadStatus.RUNNING)),
        (WORKLOADS, workload(cluster, "gone-1", 6, ChangeType.DELETED, WorkloadStatus.DELETED)),
        (PODS, pod(cluster, "p1", "Pending", 1, chain)),
        (PODS, pod(cluster, "p1", "Running", 2, chain)),
        (PODS, pod(cluster, "p2", "Running", 2, chain)),
        (PODS, pod(cluster, "p2", "Succeeded", 7, chain)),
        (PODS, pod(cluster, "p3", "Running", 3, chain)),
        (PODS, pod(cluster, "p3", "Running", 8, chain, ChangeType.DELETED)),
        (PODS, pod(cluster, "p4", "Pending", 4, chain)),
        (PODS, pod(cluster, "p5", "Running", 3, [JOB])),
        (PODS, pod(cluster, "p5", "Failed", 8, [JOB])),
    ]


def publish(platform, codec: AvroCodec, events: Iterable[tuple[TopicSpec, Event]]) -> None:
    publisher = EventPublisher(platform.kafka, codec)
    for topic, event in events:
        publisher.publish(topic, event)
    publisher.flush()


# --- the independent expectation ---------------------------------------------------------------


def newest(events: Iterable[Event], key: Callable[[Any], str]) -> dict[str, Any]:
    """The last event per key, None where it was deleted."""
    last: dict[str, Any] = {}
    for event in events:
        last[key(event)] = None if getattr(event, "type", None) == ChangeType.DELETED else event
    return last


def expected_workloads(events: list[Event]) -> dict[str, dict[str, Any] | None]:
    """Per workload uid: the fields of its final state (None: deleted), folded by hand."""
    pods = [e for e in events if isinstance(e, PodEvent)]
    reported = [e for e in events if isinstance(e, WorkloadEvent)]
    final_pods = newest(pods, lambda p: p.uid)
    out: dict[str, dict[str, Any] | None] = {}
    uids = {o.uid for p in pods for o in p.owners} | {w.uid for w in reported}
    for uid in uids:
        mine = [p for p in pods if uid in {o.uid for o in p.owners}]
        told = [w for w in reported if w.uid == uid]
        if told and told[-1].type == ChangeType.DELETED:
            out[uid] = None
            continue
        active = [p for p in (final_pods[p.uid] for p in mine) if p is not None and p.phase in ACTIVE]
        active = list({p.uid: p for p in active}.values())
        times = [e.event_time for e in [*mine, *told]]
        chain = mine[0].owners if mine else []
        depth = [o.uid for o in chain].index(uid) if mine else 0
        if active:
            status = WorkloadStatus.RUNNING
        elif told and told[-1].status == WorkloadStatus.FAILED:
            status = WorkloadStatus.FAILED
        else:
            status = WorkloadStatus.DONE
        out[uid] = {
            "parent_uid": chain[depth + 1].uid if depth + 1 < len(chain) else None,
            "top_uid": chain[-1].uid if chain else uid,
            "gpu_request": sum(p.gpu_amount for p in active),
            "gpus_held": sum(p.gpu_amount for p in active if p.phase == "Running"),
            "active_pods": len(active),
            "status": status,
            "first_seen": min(times),
            "last_seen": max(times),
        }
    return out


# --- reading the topics back --------------------------------------------------------------------


def read(platform, topic: TopicSpec, cluster: str, *, prefix: bytes | None = None) -> Rows:
    """Every committed record of ``cluster`` on ``topic`` (key ``cluster/...``, or ``prefix``...)."""
    return read_topics(platform, [topic], cluster, prefix=prefix)[topic.name]


def read_topics(
    platform, topics: Iterable[TopicSpec], cluster: str, *, prefix: bytes | None = None
) -> dict[str, Rows]:
    """``read`` of several topics by one consumer, by topic name."""
    prefix = prefix or f"{cluster}/".encode()
    consumer = Consumer(
        platform.kafka.librdkafka(
            **{
                "group.id": f"read-{cluster}",
                "enable.partition.eof": True,
                "isolation.level": "read_committed",
            }
        )
    )
    partitions = [TopicPartition(topic.name, p, 0) for topic in topics for p in range(topic.partitions)]
    consumer.assign(partitions)
    ends: set[tuple[str, int]] = set()
    out: dict[str, Rows] = {topic.name: [] for topic in topics}
    deadline = time.monotonic() + 30
    try:
        while len(ends) < len(partitions) and time.monotonic() < deadline:
            for message in consumer.consume(1000, 0.5):
                error = message.error()
                if error is not None and error.code() == KafkaError._PARTITION_EOF:
                    ends.add((message.topic() or "", message.partition()))
                elif error is None and (message.key() or b"").startswith(prefix):
                    out[message.topic() or ""].append(
                        (message.partition(), message.offset(), message.key() or b"", message.value())
                    )
    finally:
        consumer.close()
    return out


def table(rows: Rows) -> dict[bytes, bytes | None]:
    """The newest value per key (None: tombstoned), as a compacted topic's reader ends up with."""
    return {key: value for _, _, key, value in sorted(rows)}


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


# --- the process ----------------------------------------------------------------------------------


class TablesApp:
    """`gpulens tables` as a subprocess, its stores in ``data_dir``."""

    def __init__(self, config_file: Path, spawned: list, group: str, data_dir: Path) -> None:
        self.port = free_port()
        self.command = [sys.executable, "-m", "gpulens", "--config", str(config_file), "tables"]
        self.command += ["--group", group, "--data-dir", str(data_dir), "--web-port", str(self.port)]
        self.log = config_file.parent / f"tables-{group}.log"
        self._spawned = spawned
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=log)
        self._spawned.append(self.process)

    def kill(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def pause(self, seconds: float) -> None:
        """Freeze it for ``seconds`` (SIGSTOP, then SIGCONT), as a long pause of the process
        or a starved CPU would: the fault lasts that long, nothing is waited for."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)
        time.sleep(seconds)
        os.kill(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        """Stop it cleanly: a killed app leaves its transaction open on the shared state topics,
        and read_committed readers of later tests then wait for the broker to time it out."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def get(self, path: str) -> tuple[int, Any]:
        """(HTTP status, JSON body); status 0 while nothing listens."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as err:
            return err.code, None
        except urllib.error.URLError:  # not listening yet
            return 0, None


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GPULensSettings]:
    """A platform of this module's own: faust's transactions on the shared state topics must
    not hold back (last stable offset) the readers of other tests' rows on those topics."""
    with private_platform(tmp_path_factory.mktemp("tables-platform")) as settings:
        create_topics(settings.kafka)
        yield settings


@pytest.fixture(scope="module")
def config_file(platform: GPULensSettings) -> Path:
    return platform.platform.state_dir.parent / "gpulens.toml"


@pytest.fixture
def tables_app(config_file: Path, spawned, tmp_path: Path):
    """Makes `gpulens tables` apps; each is stopped cleanly at the end of the test."""
    apps: list[TablesApp] = []

    def make(group: str) -> TablesApp:
        apps.append(TablesApp(config_file, spawned, group, tmp_path / "stores"))
        return apps[-1]

    yield make
    for app in apps:
        app.stop()


def decode_table(codec: AvroCodec, spec: TopicSpec, rows: Rows) -> dict[bytes, Any]:
    return {key: None if value is None else codec.decode(spec, value) for key, value in table(rows).items()}


def test_state_topics_equal_an_independent_fold_of_the_events(
    platform, codec: AvroCodec, unique: str, tables_app
) -> None:
    cluster = f"tables-{unique}"
    events = scenario(cluster)
    publish(platform, codec, events)
    garbage = Producer(platform.kafka.librdkafka())
    garbage.produce(PODS.name, key=f"{cluster}/garbage".encode(), value=b"\x00\x00\x00\x00\x01not avro")
    garbage.flush()
    app = tables_app(f"t-{unique}")
    app.start()

    plain = [event for _, event in events]
    want_workloads = expected_workloads(plain)
    wait_drained(platform, f"t-{unique}", 120)

    def check_entities(node_events: list[NodeEvent]) -> None:
        cases: list[tuple[TopicSpec, TopicSpec, Callable[[Any], str]]] = [
            (STATE_PODS, PODS, lambda e: e.uid),
            (STATE_NODES, NODES, lambda e: e.node),
            (STATE_CONTAINERS, CONTAINERS, lambda e: e.container_key),
        ]
        for state, source, key in cases:
            want = newest((e for t, e in [*events, *((NODES, n) for n in node_events)] if t is source), key)
            got = decode_table(codec, state, read(platform, state, cluster))
            assert got == {f"{cluster}/{k}".encode(): v for k, v in want.items()}, state.name
        inventories = newest((e for t, e in events if t is DEVICE_INVENTORY), lambda e: e.node)
        gone = {
            n.node
            for n in [*plain, *node_events]
            if isinstance(n, NodeEvent) and n.type == ChangeType.DELETED
        }
        got = decode_table(codec, STATE_INVENTORY, read(platform, STATE_INVENTORY, cluster))
        assert {k: v for k, v in got.items() if v is not None} == {
            f"{cluster}/{k}".encode(): v for k, v in inventories.items() if k not in gone
        }

    check_entities([])

    got = decode_table(codec, STATE_WORKLOADS, read(platform, STATE_WORKLOADS, cluster))
    for uid, want in want_workloads.items():
        state = got[f"{cluster}/{uid}".encode()]
        if want is None:
            assert state is None, f"{uid} tombstoned"
            continue
        assert isinstance(state, WorkloadState)
        assert {name: getattr(state, name) for name in want} == want, uid
    assert got[f"{cluster}/job-9".encode()].status == WorkloadStatus.FAILED
    assert got[f"{cluster}/deploy-1".encode()].status == WorkloadStatus.RUNNING

    changes = [
        codec.decode(DEVICE_CHANGELOG, v or b"") for *_, v in read(platform, DEVICE_CHANGELOG, cluster)
    ]
    assert all(isinstance(c, DeviceChange) for c in changes)
    by_node = Counter((c.node, c.change) for c in changes)
    first = inventory(cluster, "node-a", 1, "x")
    devices = len(first.gpus) + len(first.rdma_devices)
    assert by_node == {
        ("node-a", ChangeType.ADDED): devices,
        ("node-a", ChangeType.MODIFIED): len(first.gpus),
        ("node-b", ChangeType.ADDED): devices,
    }
    assert {tuple(c.changed) for c in changes if c.change == ChangeType.MODIFIED} == {("firmware_version",)}

    letters = [codec.decode(DLQ, v or b"") for *_, v in read_dlq(platform, cluster)]
    assert len(letters) == 1 and isinstance(letters[0], DeadLetter)
    assert letters[0].source_topic == PODS.name and letters[0].reason

    # Live: a node deleted now takes its state and its inventory with it.
    deleted = node(cluster, "node-a", 20, ChangeType.DELETED)
    publish(platform, codec, [(NODES, deleted)])
    wait_drained(platform, f"t-{unique}", 60)
    assert table(read(platform, STATE_INVENTORY, cluster))[f"{cluster}/node-a".encode()] is None
    check_entities([deleted])


def read_dlq(platform, cluster: str) -> Rows:
    """Dead letters are keyed by source topic: find this cluster's by the key they carry."""
    rows = []
    for partition, offset, _key, value in read(platform, DLQ, cluster, prefix=PODS.name.encode()):
        if value is not None and f"{cluster}/".encode() in value:
            rows.append((partition, offset, b"", value))
    return rows


def test_views_answer_for_a_pod_a_workload_with_its_children_and_a_node_with_its_devices(
    platform, codec: AvroCodec, unique: str, tables_app
) -> None:
    cluster = f"tables-views-{unique}"
    events = scenario(cluster)
    publish(platform, codec, events)
    app = tables_app(f"tv-{unique}")
    app.start()
    # Pods sit on several partitions and reach their workloads through the forwarding topic:
    # a view on the way can look final (p2 and p3 also count two active pods), so only the
    # group's offsets say every event is applied.
    wait_drained(platform, f"tv-{unique}", 120)

    status, found = app.get(f"/pods/{cluster}/p1")
    assert status == 200 and (found["uid"], found["phase"]) == ("p1", "Running")
    status, found = app.get(f"/workloads/{cluster}/deploy-1")
    assert found["workload"]["active_pods"] == 2 and found["pods"] == ["p1", "p4"]
    assert [child["uid"] for child in found["children"]] == ["rs-1"]
    assert found["children"][0]["parent_uid"] == "deploy-1"
    status, found = app.get(f"/nodes/{cluster}/node-a")
    assert found["node"]["node"] == "node-a"
    assert [gpu["firmware_version"] for gpu in found["devices"]["gpus"]] == ["MEC 178", "MEC 178"]
    for path in (f"/pods/{cluster}/nope", f"/workloads/{cluster}/nope", f"/nodes/{cluster}/node-c"):
        assert app.get(path)[0] == 404, path


def stream_of_changes(cluster: str, seed: int) -> list[tuple[TopicSpec, Event]]:
    """About 2,000 events: pods of ten deployments and a job living their phases (some
    deleted), nodes changing, containers coming and going, inventories with new firmware."""
    rng = random.Random(seed)
    chains = [
        [
            OwnerReference(kind="ReplicaSet", api_version="apps/v1", name=f"rs-{k}", uid=f"rs-{k}"),
            OwnerReference(kind="Deployment", api_version="apps/v1", name=f"d-{k}", uid=f"d-{k}"),
        ]
        for k in range(10)
    ]
    lives = []
    for n in range(240):
        owners = chains[n % 10] if n % 11 else [JOB]
        end = rng.choice(["Succeeded", "Failed", "Running"])
        life = [
            ("Pending", ChangeType.ADDED),
            ("Running", ChangeType.MODIFIED),
            ("Running", ChangeType.MODIFIED),
        ]
        life.append((end, ChangeType.DELETED if end == "Running" else ChangeType.MODIFIED))
        lives.append(
            [
                pod(cluster, f"p{n}", phase, 10 * step + n % 7, owners, change)
                for step, (phase, change) in enumerate(life)
            ]
        )
    events: list[tuple[TopicSpec, Event]] = []
    for step in range(4):
        events += [(PODS, life[step]) for life in lives]
        events += [
            (NODES, node(cluster, f"n{i}", step, ChangeType.ADDED if step == 0 else ChangeType.MODIFIED))
            for i in range(60)
        ]
        events += [
            (
                CONTAINERS,
                container(
                    cluster,
                    f"c{i}",
                    step,
                    ChangeType.DELETED if step == 3 and i % 3 == 0 else ChangeType.MODIFIED,
                ),
            )
            for i in range(60)
        ]
        events += [
            (DEVICE_INVENTORY, inventory(cluster, f"n{i}", step, f"MEC {170 + step}")) for i in range(30)
        ]
    return events


def feed(platform, codec: AvroCodec, events: list[tuple[TopicSpec, Event]], halfway: threading.Event) -> None:
    """Publish ``events`` as a live source would, about 200 events/s; ``halfway`` is set
    halfway through."""
    publisher = EventPublisher(platform.kafka, codec)
    for n, (topic, event) in enumerate(events, 1):
        publisher.publish(topic, event)
        if n % 20 == 0:
            publisher.flush()
            if n >= len(events) // 2:
                halfway.set()
            time.sleep(0.1)  # the pace of the source, not a wait for the app
    publisher.flush()


def progress(platform, group: str, specs: Iterable[TopicSpec]) -> dict[tuple[str, int], tuple[int, int]]:
    """Per source partition: (offset the group committed, end offset). Asked through the admin
    API: a consumer with the app's group id leaves the group when closed, and noida-db then
    dropped the app's member too (measured: a rebalance every 7 s while this was polled)."""
    tps = [TopicPartition(spec.name, p) for spec in specs for p in range(spec.partitions)]
    admin = AdminClient(platform.kafka.librdkafka())
    request = ConsumerGroupTopicPartitions(group, tps)
    committed = admin.list_consumer_group_offsets([request])[group].result(10).topic_partitions
    reader = Consumer(platform.kafka.librdkafka(**{"group.id": f"progress-{group}"}))
    try:
        return {
            (tp.topic, tp.partition): (
                max(tp.offset, 0),
                reader.get_watermark_offsets(TopicPartition(tp.topic, tp.partition), timeout=10)[1],
            )
            for tp in committed
        }
    finally:
        reader.close()


def wait_drained(platform, group: str, timeout: float) -> None:
    """Until ``group`` has committed every source partition to its end, the forwarding topic
    included: each commit holds the rows of what it consumed, so then every event is applied
    and written (a view or a row count can look final on the way)."""
    sources = [PODS, NODES, DEVICE_INVENTORY, CONTAINERS, WORKLOADS, forwarded_topic(group)]

    def short() -> str:
        try:
            left = {tp: pair for tp, pair in progress(platform, group, sources).items() if pair[0] < pair[1]}
        except KafkaException as err:  # the app has not created its forwarding topic yet
            return f"offsets not read: {err}"
        return f"source partitions short of their end (committed, end): {left}" if left else ""

    deadline = time.monotonic() + timeout
    while (left := short()) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert not left, left


def test_a_kill_9_mid_stream_loses_and_repeats_no_state_row(
    platform, codec: AvroCodec, unique: str, tables_app
) -> None:
    """Frozen past its session timeout, then killed mid-stream and restarted, the app writes
    every state row once and its tables lose nothing (issue 12: noida-db drops a member whose
    heartbeat is late; it re-joins, gets its partitions back and recovers its tables)."""
    cluster = f"tables-kill-{unique}"
    group = f"tk-{unique}"
    events = stream_of_changes(cluster, seed=7)
    half, three_quarters = len(events) // 2, 3 * len(events) // 4
    publish(platform, codec, events[:half])
    app = tables_app(group)
    app.start()

    def committed() -> tuple[int, int]:
        """Pod records the app committed, and pod records published (of every test's cluster)."""
        done_and_end = progress(platform, group, [PODS]).values()
        return sum(done for done, _ in done_and_end), sum(end for _, end in done_and_end)

    wait_until(lambda: committed()[0] == committed()[1], 60, "the first half committed")
    publish(platform, codec, events[half:three_quarters])
    # Frozen past its session timeout with records to do: the broker drops it, it re-joins
    # with the same partitions and recovers its tables while it applies them.
    app.pause(SESSION_TIMEOUT_S + 2)
    # All of it committed after the recovery: in one commit or more (a loaded machine missed
    # the commit overdue at the pause, and one commit after the recovery took everything).
    wait_until(lambda: committed()[0] == committed()[1], 60, "the second quarter committed")
    halfway = threading.Event()
    feeder = threading.Thread(target=feed, args=(platform, codec, events[three_quarters:], halfway))
    feeder.start()
    assert halfway.wait(60)
    app.kill()  # its input still arriving, a transaction open
    feeder.join()
    done, end = committed()
    assert done < end, "killed mid-stream"
    app.start()

    # A restart after kill -9 waits out the dead member and recovers the tables first: 60 s was
    # not enough once, with the whole suite loading the 2 cores (load average 12).
    wait_drained(platform, group, 120)
    # The group's offsets say the app is done; the rows are what is checked.
    written = [STATE_PODS, STATE_NODES, STATE_INVENTORY, STATE_CONTAINERS, STATE_WORKLOADS, DEVICE_CHANGELOG]
    by_name = read_topics(platform, written, cluster)
    rows = {spec: by_name[spec.name] for spec in written}

    def event_ids(spec: TopicSpec) -> Counter[str]:
        return Counter(codec.decode(spec, value).event_id for *_, value in rows[spec] if value is not None)

    cases: list[tuple[TopicSpec, TopicSpec, Callable[[Any], str]]] = [
        (STATE_PODS, PODS, lambda e: e.uid),
        (STATE_NODES, NODES, lambda e: e.node),
        (STATE_CONTAINERS, CONTAINERS, lambda e: e.container_key),
        (STATE_INVENTORY, DEVICE_INVENTORY, lambda e: e.node),
    ]
    for state, source, key in cases:
        published = [e for t, e in events if t is source]
        ids = event_ids(state)
        assert ids == Counter(e.event_id for e in published), (
            f"{state.name}: repeated {sorted(i for i, n in ids.items() if n > 1)}, "
            f"missing {sorted({e.event_id for e in published} - set(ids))}"
        )
        tombstones = sum(value is None for *_, value in rows[state])
        assert tombstones == sum(getattr(e, "type", None) == ChangeType.DELETED for e in published), (
            state.name
        )
        want = newest(published, key)
        assert decode_table(codec, state, rows[state]) == {
            f"{cluster}/{k}".encode(): v for k, v in want.items()
        }, state.name

    assert max(event_ids(STATE_WORKLOADS).values()) == 1, "a workload state row repeated"
    got = decode_table(codec, STATE_WORKLOADS, rows[STATE_WORKLOADS])
    for uid, want in expected_workloads([event for _, event in events]).items():
        state = got[f"{cluster}/{uid}".encode()]
        assert isinstance(state, WorkloadState)
        assert {name: getattr(state, name) for name in want} == want, uid

    changes = event_ids(DEVICE_CHANGELOG)
    first = inventory(cluster, "n0", 0, "x")
    assert max(changes.values()) == 1
    assert sum(changes.values()) == 30 * (len(first.gpus) + len(first.rdma_devices)) + 3 * 30 * len(
        first.gpus
    )
