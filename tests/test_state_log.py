"""A state log against the real broker: a restore reads from the newest complete snapshot on,
and the broker keeps nothing older than the newest committed one.

A writer without transactions (the exporter) can be killed in the middle of a snapshot; the
restore must then start at the snapshot before and still see every key's newest value. A
transactional writer (the worker) cuts the log once a snapshot's transaction committed, never
at one whose transaction was aborted. The worker writes a cycle's entries packed in batch
records; a log written before, one record per key, restores with them in log order.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from sink_support import wait_for

from gpulens.pipeline.alerting import AlertDetector, AlertRules
from gpulens.pipeline.checkpointing import Checkpoint, Stateful, decode_key, encode_key, pack, unpack
from gpulens.producers.simulate import ClusterSimulation, SimulationSpec
from gpulens.schemas.kafka.state_log import BATCH, FIRST_SPAN, SNAPSHOT_MARKER, StateLog


def test_a_snapshot_cut_short_is_passed_over_and_every_newest_value_comes_back(platform, unique) -> None:
    log = StateLog(platform.kafka, f"test.state-log.{unique}", min_between=1)
    log.create()
    producer = Producer(platform.kafka.librdkafka(**{"enable.idempotence": True}))
    live: dict[bytes, bytes] = {}

    def write(entries: dict[bytes, bytes | None]) -> None:
        log.append(producer, entries.items())
        for key, value in entries.items():
            if value is None:
                live.pop(key, None)
            else:
                live[key] = value

    history = 0
    for round_ in range(200):  # 200 rounds over 100 keys: 20,000 records of history
        write({f"k{i}".encode(): f"{round_}".encode() for i in range(100)})
        history += 100
    log.snapshot(producer, lambda: list(live.items()), len(live))  # complete: 102 records
    write({b"k1": b"after", b"k2": None})
    # a snapshot cut short: its marker and 10 of its 99 entries, then the writer is gone
    producer.produce(log.topic, key=SNAPSHOT_MARKER, value=str(len(live)).encode())
    for key, value in list(live.items())[:10]:
        producer.produce(log.topic, key=key, value=value)
    write({b"k3": b"restarted", b"new": b"1"})  # the next incarnation writes on
    assert producer.flush(30) == 0

    restored = StateLog(platform.kafka, log.topic).restore()
    assert restored.entries == live
    assert restored.records_read <= FIRST_SPAN < history, "read from near the snapshot, not the history"


def committed_records(kafka, topic: str) -> Iterator[Message]:
    """The committed records of ``topic``, from its low watermark to its end."""
    reader = Consumer(
        kafka.librdkafka(
            **{
                "group.id": f"{topic}-reader",
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
            }
        )
    )
    try:
        reader.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        while True:
            message = reader.poll(10)
            assert message is not None, f"{topic}: no end of partition within 10 s"
            if message.error() is not None:
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                return
            yield message
    finally:
        reader.close()


def _snapshot_markers(kafka, topic: str) -> list[int]:
    """Offsets of the committed snapshot markers on ``topic``."""
    records = committed_records(kafka, topic)
    return [message.offset() for message in records if message.key() == SNAPSHOT_MARKER]


def _low_watermark(kafka, topic: str) -> int:
    reader = Consumer(kafka.librdkafka(**{"group.id": f"{topic}-low"}))
    try:
        return reader.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[0]
    finally:
        reader.close()


class _TransactionalWriter:
    """A transactional producer writing cycles to one state log, and the live entries it committed."""

    def __init__(self, kafka, log: StateLog, transactional_id: str) -> None:
        self.log, self.committed = log, {}
        self._producer = Producer(kafka.librdkafka(**{"transactional.id": transactional_id}))
        self._producer.init_transactions(30)

    def cycle(self, entries: dict[bytes, bytes | None], *, snapshot: bool, commit: bool = True) -> None:
        live = {**self.committed, **entries}
        live = {k: v for k, v in live.items() if v is not None}
        self._producer.begin_transaction()
        self.log.append(self._producer, entries.items())
        if snapshot:
            self.log.snapshot(self._producer, lambda: list(live.items()), len(live))
        if commit:
            self._producer.commit_transaction(30)
            self.committed = live
        else:
            self._producer.abort_transaction(30)
            self.log.forget_snapshot()


def test_a_committed_snapshot_cuts_the_log_before_it_and_the_restore_sees_every_live_value(
    platform, unique
) -> None:
    log = StateLog(platform.kafka, f"test.state-log-cut.{unique}", min_between=1)
    log.create()
    writer, admin = (
        _TransactionalWriter(platform.kafka, log, f"cut-{unique}"),
        AdminClient(platform.kafka.librdkafka()),
    )
    for round_ in range(50):  # 50 cycles over 100 keys: 5,000 records of history
        writer.cycle({f"k{i}".encode(): f"{round_}".encode() for i in range(100)}, snapshot=False)
    writer.cycle({b"k0": None, b"k1": b"last"}, snapshot=True)
    writer.cycle({b"k2": b"after"}, snapshot=False)
    future = log.cut(admin)
    assert future is not None, "a committed snapshot is there to cut at"
    future.result(30)
    (marker,) = _snapshot_markers(platform.kafka, log.topic)
    assert marker > 5_000 and _low_watermark(platform.kafka, log.topic) == marker
    assert StateLog(platform.kafka, log.topic).restore().entries == writer.committed


def test_a_restore_counts_only_what_was_written_after_its_snapshot_towards_the_next(platform, unique) -> None:
    """A restored log whose snapshot is recent writes no new one at its first commit; one with
    no snapshot and more changes than live keys does."""
    snapshotted = StateLog(platform.kafka, f"test.state-log-due.{unique}", min_between=10)
    snapshotted.create()
    writer = _TransactionalWriter(platform.kafka, snapshotted, f"due-{unique}")
    writer.cycle({f"k{i}".encode(): b"1" for i in range(100)}, snapshot=True)
    writer.cycle({f"k{i}".encode(): b"2" for i in range(20)}, snapshot=False)
    restored = StateLog(platform.kafka, snapshotted.topic, min_between=10)
    assert len(restored.restore().entries) == 100
    assert not restored.snapshot_due(100), "20 changes since a snapshot of 100 keys"

    unsnapshotted = StateLog(platform.kafka, f"test.state-log-undue.{unique}", min_between=10)
    unsnapshotted.create()
    writer = _TransactionalWriter(platform.kafka, unsnapshotted, f"undue-{unique}")
    for round_ in range(3):
        writer.cycle({f"k{i}".encode(): str(round_).encode() for i in range(100)}, snapshot=False)
    restored = StateLog(platform.kafka, unsnapshotted.topic, min_between=10)
    assert len(restored.restore().entries) == 100
    assert restored.snapshot_due(100), "300 changes and no snapshot of 100 keys"


def test_a_snapshot_aborted_with_its_transaction_is_never_cut_to(platform, unique) -> None:
    log = StateLog(platform.kafka, f"test.state-log-abort.{unique}", min_between=1)
    log.create()
    writer, admin = (
        _TransactionalWriter(platform.kafka, log, f"abort-{unique}"),
        AdminClient(platform.kafka.librdkafka()),
    )
    writer.cycle({f"k{i}".encode(): b"first" for i in range(10)}, snapshot=True)
    log.cut(admin).result(30)
    writer.cycle({b"k1": b"aborted", b"k2": None}, snapshot=True, commit=False)
    assert log.cut(admin) is None, "nothing committed to cut at"
    (marker,) = _snapshot_markers(platform.kafka, log.topic)
    assert _low_watermark(platform.kafka, log.topic) == marker, "the committed snapshot is still whole"
    assert StateLog(platform.kafka, log.topic).restore().entries == writer.committed


def test_a_log_of_plain_records_restores_with_the_batches_written_after_it_in_log_order(
    platform, unique
) -> None:
    """A worker upgraded over a checkpoint of the format before batches (one record per key,
    JSON key and value) goes on from it: later batches override and delete its keys, a plain
    record after a batch overrides that batch, and a packed snapshot restores the same."""
    log = StateLog(platform.kafka, f"test.state-log-packed.{unique}", min_between=1)
    log.create()
    producer = Producer(platform.kafka.librdkafka(**{"enable.idempotence": True}))
    live: dict[tuple, object] = {}

    def written(values: dict[tuple, object]) -> None:
        for key, value in values.items():
            if value is None:
                live.pop(key, None)
            else:
                live[key] = value

    def plain(key: tuple, value: object) -> None:
        encoded = None if value is None else json.dumps(value).encode()
        log.append(producer, [(encode_key(key), encoded)])
        written({key: value})

    def packed(values: dict[tuple, object]) -> None:
        log.append_packed(producer, pack(list(values.items())))
        written(values)

    for i in range(300):  # the old format
        plain(("run", "c", f"gpu-{i}"), [i, False])
    plain(("cluster", "c"), 1_000)
    packed({("run", "c", "gpu-1"): [5, True], ("run", "c", "gpu-2"): None, ("cluster", "c"): 2_000})
    plain(("run", "c", "gpu-1"), [6, False])  # a plain record after a batch wins
    packed({("run", "c", f"gpu-{i}"): [i, True] for i in range(100, 9_000)})  # several batch records
    assert producer.flush(30) == 0

    def restored() -> dict[tuple, object]:
        entries = StateLog(platform.kafka, log.topic).restore(unpack=unpack).entries
        return {
            tuple(json.loads(raw)): json.loads(value) if isinstance(value, bytes) else value
            for raw, value in entries.items()
        }

    assert restored() == live and live[("cluster", "c")] == 2_000 and ("run", "c", "gpu-2") not in live
    assert live[("run", "c", "gpu-1")] == [6, False]
    log.snapshot_packed(producer, lambda: pack(list(live.items())), len(live))
    packed({("run", "c", "gpu-3"): None})
    assert producer.flush(30) == 0
    assert restored() == live


class _Part:
    """A worker part whose state is counters by key."""

    def __init__(self, values: dict[tuple[str, str], int]) -> None:
        self.values = values
        self._changed: set[tuple[str, str]] = set()

    def changed(self) -> set[tuple[str, str]]:
        changed, self._changed = self._changed, set()
        return changed

    def live(self) -> list[tuple[str, str]]:
        return list(self.values)

    def dump(self, key: tuple[str, str]) -> int | None:
        return self.values.get(key)

    def load(self, key: tuple[str, ...], value: int) -> None:
        self.values[(key[0], key[1])] = value


class _Counters(_Part):
    """A worker part of ``n`` keys, every one of which changes at every cycle."""

    def __init__(self, n: int) -> None:
        super().__init__({("count", f"k{i}"): 0 for i in range(n)})

    def bump(self) -> None:
        self.values = {key: value + 1 for key, value in self.values.items()}
        self._changed = set(self.values)


def _entries(kafka, topic: str) -> int:
    """Entries on ``topic``, batches unpacked, snapshot markers left out."""
    return sum(
        sum(1 for _ in unpack(message.value())) if message.key().startswith(BATCH) else 1
        for message in committed_records(kafka, topic)
        if not message.key().startswith(SNAPSHOT_MARKER)
    )


def _checkpoint(
    kafka, group: str, part: Stateful, transactional_id: str, name: str = "counters"
) -> Checkpoint:
    producer = Producer(kafka.producer(**{"transactional.id": transactional_id}))
    producer.init_transactions(30)
    consumer = Consumer(kafka.librdkafka(**{"group.id": group}))
    return Checkpoint(kafka, producer, consumer, group_id=group, parts={name: part})


def test_a_cycle_that_changes_every_live_key_writes_each_once_as_the_snapshot(platform, unique) -> None:
    """Where every key changes at every cycle (the per-workload usage at 100,000 GPUs), a due
    snapshot holds the cycle's changes: written in their place, not after them."""
    group = f"every-key-{unique}"
    topic = f"gpulens.worker.{group}.counters.changelog"
    # compact only: the broker refuses the cuts, so the whole log stays to be counted
    admin = AdminClient(platform.kafka.librdkafka())
    admin.create_topics([NewTopic(topic, 1, 1, config={"cleanup.policy": "compact"})])[topic].result(30)
    part = _Counters(12_000)
    checkpoint = _checkpoint(platform.kafka, group, part, f"{group}-writer")
    for _ in range(3):
        checkpoint.begin()
        part.bump()
        checkpoint.commit([])
    assert _entries(platform.kafka, topic) == 3 * 12_000, "each cycle: its 12,000 keys, once"
    restored = _Counters(0)
    assert _checkpoint(platform.kafka, group, restored, f"{group}-restorer").restore() == 12_000
    assert restored.values == part.values


