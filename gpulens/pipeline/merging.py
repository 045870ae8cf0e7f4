"""Merging input partitions into one event-time order.

A consumer fetches partitions in arbitrary interleavings; the merge hands records over in
event-time order, ties broken by topic rank, partition and offset, so a replay of the same
data is processed in the same order every time.

How far it may go comes from the sources' watermarks (:mod:`gpulens.pipeline.event_time`). For a
cluster whose sources publish none, the fallback *partition rule* applies: a record goes only
when every input partition either has a record buffered (so nothing earlier can still come
from it, each partition being in event-time order) or has been at its end for ``idle_ms`` of
wall time and the broker holds nothing unread on it. That rule guesses: a partition a slow
producer is still writing can look drained, and its records then arrive late.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")
Partition = tuple[str, int]


@dataclass(order=True, frozen=True, slots=True)
class Stamped(Generic[T]):
    """A record with what orders it."""

    event_ms: int
    rank: int
    partition: int
    offset: int
    topic: str = field(compare=False)
    record: T = field(compare=False)
    key: bytes | None = field(default=None, compare=False)
    value: bytes | None = field(default=None, compare=False)
    """The original bytes, for a dead letter."""


class PartitionEnds:
    """Since when each partition has been at its end (None: data is coming); shared by merges.

    ``drained`` asks the broker whether a partition really has nothing more to read: a quiet
    partition is passed over only when it has been at its end for a while *and* the broker
    holds nothing we have not fetched yet, so a slow fetch never reorders events.
    """

    def __init__(
        self,
        partitions: list[Partition],
        *,
        drained: Callable[[Partition], bool] = lambda _p: True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.since: dict[Partition, float | None] = dict.fromkeys(partitions)
        self._ask_broker = drained
        self._confirmed: dict[Partition, float] = {}
        self.clock = clock

    def drained(self, partition: Partition) -> bool:
        """The broker holds nothing unread on ``partition`` (a yes is trusted for 250 ms).

        Asking costs a round trip; a quiet partition is asked on every release otherwise.
        """
        now = self.clock()
        if now - self._confirmed.get(partition, -1.0) < 0.25:
            return True
        if self._ask_broker(partition):
            self._confirmed[partition] = now
            return True
        return False

    def reached(self, partition: Partition) -> None:
        """The partition has nothing more right now."""
        if self.since[partition] is None:
            self.since[partition] = self.clock()

    def received(self, partition: Partition) -> None:
        """The partition delivered a record: it is not at its end."""
        self.since[partition] = None
        self._confirmed.pop(partition, None)


class EventTimeMerge(Generic[T]):
    """Buffers records and releases them in (event time, topic rank, partition, offset) order.

    One merge per cluster: two clusters replayed at different times share partitions but not
    order. How far it may release is the caller's to say (:meth:`release`): up to a bound
    from the cluster's watermarks (:mod:`pipeline.event_time`), or, for a cluster without
    watermarks, by the partition rule above.
    """

    def __init__(self, ends: PartitionEnds, *, idle_ms: int) -> None:
        self._ends = ends
        self._heap: list[tuple[int, int, int, int, Stamped[T]]] = []
        """Each record under its sort key as a tuple: compared in C, where the dataclass's
        generated ``__lt__`` cost 3 % of the worker at 10,000 GPUs."""
        self._counts: dict[Partition, int] = dict.fromkeys(ends.since, 0)
        self._idle_s = idle_ms / 1000

    def add(self, item: Stamped[T]) -> None:
        """A record fetched from its partition."""
        partition = (item.topic, item.partition)
        heapq.heappush(self._heap, (item.event_ms, item.rank, item.partition, item.offset, item))
        self._counts[partition] += 1
        self._ends.received(partition)

    def release(self, below_ms: int | None = None) -> list[Stamped[T]]:
        """Every record that is safe to process now, in order.

        ``below_ms``: release the records with an event time below it, whatever the partitions
        say (the sources vouched for everything earlier). None: the partition rule.
        """
        out: list[Stamped[T]] = []
        heap = self._heap
        if not heap:
            return out  # nothing to release: no partition need be asked whether it blocks
        if below_ms is not None:
            while heap and heap[0][0] < below_ms:
                out.append(self._pop())
            return out
        now = self._ends.clock()
        if any(self._blocks(p, now) for p in self._counts):
            return out
        while heap:
            head = self._pop()
            out.append(head)
            partition = (head.topic, head.partition)
            if self._blocks(partition, now):
                break  # only a partition that just ran empty can start blocking
        return out

    def _pop(self) -> Stamped[T]:
        head = heapq.heappop(self._heap)[-1]
        self._counts[(head.topic, head.partition)] -= 1
        return head

    def _blocks(self, partition: Partition, now: float) -> bool:
        if self._counts[partition]:
            return False
        since = self._ends.since[partition]
        return since is None or now - since < self._idle_s or not self._ends.drained(partition)

    def first_offsets(self) -> dict[Partition, int]:
        """The offset of the first record still buffered, per partition holding any (a scan:
        called once per checkpoint, not per record)."""
        first: dict[Partition, int] = {}
        for *_, item in self._heap:
            partition = (item.topic, item.partition)
            if item.offset < first.get(partition, item.offset + 1):
                first[partition] = item.offset
        return first

    @property
    def buffered(self) -> int:
        """Records waiting to be released."""
        return len(self._heap)
