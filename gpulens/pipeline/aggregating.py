"""The event-time skeleton the aggregators share: one state per cluster, moved through event time
and checkpointed key by key.

Allocation windows, workload usage and alerts (:mod:`gpulens.pipeline.allocation`,
:mod:`gpulens.pipeline.workload_usage`, :mod:`gpulens.pipeline.alerting`) differ in what they
count, not in how time moves for them, which is written once here:

- A cluster's *instant* is the event time of the newest event applied to it. It only moves
  forward: an older event raises :class:`~gpulens.pipeline.exceptions.LateEvent` (the worker
  dead-letters it). Events at one instant are applied together, so what an aggregator integrates
  over time is *settled* at the instant only when time moves past it (DESIGN.md: the amount at an
  instant is the one after all of that instant's events).
- A windowed aggregator (:class:`BaseWindowedAggregator`) closes its tumbling windows as event
  time passes their ends, one window's rows at a time and lazily (a day's gap is thousands of
  windows, never one list), so that the worker may commit between two of them.
- State is checkpointed key by key (:class:`~gpulens.pipeline.checkpointing.Stateful`) under
  ``[kind, cluster, ...]``. ``["cluster", c]`` is the cluster's own entry (its instant, and
  the open window's figures where it has windows), marked changed by every event the cluster
  gets; each aggregator names its other kinds and documents their values. A cluster's entries
  may be restored in any order: the first one restored opens it as if first heard of at 0.

Rows of GPUs held over a window (cluster, node, workload) share their window and amount fields
(:func:`held_fields`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from types import MappingProxyType
from typing import Any, ClassVar, Generic, Protocol, TypedDict, TypeVar

from gpulens.pipeline.checkpointing import StateKey
from gpulens.pipeline.exceptions import LateEvent
from gpulens.pipeline.windows import HeldAmount, TumblingWindows, event_time_ms, from_ms
from gpulens.schemas.model.models import Event
from gpulens.schemas.wire.sample_columns import SampleColumns, event_name


class ClusterState(Protocol):
    """What the skeleton reads and moves of an aggregator's state of one cluster."""

    name: str
    instant: int
    """Event time (epoch ms) of the newest event applied."""


class WindowedClusterState(ClusterState, Protocol):
    """A cluster's state with an open tumbling window."""

    window_start: int
    """Start (epoch ms) of the window events are counted in now."""


S = TypeVar("S", bound=ClusterState)
W = TypeVar("W", bound=WindowedClusterState)
R = TypeVar("R")


class BaseAggregator(ABC, Generic[S]):
    """Per-cluster state in event time, checkpointed key by key (module docstring)."""

    def __init__(self) -> None:
        self._clusters: dict[str, S] = {}
        self._changed: set[StateKey] = set()

    # --- what each aggregator says ----------------------------------------------------------

    @abstractmethod
    def _open(self, name: str, at: int) -> S:
        """The state of a cluster first heard of at ``at`` (0 when restored from a checkpoint)."""

    def _settle(self, cluster: S) -> None:
        """Fix what held at the cluster's instant, which time is about to leave (default: nothing
        is integrated over time)."""

    @abstractmethod
    def _keys(self, cluster: S) -> Iterator[StateKey]:
        """The cluster's keys that have a value, besides its own ``["cluster", name]``."""

    @abstractmethod
    def _dump(self, cluster: S, key: StateKey) -> Any:
        """The JSON-able value of ``key`` of ``cluster`` (its own entry included), or None."""

    @abstractmethod
    def _load(self, cluster: S, key: StateKey, value: Any) -> None:
        """Take a dumped value of ``key`` of ``cluster`` back."""

    def _take_changed(self, cluster: S) -> Iterable[StateKey]:
        """Keys that parts of ``cluster`` noted as changed themselves, taken at each checkpoint
        (default: none; every change is noted in ``self._changed``)."""
        return ()

    # --- event time ---------------------------------------------------------------------------

    def _enter(self, event: Event | SampleColumns) -> S:
        """``event``'s cluster, opened if new, its instant moved to the event's time (settling
        what held until then); raises LateEvent for an event older than the instant."""
        at = event_time_ms(event)
        cluster = self._clusters.get(event.cluster)
        if cluster is None:
            cluster = self._clusters[event.cluster] = self._open(event.cluster, at)
        elif at < cluster.instant:
            raise LateEvent(
                f"{event_name(event)} at {event.event_time.isoformat()} arrived after "
                f"{from_ms(cluster.instant).isoformat()} for cluster {event.cluster}"
            )
        self._move(cluster, at)
        return cluster

    def _move(self, cluster: S, at: int) -> None:
        """Move the cluster's instant to ``at`` (never back), settling what held until then."""
        self._changed.add(("cluster", cluster.name))
        if at > cluster.instant:
            self._settle(cluster)
            cluster.instant = at

    def _run_cluster(self, run: Sequence[SampleColumns]) -> S | None:
        """The cluster a run of its GPU sample batches (in event-time order) may be applied to at
        once: one already known, the run not older than its instant. None otherwise, with nothing
        applied: the worker gives the batches one by one then (a late one is reported)."""
        cluster = self._clusters.get(run[0].cluster)
        if cluster is None or run[0].event_ms < cluster.instant:
            return None
        return cluster

    # --- checkpoint (gpulens.pipeline.checkpointing.Stateful) ---------------------------------

    def changed(self) -> set[StateKey]:
        changed, self._changed = self._changed, set()
        for cluster in self._clusters.values():
            changed.update(self._take_changed(cluster))
        return changed

    def live(self) -> Iterator[StateKey]:
        for name, cluster in self._clusters.items():
            yield ("cluster", name)
            yield from self._keys(cluster)

    def dump(self, key: StateKey) -> Any:
        cluster = self._clusters.get(key[1])
        return None if cluster is None else self._dump(cluster, key)

    def load(self, key: StateKey, value: Any) -> None:
        cluster = self._clusters.get(key[1])
        if cluster is None:
            cluster = self._clusters[key[1]] = self._open(key[1], 0)
        self._load(cluster, key, value)


