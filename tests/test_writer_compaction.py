"""Compaction by the writer: on the embedded broker, which never compacts, the worker keeps its
compacted topics at about their live rows, and a reader from the beginning still gets every live
key's newest row, across restarts and a kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from pod_events import DEPLOYMENT, REPLICASET
from pod_events import pod as pod_event
from prometheus_client import REGISTRY
from worker_support import gpulens, spawn

from gpulens.config import GPULensSettings
from gpulens.pipeline.compaction import WriterCompaction
from gpulens.producers.publishing import EventPublisher
from gpulens.schemas.model.models import ChangeType, PodEvent
from gpulens.schemas.model.topics import COMPACTED, FOREVER, PODS, STATE_PODS, TopicSpec
from gpulens.schemas.wire.codec import AvroCodec

Rows = list[tuple[bytes, bytes | None]]


def read_whole(platform: GPULensSettings, topic: str, prefix: bytes = b"") -> Rows:
    """Every committed (key, value) of ``topic`` whose key starts with ``prefix``, from each
    partition's first record kept."""
    reader = Consumer(
        platform.kafka.librdkafka(
            **{"group.id": "whole", "enable.partition.eof": True, "isolation.level": "read_committed"}
        )
    )
    partitions = reader.list_topics(topic, timeout=10).topics[topic].partitions
    reader.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    ends: set[int] = set()
    rows: Rows = []
    deadline = time.monotonic() + 30
    try:
        while len(ends) < len(partitions) and time.monotonic() < deadline:
            for message in reader.consume(1000, 0.5):
                error = message.error()
                if error is not None and error.code() == KafkaError._PARTITION_EOF:
                    ends.add(message.partition() or 0)
                elif error is None and (message.key() or b"").startswith(prefix):
                    rows.append((message.key() or b"", message.value()))
    finally:
        reader.close()
    assert len(ends) == len(partitions), f"{topic} read to its end"
    return rows


def newest(rows: Rows) -> dict[bytes, bytes]:
    """What a reader from the beginning makes of ``rows``: each key's newest value, tombstoned
    keys gone."""
    state: dict[bytes, bytes] = {}
    for key, value in rows:
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    return state


class Writer:
    """A transactional writer of one topic, compacted by :class:`WriterCompaction`."""

    def __init__(self, platform: GPULensSettings, topic: str, unique: str, *, min_rows: int) -> None:
        self.topic = topic
        spec = TopicSpec(topic, PodEvent, "uid", 3, COMPACTED, FOREVER)
        self.compaction = WriterCompaction(platform.kafka, [spec], min_rows=min_rows)
        self.admin = AdminClient(platform.kafka.librdkafka())
        self.producer = Producer(
            platform.kafka.producer(**{"transactional.id": f"w-{unique}-{time.time_ns()}"})
        )
        self.producer.init_transactions(30)
        self.written = 0

    def cycle(self, rows: Rows, *, commit: bool = True) -> None:
        self.producer.begin_transaction()
        for key, value in rows:
            self.producer.produce(self.topic, key=key, value=value)
            self.compaction.wrote(self.topic, key, value)
            self.written += 1
        self.compaction.rewrite(self.producer)
        if not commit:
            self.producer.abort_transaction(30)
            self.compaction.forget()
            return
        self.producer.commit_transaction(30)
        for cut in self.compaction.cut(self.admin):
            cut.result(30)


def create(platform: GPULensSettings, topic: str, policy: str = COMPACTED) -> None:
    admin = AdminClient(platform.kafka.librdkafka())
    config = {"cleanup.policy": policy, "retention.ms": str(FOREVER)}
    admin.create_topics([NewTopic(topic, 3, 1, config=config)])[topic].result(30)


def updates(keys: range, round_: int) -> Rows:
    return [(b"k%d" % k, b"v%d-%d" % (k, round_)) for k in keys]


def test_a_topic_holds_its_live_rows_and_the_changes_since_its_last_rewrite(
    platform: GPULensSettings, unique: str
) -> None:
    topic = f"compacted-{unique}"
    create(platform, topic)
    writer = Writer(platform, topic, unique, min_rows=10)
    expected: dict[bytes, bytes] = {}
    for round_ in range(10):
        rows = updates(range(40), round_)
        if round_ == 9:  # ten keys end
            rows += [(b"k%d" % k, None) for k in range(30, 40)]
        writer.cycle(rows)
        expected = newest([*expected.items(), *rows])

    kept = read_whole(platform, topic)
    assert newest(kept) == expected, "a reader from the beginning gets every live key's newest row"
    assert writer.written == 410
    rewrites = REGISTRY.get_sample_value("gpulens_worker_compaction_rewrites_total", {"topic": topic})
    rewritten = REGISTRY.get_sample_value("gpulens_worker_compaction_rewritten_rows_total", {"topic": topic})
    assert (rewrites, rewritten) == (10, 9 * 40 + 30), "each round outnumbered the live rows: rewritten"
    assert len(kept) < len(expected) + max(len(expected), 10), (
        f"{len(kept)} records kept of {writer.written} written for {len(expected)} live keys"
    )