class _Fleet(_Part):
    """A worker part with cold keys (``holder``: seldom changed) and hot ones (``usage``: changed
    at every cycle), all in one state log, as every part was before hot kinds were split off."""

    def __init__(self, cold: int, hot: int) -> None:
        super().__init__({("holder", f"c{i}"): 0 for i in range(cold)})
        self.values.update({("usage", f"h{i}"): 0 for i in range(hot)})
        self._changed = set(self.values)

    def bump(self, kind: str) -> None:
        for key in self.values:
            if key[0] == kind:
                self.values[key] += 1
                self._changed.add(key)

    def set(self, key: tuple[str, str], value: int | None) -> None:
        if value is None:
            self.values.pop(key, None)
        else:
            self.values[key] = value
        self._changed.add(key)


class _SplitFleet(_Fleet):
    """The same part, its ``usage`` keys checkpointed in a log of their own."""

    hot_kinds = frozenset({"usage"})


def _restored(kafka, group: str, part: _Fleet) -> dict[tuple[str, str], int]:
    """What a fresh checkpoint of ``group`` restores into ``part`` (empty)."""
    _checkpoint(kafka, group, part, f"{group}-restorer-{time.monotonic_ns()}").restore()
    return part.values


def test_hot_kinds_get_a_log_of_their_own_and_their_snapshots_leave_the_cold_keys_unwritten(
    platform, unique
) -> None:
    group = f"split-{unique}"
    cold_topic = f"gpulens.worker.{group}.counters.changelog"
    hot_topic = f"gpulens.worker.{group}.counters.hot.changelog"
    admin = AdminClient(platform.kafka.librdkafka())
    for topic in (cold_topic, hot_topic):  # compact only: the cuts are refused, every entry stays counted
        admin.create_topics([NewTopic(topic, 1, 1, config={"cleanup.policy": "compact"})])[topic].result(30)
    part = _SplitFleet(cold=12_000, hot=12_000)
    checkpoint = _checkpoint(platform.kafka, group, part, f"{group}-writer")
    for cycle in range(4):
        checkpoint.begin()
        if cycle:
            part.bump("usage")
        checkpoint.commit([])
    assert _entries(platform.kafka, cold_topic) == 12_000, "the cold keys, once: no snapshot rewrote them"
    assert _entries(platform.kafka, hot_topic) == 4 * 12_000, "each cycle: the 12,000 hot keys, once"
    assert _restored(platform.kafka, group, _SplitFleet(0, 0)) == part.values


