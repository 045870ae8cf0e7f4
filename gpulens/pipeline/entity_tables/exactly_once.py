"""faust's app and Kafka transport, changed so that `gpulens tables` restarts after a kill -9.

On noida-db a killed app could not restart at all. With only the restart fixed (the last
two points below), faust-streaming 0.15.3's exactly_once lost and repeated state rows across
a kill -9 (2,000 pod events: 15 rows missing in one run, 273 twice in another). Without
the three points on taking partitions up, seeks and changelog offsets, the acceptance test
(tests/test_entity_tables.py) still failed 2 runs of 5 on a loaded machine (issue 12): a
rebalance that kept the app's partitions (noida-db drops a member whose heartbeat is late)
rolled its tables back (see ``_persist_changelog_offsets``). Not re-measured since: one
20,000-event benchmark run of two (before the first point below) stopped making progress
(commits overlapping, then nothing: cause not found). What is changed, and why:

* Each source record is applied once, in offset order (``Sequence``, in ``agent_body``).
  faust delivered records to the agents again, and skipped some, on every rebalance and
  restart (measured with per-record logs of the agent and of aiokafka's fetches and seeks):

  - Recovery resumes the stream partitions, with flow already running, before it seeks them
    to their committed offsets (faust/tables/recovery.py ``_resume_streams``,
    ``on_recovery_completed``): a batch aiokafka had fetched from the committed offset
    during recovery was delivered and applied, the seek set the position back to the
    committed offset, and the same records were fetched again. faust's fetch loop drops a
    fetched record below the highest offset it delivered, but delivers that offset itself
    (``offset >= read offset``): the last record of each partition was applied twice, in the
    same transaction (this was the known defect: consecutive offsets of one transaction).
  - On a rebalance, faust's consumer forgets the acknowledged offsets of the revoked
    partitions before the app's revocation commit runs (faust/transport/consumer.py
    ``on_partitions_revoked``), so that commit commits nothing; with the static member id
    the same partitions come back, their transactions still open with the records applied,
    and the consumer starts again from the old committed offset (measured: 40 records of one
    partition delivered again).
  - The seek above resets faust's highest-delivered offset to the committed one while the
    batch fetched before the seek is still being delivered, raising it again: the records
    fetched after the seek were then dropped, never reaching the agent (measured: offsets
    82-126 of one partition, the app then short of pod rows), and the fetch loop counts the
    offsets it jumps over as processed (its gap filling, meant for compacted topics), so
    they could be committed unapplied.

  So faust's fetch loop no longer filters (``ReadOffsets``): every fetched record reaches
  the agent, which applies the record at the partition's next offset, acknowledges one below
  it without applying it (its write is in a transaction that commits with its offset), and
  leaves one above it, seeking the partition back to the next offset (``Sequence.rewind``).
  A commit commits, per partition, the offset after the last record applied
  (``Sequence.offsets``), not faust's count of acknowledged records: with the offsets
  forgotten at a revocation, the first commit after it had committed the records applied
  before it with an offset below them (measured: one incarnation committed pods offset 45
  with the writes of records up to 93, which the next incarnation applied again), and faust
  acknowledges the records its streams skip (delivered while flow is stopped, or of an
  earlier generation; faust/streams.py) as if processed. The next offsets of a partition are
  kept across a rebalance that leaves it here, and forgotten when it is revoked or newly
  assigned (``IncarnationTransactions.on_rebalance``).
* A partition is taken up at the group's committed offset (``Sequence.start``), not at
  the first record faust delivers, and a commit commits only the offsets ``Sequence``
  vouches for, never faust's: faust's streams acknowledge the records they skip as if
  processed, and a record skipped at the head of a partition would have been passed over.
* Seeks run in the consumer's thread, and a source partition with records left that
  applies none for ``STALL_PATIENCE_S`` is sought back to its next record
  (``_seek_stalled``): faust's own seek sets aiokafka's position from the app's thread, and
  a partition whose dropped record was its last one would never be sought back at all.
* Changelog offsets are noted in the stores at each commit (``_persist_changelog_offsets``):
  faust never did under exactly_once, so every rebalance recovered the tables over the
  live stores and rolled back what the open transaction had written.
* Commits exclude processing. faust commits on a timer while the agents go on: records of
  events processed during a commit went into the transaction being committed without their
  offsets (repeated after a kill), and records of acknowledged events still in faust's
  producer buffer went into the next transaction (lost). Now each event is processed and
  acknowledged under ``IncarnationApp.gate`` (see ``agent_body``), and a commit holds the
  gate and waits until every record put in faust's producer buffer has been sent into its
  transaction before it commits the offsets with them (faust's own ``buffer.flush()`` gives
  up after 0.1 s per message, and does not wait for the message being sent).
* A commit waits until every record sent in the transaction is acknowledged: aiokafka sends
  EndTxn without waiting for produce requests in flight (aiokafka/producer/sender.py), and
  a record that arrived after the commit marker was in the next transaction (lost).
* Transactional ids per incarnation, ``<app id>-<incarnation>-<topic group>-<partition>``
  (faust's own are ``<app id>-<topic group>-<partition>``, the same in every incarnation).
  A transactional id whose open transaction was aborted is never used again: noida-db keeps
  listing the aborted transaction in later fetches, and read_committed readers positioned
  past its abort marker then skip every later record of that producer (probe: a reader from
  the first offset after the marker got none of the 3 records committed after it). Each id
  is written to the ledger before its first transaction, so the next start can abort
  (fence) what a killed incarnation left open (see incarnations).
* Highwaters from the broker (ListOffsets, read_committed: the last stable offset). faust
  reads them under exactly_once from the consumer's fetch state, which is empty before the
  first fetch: every changelog then looked empty (-1), so a fresh store recovered nothing
  and a persisted one failed faust's consistency check (``ConsistencyError``).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any, cast

import faust
from aiokafka.errors import ProducerFenced
from aiokafka.structs import TopicPartition
from faust.transport.consumer import TransactionManager
from faust.transport.drivers import aiokafka
from faust.types import TP, EventT, FutureMessage, HeadersArg, RecordMetadata, StreamT
from faust.types.transports import TPorTopicSet

from gpulens.pipeline.entity_tables.incarnations import Ledger
from gpulens.pipeline.entity_tables.recovery import ChangelogTails

log = logging.getLogger(__name__)

STALL_CHECK_S = 1.0
"""How often the app looks for source partitions that stopped short of their end."""
STALL_PATIENCE_S = 5.0
"""How long a partition with records left may go without applying one before it is sought
back to its next record (a seek too many only fetches records again: they are acknowledged,
not applied)."""


class Verdict(enum.Enum):
    """What to do with a record delivered to an agent."""

    NEXT = "apply it: the next offset of its partition"
    AGAIN = "acknowledge it: applied already, in a transaction that commits with its offset"
    EARLY = "leave it: an offset before it was not applied (faust skipped or dropped it)"


class Sequence:
    """Which records of each source partition the agents applied: one unbroken run of offsets
    per partition, from the group's committed offset when this process took the partition up,
    until it gives it up."""

    def __init__(self) -> None:
        self._next: dict[TP, int] = {}
        self._rewound: dict[TP, int] = {}
        self._moved: dict[TP, float] = {}
        """When each partition last applied a record, started, or was sought back."""

    def started(self, tp: TP) -> bool:
        return tp in self._next

    def start(self, tp: TP, committed: int) -> None:
        """Take ``tp`` up at the group's committed offset: every record before it is applied
        (committed with it), the record at it is the next one to apply whatever faust delivers
        first (faust skips and acknowledges records delivered while its flow is stopped)."""
        self._next[tp] = committed
        self._rewound.pop(tp, None)
        self._moved[tp] = time.monotonic()

    def verdict(self, tp: TP, offset: int) -> Verdict:
        expected = self._next[tp]
        if offset < expected:
            return Verdict.AGAIN
        return Verdict.NEXT if offset == expected else Verdict.EARLY

    def applied(self, tp: TP, offset: int) -> None:
        self._next[tp] = offset + 1
        self._rewound.pop(tp, None)
        self._moved[tp] = time.monotonic()

    def rewind(self, tp: TP) -> int | None:
        """The offset to fetch ``tp`` again from, after a record delivered early: once per
        missing offset (the records delivered early meanwhile were fetched before the seek);
        None if that seek was made already."""
        expected = self._next[tp]
        if self._rewound.get(tp) == expected:
            return None
        self._rewound[tp] = expected
        self._moved[tp] = time.monotonic()
        return expected

    def stalled(self, ends: Mapping[TP, int], patience: float) -> dict[TP, int]:
        """The next offsets of the partitions in ``ends`` (their end offsets) that have
        records not applied and did not move for ``patience`` seconds: nothing will deliver
        their next record (it was dropped after the last seek, or was the partition's last
        one). Each counts as sought back now."""
        now = time.monotonic()
        stalled = {
            tp: self._next[tp]
            for tp, end in ends.items()
            if tp in self._next and self._next[tp] < end and now - self._moved[tp] >= patience
        }
        for tp, offset in stalled.items():
            self._rewound[tp] = offset
            self._moved[tp] = now
        return stalled

    def offsets(self, tps: Iterable[TP]) -> dict[TP, int]:
        """Per partition of ``tps`` taken up, the offset to commit: every record before it is
        applied, its writes in this transaction or an earlier one."""
        return {tp: self._next[tp] for tp in tps if tp in self._next}

    def forget(self, tps: Iterable[TP]) -> None:
        """Partitions whose open transactions this process gave up (revoked, or assigned anew):
        taken up again at the committed offset."""
        for tp in tps:
            self._next.pop(tp, None)
            self._rewound.pop(tp, None)
            self._moved.pop(tp, None)


class ReadOffsets(dict[TP, int | None]):
    """faust's highest offset delivered per partition, kept as never known. faust's fetch loop
    drops every fetched record below it, and counts offsets it jumps over as processed (meant
    for compacted topics): after a seek back it dropped records that were never applied (a
    batch fetched before the seek went on raising it), and committed them. Every fetched
    record now reaches the agents, and ``Sequence`` decides."""

    def __getitem__(self, tp: TP) -> None:
        return None

    def __setitem__(self, tp: TP, offset: int | None) -> None:
        pass

    def update(self, *args: Any, **kwargs: Any) -> None:
        pass


class IncarnationApp(faust.App):
    """A faust app whose transactional ids name this incarnation (``ledger.incarnation``),
    whose agents apply each source record once and in order, and whose commits wait for the
    event being processed."""

    def __init__(self, *args: Any, ledger: Ledger, changelog_tails: ChangelogTails, **kwargs: Any) -> None:
        self.ledger = ledger
        self.changelog_tails = changelog_tails
        """Read by the table manager's recovery (see recovery)."""
        self.gate = asyncio.Lock()
        """Held while one event is processed, and for a whole commit."""
        self.sequence = Sequence()
        super().__init__(*args, **kwargs)
        self.timer(STALL_CHECK_S, name="gpulens.tables.stalls")(self._seek_stalled)

    def agent_body(
        self, apply: Callable[[EventT[bytes]], Awaitable[None]]
    ) -> Callable[[StreamT[bytes]], Awaitable[None]]:
        """An agent applying each record of its stream once, in offset order, between two
        commits, and acknowledging it before the next commit (faust would acknowledge it only
        when the agent asks for the next event). A record faust delivers again is acknowledged,
        not applied; one delivered past a record not applied yet is left for the rewind."""

        async def agent(stream: StreamT[bytes]) -> None:
            async for event in stream.events():
                async with self.gate:
                    message = event.message
                    consumer = cast(Consumer, self.consumer)
                    if not self.sequence.started(message.tp):
                        self.sequence.start(message.tp, await consumer.committed_or_first(message.tp))
                    verdict = self.sequence.verdict(message.tp, message.offset)
                    if verdict is Verdict.EARLY:
                        offset = self.sequence.rewind(message.tp)
                        if offset is not None:
                            await consumer.seek_in_thread(message.tp, offset)
                        continue
                    if verdict is Verdict.NEXT:
                        await apply(event)
                        self.sequence.applied(message.tp, message.offset)
                    event.ack()

        return agent

    async def _seek_stalled(self) -> None:
        """Seek the source partitions that stopped short of their end back to their next
        record. faust drops records without a trace (a stream skips what it gets while its
        flow is stopped; a record fetched before a seek can overwrite the seek's position), and
        the rewind on a record delivered early cannot help when no record comes after the
        dropped one, nor when its seek was lost: the partition then waits forever (issue 12:
        without these changes, two runs of the kill test stopped committing for 40-60 s with
        records left, no error logged; which of the two it was is not told apart). With
        this, a run logged "stopped at offset 120 of 140" and went on."""
        if self.rebalancing or not self.flow_control.is_active():
            return
        async with self.gate:
            consumer = cast(Consumer, self.consumer)
            sources = {name for agent in self.agents.values() for name in agent.get_topic_names()}
            tps = {tp for tp in consumer.assignment() if tp.topic in sources}
            for tp in tps - {tp for tp in tps if self.sequence.started(tp)}:
                self.sequence.start(tp, await consumer.committed_or_first(tp))
            ends = await consumer.highwaters(*tps) if tps else {}
            for tp, offset in self.sequence.stalled(ends, STALL_PATIENCE_S).items():
                log.warning(
                    "tables: %s[%d] stopped at offset %d of %d: fetching it again",
                    tp.topic,
                    tp.partition,
                    offset,
                    ends[tp],
                )
                await consumer.seek_in_thread(tp, offset)

    def _new_transport(self) -> aiokafka.Transport:
        return Transport(self.conf.broker_consumer, self)

    def _new_producer_transport(self) -> aiokafka.Transport:
        return Transport(self.conf.broker_producer, self)


