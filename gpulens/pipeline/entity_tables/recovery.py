"""faust's table recovery, ended at the changelogs' last records instead of 10 s after them.

faust takes a changelog partition as recovered once it applied the record at the partition's
end offset minus one. Under exactly_once that offset holds a transaction marker, which no
reader ever gets: recovery then waited for two 5 s timeouts of its queue before looking
again (faust/tables/recovery.py ``_slurp_changelogs``, ``detect_aborted_tx``), so every start
and rebalance of `gpulens tables` cost 10 s more than reading its state, even with nothing to
read. Here the partition's end is the offset of its last committed record, found by reading
its tail with a read_committed consumer of its own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any, Protocol, cast

from confluent_kafka import Consumer, KafkaError, TopicPartition
from faust.tables import TableManager
from faust.tables.recovery import Recovery
from faust.types import TP
from faust.types.transports import ConsumerT

from gpulens.schemas.kafka.settings import KafkaSettings

log = logging.getLogger(__name__)

FIRST_TAIL = 1_000
"""Records read back from a partition's end first; each try reads ten times more, up to its
beginning (a killed incarnation's aborted transaction may fill the tail)."""
READ_TIMEOUT_S = 30.0


class ChangelogTails:
    """Offset of the last committed record of changelog partitions, markers and aborted
    records left out."""

    def __init__(self, kafka: KafkaSettings) -> None:
        self._kafka = kafka

    def last_records(self, ends: Mapping[TP, int]) -> dict[TP, int]:
        """Per partition with records before its end offset (``ends``), the offset of its
        last committed record; -1 where it has none."""
        found: dict[TP, int] = {}
        tail, left = FIRST_TAIL, {tp: end for tp, end in ends.items() if end > 0}
        while left:
            lasts = self._read(left, tail)
            for tp, last in lasts.items():
                if last is not None or left[tp] <= tail:
                    found[tp] = -1 if last is None else last
            left = {tp: end for tp, end in left.items() if tp not in found}
            tail *= 10
        return found

    def _read(self, ends: Mapping[TP, int], tail: int) -> dict[TP, int | None]:
        consumer = Consumer(
            self._kafka.librdkafka(
                **{
                    "group.id": "gpulens-changelog-tails",
                    "isolation.level": "read_committed",
                    "enable.auto.commit": False,
                    "enable.partition.eof": True,
                }
            )
        )
        lasts: dict[TP, int | None] = dict.fromkeys(ends)
        try:
            consumer.assign(
                [TopicPartition(tp.topic, tp.partition, max(end - tail, 0)) for tp, end in ends.items()]
            )
            reading = set(ends)
            deadline = time.monotonic() + READ_TIMEOUT_S
            while reading and time.monotonic() < deadline:
                for message in consumer.consume(1_000, 0.05):
                    tp = TP(cast(str, message.topic()), cast(int, message.partition()))
                    error, offset = message.error(), cast(int, message.offset())
                    if error is not None and error.code() == KafkaError._PARTITION_EOF:
                        reading.discard(tp)
                    elif error is None and offset < ends[tp]:
                        lasts[tp] = offset
                        if offset == ends[tp] - 1:
                            reading.discard(tp)
            if reading:
                raise TimeoutError(f"changelog tails not read in {READ_TIMEOUT_S:.0f} s: {sorted(reading)}")
        finally:
            consumer.close()
        return lasts


class PromptRecovery(Recovery):
    """Recovery whose highwaters are the changelogs' last committed records."""

    def __init__(self, *args: Any, tails: ChangelogTails, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tails = tails

    async def _build_highwaters(
        self, consumer: ConsumerT, tps: set[TP], destination: Counter[TP], title: str
    ) -> None:
        await super()._build_highwaters(consumer, tps, destination, title)
        # faust's highwater is the end offset minus one (see its FIXME)
        ends = {tp: destination[tp] + 1 for tp in tps}
        try:
            lasts = await asyncio.to_thread(self._tails.last_records, ends)
        except Exception as err:  # faust's own highwaters still work, 10 s later
            log.warning("tables: changelog tails not read (%s): recovery ends by faust's timeouts", err)
            return
        for tp, last in lasts.items():
            destination[tp] = last


class WithTails(Protocol):
    changelog_tails: ChangelogTails


class PromptTableManager(TableManager):
    """faust's table manager with :class:`PromptRecovery`, for an app with ``changelog_tails``."""

    @property
    def recovery(self) -> Recovery:
        if self._recovery is None:
            tails = cast(WithTails, self.app).changelog_tails
            self._recovery = PromptRecovery(self.app, self, beacon=self.beacon, loop=self.loop, tails=tails)
        return self._recovery