def test_a_log_written_before_the_split_restores_whole_and_hands_its_hot_keys_to_the_hot_log(
    platform, unique
) -> None:
    """A cold log written before holds hot keys. They stand until the hot log has a snapshot
    (the first commit writes one), and then give way to it: a hot key deleted since stays
    deleted, one never changed since stays, even once a cold snapshot cut them from the cold log."""
    group = f"upgrade-{unique}"
    before = _Fleet(cold=10_000, hot=100)
    old = _checkpoint(platform.kafka, group, before, f"{group}-old")
    old.begin()
    old.commit([])  # a snapshot of all 10,100 keys, in one log

    after = _SplitFleet(0, 0)
    new = _checkpoint(platform.kafka, group, after, f"{group}-new")
    assert new.restore() == 10_100 and after.values == before.values
    new.begin()
    after.set(("usage", "h0"), 7)
    after.set(("usage", "h1"), None)
    new.commit([])
    hot_topic = f"gpulens.worker.{group}.counters.hot.changelog"
    assert _entries(platform.kafka, hot_topic) == 99, "a snapshot of every live hot key, not 2 changes"
    assert _restored(platform.kafka, group, _SplitFleet(0, 0)) == after.values  # h1 stays deleted

    cold_topic = f"gpulens.worker.{group}.counters.changelog"
    new.begin()
    after.bump("holder")  # 10,000 changes: the cold log's snapshot, of its cold keys only
    new.commit([])
    wait_for(lambda: _low_watermark(platform.kafka, cold_topic) > 0, 30, "the cold log cut at its snapshot")
    assert all(key[0] == "holder" for key in _restored(platform.kafka, group, _Fleet(0, 0)))
    assert _restored(platform.kafka, group, _SplitFleet(0, 0)) == after.values  # h2..h99 unchanged since