class NodeGroupedSnapshot:
    """An aggregator whose snapshots list each node's entries together
    (:class:`~gpulens.pipeline.checkpointing.GroupsSnapshot`): its keys of several kinds name a
    node, and their values spell out that node's GPU ids."""

    node_at: ClassVar[MappingProxyType[str, int]] = MappingProxyType({})
    """Kind -> where its keys name their node (an index into the key); other kinds are about no
    node, and come first in their cluster."""

    def snapshot_group(self, key: StateKey) -> tuple[str, str]:
        """(cluster, node) of ``key`` (``[kind, cluster, ...]``); the node is "" for other kinds."""
        at = self.node_at.get(key[0])
        return key[1], "" if at is None else key[at]


class BaseWindowedAggregator(BaseAggregator[W], Generic[W, R]):
    """Per-cluster state whose tumbling windows close in event time, each giving rows ``R``."""

    def __init__(self, windows: TumblingWindows) -> None:
        super().__init__()
        self.windows = windows

    @abstractmethod
    def _window_rows(self, cluster: W, start: int, end: int) -> list[R]:
        """The rows of the cluster's window ``[start, end)``, its figures reset for the next."""

    def _closes_windows(self, event: Event | SampleColumns) -> bool:
        """Whether ``event``'s time may close windows (default: every event's)."""
        return True

    def advance(self, event: Event | SampleColumns) -> Iterator[list[R]]:
        """Close the windows that end by ``event``'s time, one window's rows at a time, before it
        is processed. After each window the cluster's instant moves to that window's end
        (nothing happened in between), so state checkpointed between two windows goes on from
        there, and an event given again after a restart closes only what is left."""
        at, cluster = event_time_ms(event), self._clusters.get(event.cluster)
        if (
            cluster is None
            or at < cluster.window_start + self.windows.size_ms
            or not self._closes_windows(event)
        ):
            # Nothing closes (the open window always ends after the instant), as for most
            # events: asked first, with no generator built; processing the event settles what
            # time leaves.
            return iter(())
        return self._closing(cluster, at)

    def _run_cluster(self, run: Sequence[SampleColumns]) -> W | None:
        """As the skeleton's, and no window closes within the run (windows close one at a time,
        through :meth:`advance`)."""
        cluster = super()._run_cluster(run)
        if cluster is None or run[-1].event_ms >= cluster.window_start + self.windows.size_ms:
            return None
        return cluster

    def _closing(self, cluster: W, at: int) -> Iterator[list[R]]:
        self._changed.add(("cluster", cluster.name))
        self._settle(cluster)
        while cluster.window_start + self.windows.size_ms <= at:
            rows = self._close_window(cluster)
            cluster.instant = cluster.window_start
            yield rows

    def _closed_by(self, event: Event | SampleColumns) -> list[R]:
        """Every row of the windows ``event``'s time closes, as one list: what
        :meth:`advance` hands over one window at a time (the worker takes them from there first)."""
        return [row for window in self.advance(event) for row in window]

    def finish(self, cluster_name: str, at: int | None = None) -> list[R]:
        """Close every window up to the one holding ``at`` (default: the last instant seen)."""
        cluster = self._clusters.get(cluster_name)
        if cluster is None:
            return []
        self._changed.add(("cluster", cluster_name))
        self._settle(cluster)
        end = self.windows.start_of(max(cluster.instant, at or cluster.instant)) + self.windows.size_ms
        rows: list[R] = []
        while cluster.window_start < end:
            rows += self._close_window(cluster)
        return rows

    def _close_window(self, cluster: W) -> list[R]:
        """The rows of the cluster's current window; opens the next."""
        start = cluster.window_start
        end = start + self.windows.size_ms
        self._changed.add(("cluster", cluster.name))  # a commit may come between two windows
        rows = self._window_rows(cluster, start, end)
        cluster.window_start = end
        return rows


class HeldFields(TypedDict):
    """The fields of a row about GPUs held over its window (cluster, node and workload rows)."""

    window_start: datetime
    window_end: datetime
    gpus_allocated_avg: float
    gpus_allocated_max: float
    gpus_allocated_end: float


def held_fields(series: HeldAmount, start: int, end: int) -> HeldFields:
    """Close ``series``'s window ``[start, end)`` (:meth:`HeldAmount.close`) into a row's fields."""
    mean, maximum, last = series.close(end, end - start)
    return HeldFields(
        window_start=from_ms(start),
        window_end=from_ms(end),
        gpus_allocated_avg=mean,
        gpus_allocated_max=maximum,
        gpus_allocated_end=last,
    )
