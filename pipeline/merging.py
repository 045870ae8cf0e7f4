"""Merging input partitions into one event-time order.

Each partition is in event-time order per entity, but a consumer fetches partitions in
arbitrary interleavings. The merge hands a record over only when every input partition
either has a record buffered (so nothing earlier can still come from it) or has been at
its end for ``idle_ms`` of wall time (a quiet partition must not stall everyone). Ties are
broken by topic rank, partition and offset, so a replay of the same data is processed in
the same order every time.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
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
    """Buffers records per partition and releases them in event-time order.

    One merge per stream that is ordered within each partition: the worker keeps one per
    cluster, since two clusters replayed at different times share partitions but not order.
    """

    def __init__(self, ends: PartitionEnds, *, idle_ms: int) -> None:
        self._ends = ends
        self._buffers: dict[Partition, deque[Stamped[T]]] = {p: deque() for p in ends.since}
        self._idle_s = idle_ms / 1000

    def add(self, item: Stamped[T]) -> None:
        """A record fetched from its partition (partitions deliver in offset order)."""
        partition = (item.topic, item.partition)
        self._buffers[partition].append(item)
        self._ends.received(partition)

    def release(self) -> list[Stamped[T]]:
        """Every record that is safe to process now, in order."""
        out: list[Stamped[T]] = []
        now = self._ends.clock()
        if any(self._blocks(p, now) for p in self._buffers):
            return out
        heads = [(b[0], p) for p, b in self._buffers.items() if b]
        heapq.heapify(heads)
        while heads:
            head, partition = heapq.heappop(heads)
            buffered = self._buffers[partition]
            buffered.popleft()
            out.append(head)
            if buffered:
                heapq.heappush(heads, (buffered[0], partition))
            elif self._blocks(partition, now):
                break  # only a partition that just ran empty can start blocking
        return out

    def _blocks(self, partition: Partition, now: float) -> bool:
        if self._buffers[partition]:
            return False
        since = self._ends.since[partition]
        return since is None or now - since < self._idle_s or not self._ends.drained(partition)

    def first_offsets(self) -> dict[Partition, int]:
        """The offset of the first record still buffered, per partition holding any."""
        return {p: b[0].offset for p, b in self._buffers.items() if b}

    @property
    def buffered(self) -> int:
        """Records waiting for a slower partition."""
        return sum(len(b) for b in self._buffers.values())
