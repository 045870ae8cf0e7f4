"""Transactions the broker forgot: found on the partitions and aborted, as Kafka's coordinator would.

noida-db keeps its transaction coordinator's state (which transactional id owns which producer
id, which partitions an open transaction spans) in memory only, and has no transaction
timeout. After a SIGKILL and a restart from its last save, a worker that was mid-transaction
reconnects and its queued records land on the partitions whose sequence is still in step,
opening a transaction there that no coordinator knows; its next batch on a partition the
broker lost records of fails with a fatal ``OUT_OF_ORDER_SEQUENCE_NUMBER`` and the worker
exits. That transaction then stays open for good (measured: 30 s past a 5 s
``transaction.timeout.ms``, and minutes in the pipeline): the last stable offset of the
partition stops there and every ``read_committed`` reader (the sink, a restarted worker's
restore) stops with it. ``init_transactions`` with the same transactional id does not abort
it (the restarted broker hands out a new producer id), nor does an ``InitProducerId`` naming
the old producer id (KIP-360) or an ``EndTxn`` alone; only a clean stop (its save aborts every
open transaction) or the requests below do.

What does abort it, measured (``tests/test_hanging_transactions.py``): ``AddPartitionsToTxn``
naming the open transaction's producer id and epoch and its partition, then ``EndTxn`` (abort).
Its producer id and epoch are in the header of the record batch at the partition's last
stable offset (a read_uncommitted ``Fetch``). confluent-kafka exposes none of these requests,
so this module speaks those four (non-flexible versions) itself, to the first bootstrap server.

When a transaction counts as forgotten:

- on a partition only this worker group writes (its state logs), at start, after the earlier
  incarnations are fenced: any transaction still open has no live owner;
- on a partition others may write too (the outputs, shared by a group's shards; the DLQ), once
  its last stable offset has stayed put, below the end, for ``after_s`` of answered checks: what
  Apache Kafka's own transaction timeout does. A broker that does not answer (stopped, away)
  restarts the count. On Apache Kafka the coordinator aborts such a transaction first, and the
  requests here are refused; nothing else changes.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, TopicPartition
from prometheus_client import Counter

from gpulens.pipeline.exceptions import PipelineError
from gpulens.schemas.kafka.settings import KafkaSettings

log = logging.getLogger(__name__)

ABORTED = Counter(
    "gpulens_worker_hanging_transactions_aborted_total",
    "Transactions left open by a broker that forgot them, aborted by the worker.",
    ["topic"],
)

_FETCH, _ADD_PARTITIONS, _END_TXN = 1, 24, 26
_TRANSACTIONAL = 0x10
"""Record batch attribute bit: the batch belongs to a transaction."""
_BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
"""Kafka record batch header (magic 2), up to the record count."""


class HangingTransactionError(PipelineError):
    """The broker answered a request about an open transaction with an error."""


@dataclass(frozen=True, slots=True)
class OpenTransaction:
    """The oldest transaction open on a partition: its first record and its producer."""

    topic: str
    partition: int
    first_offset: int
    producer_id: int
    producer_epoch: int


class _Wire:
    """One connection speaking a few Kafka requests in their non-flexible versions."""

    def __init__(self, kafka: KafkaSettings, timeout_s: float) -> None:
        host, _, port = kafka.bootstrap_servers.split(",")[0].rpartition(":")
        self._socket = socket.create_connection((host or "127.0.0.1", int(port)), timeout_s)
        self._correlation = 0

    def close(self) -> None:
        self._socket.close()

    def call(self, api: int, version: int, body: bytes) -> bytes:
        self._correlation += 1
        request = struct.pack(">hhi", api, version, self._correlation) + _string("gpulens-txn-reaper") + body
        self._socket.sendall(struct.pack(">i", len(request)) + request)
        size = struct.unpack(">i", self._read(4))[0]
        answer = self._read(size)
        if struct.unpack(">i", answer[:4])[0] != self._correlation:
            raise HangingTransactionError(f"api {api}: answer to another request")
        return answer[4:]

    def _read(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = self._socket.recv(size - len(data))
            if not chunk:
                raise OSError("the broker closed the connection")
            data += chunk
        return data


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def open_transaction(
    kafka: KafkaSettings, topic: str, partition: int, stable: int, *, timeout_s: float = 10.0
) -> OpenTransaction | None:
    """The transaction whose first record is at ``stable`` (the partition's last stable
    offset), read from its batch header; None when that batch is not transactional."""
    wire = _Wire(kafka, timeout_s)
    try:
        # replica, max wait, min bytes, max bytes, isolation (read_uncommitted)
        body = struct.pack(">iiiib", -1, 0, 0, 1_048_576, 0)
        body += struct.pack(">i", 1) + _string(topic) + struct.pack(">iiqi", 1, partition, stable, 65_536)
        answer = wire.call(_FETCH, 4, body)
    finally:
        wire.close()
    at = 4 + 4  # throttle time, one topic
    (name_length,) = struct.unpack_from(">h", answer, at)
    at += 2 + name_length + 4  # topic name, one partition
    _partition, error, _high, _stable = struct.unpack_from(">ihqq", answer, at)
    if error:
        raise HangingTransactionError(f"fetch {topic}/{partition} at {stable}: error {error}")
    at += 22
    (aborted,) = struct.unpack_from(">i", answer, at)
    at += 4 + 16 * max(aborted, 0)
    (size,) = struct.unpack_from(">i", answer, at)
    at += 4
    if size < _BATCH_HEADER.size:
        return None
    header = _BATCH_HEADER.unpack_from(answer, at)
    base, attributes, producer_id, epoch = header[0], header[5], header[9], header[10]
    if not attributes & _TRANSACTIONAL or base > stable:
        return None
    return OpenTransaction(topic, partition, stable, producer_id, epoch)


def abort(kafka: KafkaSettings, transaction: OpenTransaction, *, timeout_s: float = 10.0) -> None:
    """Abort ``transaction`` as its coordinator would: its partition joins a transaction of
    its producer id and epoch, which ends aborted (the broker writes the abort marker)."""
    owner = f"gpulens-txn-reaper-{transaction.producer_id}"
    wire = _Wire(kafka, timeout_s)
    try:
        ids = struct.pack(">qh", transaction.producer_id, transaction.producer_epoch)
        partitions = struct.pack(">i", 1) + _string(transaction.topic)
        partitions += struct.pack(">ii", 1, transaction.partition)
        answer = wire.call(_ADD_PARTITIONS, 1, _string(owner) + ids + partitions)
        at = 4 + 4
        (name_length,) = struct.unpack_from(">h", answer, at)
        _partition, error = struct.unpack_from(">ih", answer, at + 2 + name_length + 4)
        if error:
            raise HangingTransactionError(f"AddPartitionsToTxn {transaction}: error {error}")
        _throttle, error = struct.unpack_from(">ih", wire.call(_END_TXN, 1, _string(owner) + ids + b"\x00"))
        if error:
            raise HangingTransactionError(f"EndTxn (abort) {transaction}: error {error}")
    finally:
        wire.close()
    ABORTED.labels(transaction.topic).inc()
    log.warning(
        "aborted a transaction the broker left open on %s/%d from offset %d (producer %d, epoch %d)",
        transaction.topic,
        transaction.partition,
        transaction.first_offset,
        transaction.producer_id,
        transaction.producer_epoch,
    )


class StableOffsets:
    """Last stable offset and end of partitions, over two connections of its own."""

    def __init__(self, kafka: KafkaSettings, group_id: str) -> None:
        self._kafka = kafka
        self._committed, self._uncommitted = (
            Consumer(kafka.librdkafka(**{"group.id": group_id, "isolation.level": level}))
            for level in ("read_committed", "read_uncommitted")
        )

    def close(self) -> None:
        self._committed.close()
        self._uncommitted.close()

    def partitions(self, topic: str, timeout_s: float = 5.0) -> list[int]:
        metadata = self._committed.list_topics(topic, timeout=timeout_s).topics.get(topic)
        return sorted(metadata.partitions) if metadata is not None and metadata.error is None else []

    def behind(self, topic: str, partition: int, timeout_s: float = 5.0) -> int | None:
        """The last stable offset where it is below the end (a transaction is open), else None."""
        tp = TopicPartition(topic, partition)
        stable = self._committed.get_watermark_offsets(tp, timeout=timeout_s, cached=False)[1]
        end = self._uncommitted.get_watermark_offsets(tp, timeout=timeout_s, cached=False)[1]
        return stable if stable < end else None

    def abort_open(self, partitions: Iterable[tuple[str, int]]) -> int:
        """Abort every transaction open on ``partitions`` (no live writer may own one); how many.
        A broker that refuses the requests (Apache Kafka, which aborts such transactions itself)
        is logged and left alone."""
        aborted = 0
        for topic, partition in partitions:
            tried = None
            while (stable := self.behind(topic, partition, 30.0)) is not None and stable != tried:
                tried = stable
                try:
                    transaction = open_transaction(self._kafka, topic, partition, stable)
                    if transaction is None:
                        break
                    abort(self._kafka, transaction)
                except (OSError, struct.error, HangingTransactionError) as err:
                    log.warning("open transaction on %s/%d not aborted: %s", topic, partition, err)
                    break
                aborted += 1
        return aborted


class HangingTransactionReaper:
    """Watches the partitions of topics in a background thread and aborts a transaction whose
    first record stayed the partition's last stable offset for ``after_s`` of answered checks
    (``None``: never; the broker's own transaction timeout does it)."""

    def __init__(
        self,
        kafka: KafkaSettings,
        group_id: str,
        *,
        after_s: float | None = 75.0,
        interval_s: float = 10.0,
    ) -> None:
        self._kafka, self._group_id = kafka, group_id
        self._after_s, self._interval_s = after_s, interval_s
        self._topics: set[str] = set()
        self._partitions: dict[str, list[int]] = {}
        self._since: dict[tuple[str, int], tuple[int, float]] = {}
        """Per partition held back: its last stable offset and when it was first seen there."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._offsets: StableOffsets | None = None
        self._thread = threading.Thread(target=self._run, name=f"txn-reaper-{group_id}", daemon=True)

    def watch(self, topics: Iterable[str]) -> None:
        with self._lock:
            self._topics.update(topics)

    def start(self) -> HangingTransactionReaper:
        if self._after_s is not None:
            self._offsets = StableOffsets(self._kafka, f"{self._group_id}-txn-reaper")
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(60)
        if self._offsets is not None:
            self._offsets.close()

    def check(self, now: float) -> None:
        """One round over the watched partitions (the broker not answering restarts every count)."""
        assert self._offsets is not None and self._after_s is not None, "start() first, with after_s"
        with self._lock:
            topics = sorted(self._topics)
        try:
            for topic in topics:
                if not self._partitions.get(topic):  # unknown, or not created yet
                    self._partitions[topic] = self._offsets.partitions(topic)
            held = {
                (topic, p): stable
                for topic in topics
                for p in self._partitions[topic]
                if (stable := self._offsets.behind(topic, p)) is not None
            }
        except KafkaException as err:
            log.info("hanging transactions not checked, the broker did not answer: %s", err)
            self._since.clear()
            return
        since: dict[tuple[str, int], tuple[int, float]] = {}
        for where, lso in held.items():
            seen = self._since.get(where)
            since[where] = seen if seen is not None and seen[0] == lso else (lso, now)
        self._since = since
        for (topic, partition), (stable, first_seen) in list(since.items()):
            if now - first_seen < self._after_s:
                continue
            try:
                transaction = open_transaction(self._kafka, topic, partition, stable)
                if transaction is not None:
                    abort(self._kafka, transaction)
            except (OSError, struct.error, HangingTransactionError) as err:
                log.warning("hanging transaction on %s/%d not aborted: %s", topic, partition, err)
            del self._since[(topic, partition)]

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.check(time.monotonic())