class IncarnationTransactions(TransactionManager):
    """faust's transaction manager with this incarnation's transactional ids, committing only
    once every record sent in the transactions is on the broker."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_flight: list[Awaitable[RecordMetadata]] = []
        self._sent = 0
        self._more_sent = asyncio.Event()

    async def _buffer_sent(self) -> None:
        """Return once every record put in the producer's buffer went through ``send``."""
        producer = cast(Producer, self.app.producer)
        while self._sent < producer.buffered:
            self._more_sent.clear()
            await self._more_sent.wait()

    def _ledger(self) -> Ledger:
        return cast(IncarnationApp, self.app).ledger

    def _transactional_id(self, group: int, partition: int) -> str:
        return f"{self.app.conf.id}-{self._ledger().incarnation}-{group}-{partition}"

    def _tps_to_transactional_ids(self, tps: set[TP]) -> set[str]:
        return {self._transactional_id(tpg.group, tpg.partition) for tpg in self._tps_to_active_tpgs(tps)}

    async def on_rebalance(self, assigned: set[TP], revoked: set[TP], newly_assigned: set[TP]) -> None:
        cast(IncarnationApp, self.app).sequence.forget(revoked | newly_assigned)
        await super().on_rebalance(assigned, revoked, newly_assigned)

    async def _start_transactions(self, tids: Iterable[str]) -> None:
        tids = list(tids)
        self._ledger().record(tids)
        await super()._start_transactions(tids)

    async def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int | None,
        timestamp: float | None,
        headers: HeadersArg | None,
        *,
        transactional_id: str | None = None,
    ) -> Awaitable[RecordMetadata]:
        p = self.consumer.key_partition(topic, key, partition)
        tid = None if p is None else self._transactional_id(self.app.assignor.group_for_topic(topic), p)
        sent = await self.producer.send(topic, key, value, p, timestamp, headers, transactional_id=tid)
        self._in_flight.append(sent)
        self._sent += 1
        self._more_sent.set()
        return sent

    async def commit(self, offsets: Mapping[TP, int], start_new_transaction: bool = True) -> bool:
        await self._buffer_sent()
        in_flight, self._in_flight = self._in_flight, []
        await asyncio.gather(*in_flight)
        # Only what the agents applied: faust's offsets count the records its streams skipped
        # and acknowledged as processed (issue 12: their rows were never written).
        offsets = cast(IncarnationApp, self.app).sequence.offsets(self.consumer.assignment())
        by_transactional_id: MutableMapping[str, MutableMapping[TP, int]] = defaultdict(dict)
        for tp, offset in offsets.items():
            group = self.app.assignor.group_for_topic(tp.topic)
            # aiokafka takes its own TopicPartition only (faust's TP is a look-alike).
            by_transactional_id[self._transactional_id(group, tp.partition)][
                TopicPartition(tp.topic, tp.partition)
            ] = offset
        if by_transactional_id:
            try:
                await self.producer.commit_transactions(
                    by_transactional_id, self.app.conf.id, start_new_transaction=start_new_transaction
                )
            except ProducerFenced as fenced:
                await self.app.crash(fenced)
                return True
            self._persist_changelog_offsets()
        return True

    def _persist_changelog_offsets(self) -> None:
        """Note in each store the changelog offsets its committed writes reached.

        faust defers them to the commit under exactly_once, keyed by *changelog* partition, but
        flushes them for the *source* partitions committed (faust/tables/manager.py
        ``on_commit``): no store's offset ever moved past its recovery. Every rebalance (noida-db
        drops a member whose heartbeat is late, and it re-joins) then recovered the tables from
        there up to the last stable offset, over the live store: each key written again in the
        open transaction went back to its last committed value, and the events that changed it
        were not applied again (issue 12, measured: workloads missing pods applied before the
        rebalance, first_seen a second late). Every record sent is in this commit (see above),
        so every pending offset is committed."""
        pending = self.app.tables._pending_persisted_offsets  # type: ignore[attr-defined]
        for tp, (store, offset) in pending.items():
            store.set_persisted_offset(tp, offset)
        pending.clear()