def _fed_alerts(nodes: int) -> AlertDetector:
    """The alerts' state after a simulated fleet's start: pods on every node, each node's GPU
    names, containers and GPU list spelling out the same GPU UUIDs."""
    spec = SimulationSpec(
        nodes=nodes, gpus_per_node=8, interval_s=10.0, start=datetime(2026, 1, 1, tzinfo=UTC),
        duration_s=20.0, cluster="grouped", seed=3,
    )  # fmt: skip
    detector = AlertDetector(AlertRules())
    for _, event in ClusterSimulation(spec).events():
        detector.process(event)
    return detector


def _node_of(key: tuple) -> str | None:
    """The node an alerts key names (the kinds spelling out GPU ids), else None."""
    if key[0] == "holders":
        return key[3]
    return key[2] if key[0] in ("gpus", "node") else None


def test_a_snapshot_lists_each_nodes_entries_together_and_restores_the_same_state(platform, unique) -> None:
    """A node's GPU names, its containers' GPUs and its GPU list repeat the same UUIDs: listed
    together, they compress once in the batch that holds them (the broker holds every byte)."""
    group = f"grouped-{unique}"
    detector = _fed_alerts(nodes=1_500)  # more keys than a log's first snapshot waits for
    checkpoint = _checkpoint(platform.kafka, group, detector, f"{group}-writer", name="alerts")
    checkpoint.begin()
    checkpoint.commit([])

    written = [
        decode_key(key)
        for message in committed_records(platform.kafka, f"gpulens.worker.{group}.alerts.changelog")
        if message.key().startswith(BATCH)
        for key, _ in unpack(message.value())
    ]
    nodes = [node for key in written if (node := _node_of(key)) is not None]
    runs = [node for i, node in enumerate(nodes) if i == 0 or nodes[i - 1] != node]
    assert len(set(nodes)) == 1_500 and len(runs) == 1_500, "each node's entries in one run"
    assert {key[0] for key in written} >= {"holders", "gpus", "node", "holding"}

    restored = AlertDetector(AlertRules())
    _checkpoint(platform.kafka, group, restored, f"{group}-restorer", name="alerts").restore()
    assert sorted(restored.live()) == sorted(detector.live())
    assert all(restored.dump(key) == detector.dump(key) for key in detector.live())