def test_a_restart_learns_the_live_rows_from_the_topic_itself(platform: GPULensSettings, unique: str) -> None:
    topic = f"compacted-{unique}"
    create(platform, topic)
    first = Writer(platform, topic, unique, min_rows=1_000)  # no rewrite before the restart
    first.cycle([*updates(range(30), 0), *updates(range(30), 1), (b"k29", None)])
    expected = newest(updates(range(29), 1))

    restarted = Writer(platform, topic, unique, min_rows=10)
    assert restarted.compaction.restore() == 29
    later = updates(range(10), 2)  # k10..k28 are written only before the restart
    restarted.cycle(later)
    restarted.cycle(later)
    expected.update(newest(later))

    kept = read_whole(platform, topic)
    assert newest(kept) == expected, "the rewrite carried the rows restored"
    assert len(kept) < 29 + 29, f"cut behind the rewrite: {len(kept)} records kept"


def test_a_topic_created_compact_only_is_made_cuttable_at_restore(
    platform: GPULensSettings, unique: str
) -> None:
    topic = f"compacted-{unique}"
    create(platform, topic, policy="compact")
    writer = Writer(platform, topic, unique, min_rows=5)
    writer.compaction.restore()
    admin = AdminClient(platform.kafka.librdkafka())
    (described,) = admin.describe_configs([ConfigResource("topic", topic)]).values()
    config = described.result(30)
    assert (config["cleanup.policy"].value, config["retention.ms"].value) == ("compact,delete", "-1")

    for round_ in range(3):
        writer.cycle(updates(range(5), round_))
    kept = read_whole(platform, topic)
    assert newest(kept) == newest(updates(range(5), 2))
    assert len(kept) < 15, "the broker took the cuts"


def test_a_rewrite_aborted_with_its_transaction_cuts_nothing(platform: GPULensSettings, unique: str) -> None:
    topic = f"compacted-{unique}"
    create(platform, topic)
    writer = Writer(platform, topic, unique, min_rows=5)
    writer.cycle(updates(range(5), 0))  # 5 rows written: a rewrite at once, nothing before it to cut
    writer.cycle(updates(range(5), 1), commit=False)
    assert writer.compaction.cut(writer.admin) == [], "no cut behind an aborted rewrite"
    assert newest(read_whole(platform, topic)) == newest(updates(range(5), 0))


# --- through the worker process -------------------------------------------------------------------


def pod(
    cluster: str, uid: str, phase: str, second: int, change: ChangeType = ChangeType.MODIFIED
) -> PodEvent:
    return pod_event(cluster, uid, phase, second, [REPLICASET, DEPLOYMENT], change)


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_the_worker_compacts_its_state_topics_across_a_kill_9(
    own_platform, own_codec: AvroCodec, unique: str, spawned
) -> None:
    """Every pod's newest state survives a kill -9 and the restart's rewrite and cut, while the
    pods topic holds about its live rows instead of every change. On a platform of its own: its
    state topics hold only this test's rows."""
    platform, config_file = own_platform
    cluster = f"compact-{unique}"
    command = gpulens(config_file, "worker", "--processors", "state", "--group", f"c-{unique}")
    command += ["--idle-ms", "300", "--compaction-min-rows", "20"]

    def start() -> subprocess.Popen[bytes]:
        process = spawn(command, config_file.parent / f"worker-c-{unique}.log")
        spawned.append(process)
        return process

    publisher = EventPublisher(platform.kafka, own_codec)
    published: list[PodEvent] = []

    def publish(events: list[PodEvent]) -> None:
        for event in events:
            publisher.publish(PODS, event)
        publisher.flush()
        published.extend(events)

    def expected() -> dict[bytes, PodEvent]:
        """Each pod's newest state from what was published: its newest event, gone once deleted."""
        last = {f"{cluster}/{e.uid}".encode(): e for e in published}
        return {key: e for key, e in last.items() if e.type != ChangeType.DELETED}

    def kept() -> dict[bytes, PodEvent]:
        rows = read_whole(platform, STATE_PODS.name, f"{cluster}/".encode())
        return {key: own_codec.decode(STATE_PODS, value, PodEvent) for key, value in newest(rows).items()}

    second = iter(range(1, 10_000))
    phases = ("Pending", "Running")
    publish([pod(cluster, f"p{i}", phases[r % 2], next(second)) for r in range(6) for i in range(30)])
    worker = start()
    wait_until(lambda: kept() == expected(), "the worker's first 180 pod changes")
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait()

    start()
    # only p0..p9 change after the restart: p10..p29 live on in what the restart restored
    publish([pod(cluster, f"p{i}", "Running", next(second)) for _ in range(4) for i in range(10)])
    publish([pod(cluster, "p0", "Running", next(second), ChangeType.DELETED)])
    wait_until(lambda: kept() == expected(), "the pods changed after the restart")
    live = len(expected())
    assert live == 29
    wait_until(
        lambda: len(read_whole(platform, STATE_PODS.name)) < live + max(live, 20),
        "the pods topic to be cut behind a rewrite",
    )
    assert kept() == expected(), "every live pod's newest state, p10..p29 from before the kill"