class ConsumerThread(aiokafka.AIOKafkaConsumerThread):
    """Highwaters asked of the broker, never taken from the fetch state; seeks and committed
    offsets in the consumer's own thread."""

    async def _highwaters(self, partitions: list[TP]) -> Mapping[TP, int]:
        return cast(Mapping[TP, int], await self._ensure_consumer().end_offsets(partitions))

    async def committed_or_first(self, tp: TP) -> int:
        return cast(int, await self.call_thread(self._committed_or_first, tp))

    async def _committed_or_first(self, tp: TP) -> int:
        consumer = self._ensure_consumer()
        committed = await consumer.committed(tp)
        if committed is not None:
            return cast(int, committed)
        return cast(int, (await consumer.beginning_offsets([tp]))[tp])

    async def seek_in_thread(self, tp: TP, offset: int) -> None:
        await self.call_thread(self._seek_now, tp, offset)

    async def _seek_now(self, tp: TP, offset: int) -> None:
        self._ensure_consumer().seek(tp, offset)


class Consumer(aiokafka.Consumer):
    """Delivers every fetched record to the agents (see ``ReadOffsets``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_offset = ReadOffsets()

    async def force_commit(
        self, topics: TPorTopicSet | None = None, start_new_transaction: bool = True
    ) -> bool:
        app = cast(IncarnationApp, self.app)
        async with app.gate:
            committed: bool = await super().force_commit(topics, start_new_transaction)
            return committed

    async def committed_or_first(self, tp: TP) -> int:
        """The group's committed offset of ``tp``, or its first offset if none is committed."""
        return await cast(ConsumerThread, self._thread).committed_or_first(tp)

    async def seek_in_thread(self, tp: TP, offset: int) -> None:
        """Seek ``tp`` to ``offset`` in the consumer's thread. faust's ``seek`` sets aiokafka's
        position from the app's thread, racing the consumer thread's fetches: a fetched batch
        delivered after it moved the position on again, so the rewind was lost."""
        await cast(ConsumerThread, self._thread).seek_in_thread(tp, offset)

    def _new_consumer_thread(self) -> ConsumerThread:
        return ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class Producer(aiokafka.Producer):
    """Counts the records put in faust's buffer (table writes), for ``_buffer_sent``."""

    buffered = 0

    def send_soon(self, fut: FutureMessage) -> None:
        self.buffered += 1
        super().send_soon(fut)


class Transport(aiokafka.Transport):
    Consumer = Consumer
    Producer = Producer
    TransactionManager = IncarnationTransactions
