"""The newest value of every exported series, as the derived topics tell it.

"Newest" is by event time (window start, sample time), not by arrival: a late or replayed
row of an older window never hides a newer one. The consuming thread applies records while
the HTTP thread takes snapshots, hence the lock; each hold is one record, one snapshot or one
checkpoint's lookup, never a whole poll batch.

Every series has a key, ``(kind, *labels)``, and holds a :class:`Held`: the row's event time,
the few values a scrape shows of it (a view, its strings interned: names repeat across series)
and the bytes it arrived as (its wire format: a checkpoint writes them as they are, encoding a
GPU sample batch again would cost about three times its decoding). Not the decoded row: at
100,000 GPUs, an hour in, 12,500 node, 25,000 workload and 100,000 idle rows took 213 MB
decoded with their bytes, 75 MB held so (``python -m bench.exporter_memory``). The state names
the keys that changed since it was last asked, so that a checkpoint writes only those, and
takes rows back by key at a restart (see :mod:`gpulens.consumers.prometheus.checkpointing`):

- ``("cluster", cluster)``: the newest :class:`ClusterGpuAllocation`;
- ``("node", cluster, node)``: the newest :class:`NodeGpuAllocation`;
- ``("workload", cluster, uid)``: the newest :class:`WorkloadGpuUsage` (gone once it ended);
- ``("gpus", cluster, node)``: the newest :class:`GpuSampleBatch` (kept whole: the per-GPU mode
  shows most of its fields, and is for small clusters);
- ``("alert", cluster, alert, entity)``: the :class:`Alert` that opened it (gone once resolved);
- ``("alert-name", cluster, alert)``: the newest :class:`Alert` of that name, whatever its state:
  it keeps a name whose alerts all resolved exported with 0;
- ``("idle", cluster, node, device, workload uid)``: the newest :class:`IdleGpuHours` of that
  GPU and owner; only those of the cluster's newest window are shown (and kept past a scrape).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from gpulens.schemas.model.models import (
    Alert,
    AlertState,
    ClusterGpuAllocation,
    GpuSampleBatch,
    IdleGpuHours,
    NodeGpuAllocation,
    Record,
    WorkloadGpuUsage,
)

SeriesKey = tuple[str, ...]
"""``(kind, *labels)``: one exported series, or one open alert."""

KIND_MODELS: dict[str, type[Record]] = {
    "cluster": ClusterGpuAllocation,
    "node": NodeGpuAllocation,
    "workload": WorkloadGpuUsage,
    "gpus": GpuSampleBatch,
    "alert": Alert,
    "alert-name": Alert,
    "idle": IdleGpuHours,
}
"""The row type of each kind of key."""

_HELD_MODELS = tuple(set(KIND_MODELS.values()))

_name = sys.intern
"""Labels repeat across series (a cluster, a namespace, a node's 8 GPUs, a workload's GPUs): one
copy of each."""


class ClusterView(NamedTuple):
    """What a scrape shows of a :class:`ClusterGpuAllocation` (its fields, same names)."""

    cluster: str
    allocation_rate_avg: float | None
    gpu_capacity: float
    gpus_allocated_end: float
    pods_pending_end: int


class NodeView(NamedTuple):
    """What a scrape shows of a :class:`NodeGpuAllocation`."""

    cluster: str
    node: str
    allocation_rate_avg: float | None


class WorkloadView(NamedTuple):
    """What a scrape shows of a :class:`WorkloadGpuUsage`, and its window (to age it out)."""

    cluster: str
    namespace: str
    workload_kind: str
    workload_name: str
    workload_uid: str
    utilization_avg: float | None
    gpus_allocated_end: float
    pods_active_end: int
    window_s: float
    window_end: float
    """POSIX seconds."""


class IdleView(NamedTuple):
    """What a scrape shows of an :class:`IdleGpuHours` row: its owner and hours."""

    cluster: str
    namespace: str
    workload_kind: str
    workload_name: str
    workload_uid: str
    active_gpu_hours: float
    idle_gpu_hours: float
    memory_idle_gpu_hours: float
    unmeasured_gpu_hours: float
    unallocated_gpu_hours: float


class Held(NamedTuple):
    """One series' value."""

    when: float
    """Its row's event time (window start, sample time), POSIX seconds: newer rows replace it."""
    view: Any
    """What a scrape shows of the row (a view above; a sample batch as it is)."""
    source: bytes | Record
    """The bytes the row arrived as, or the row where it came without them (encoded when
    checkpointed)."""


def held(record: Record, wire: bytes | None) -> Held:
    """The value of ``record``'s series (arrived as ``wire``)."""
    source = record if wire is None else wire
    match record:
        case ClusterGpuAllocation():
            view: Any = ClusterView(
                _name(record.cluster),
                record.allocation_rate_avg,
                record.gpu_capacity,
                record.gpus_allocated_end,
                record.pods_pending_end,
            )
            return Held(record.window_start.timestamp(), view, source)
        case NodeGpuAllocation():
            view = NodeView(_name(record.cluster), _name(record.node), record.allocation_rate_avg)
            return Held(record.window_start.timestamp(), view, source)
        case WorkloadGpuUsage():
            start, end = record.window_start.timestamp(), record.window_end.timestamp()
            view = WorkloadView(
                *_owner(record),
                record.utilization_avg,
                record.gpus_allocated_end,
                record.pods_active_end,
                end - start,
                end,
            )
            return Held(start, view, source)
        case IdleGpuHours():
            view = IdleView(
                *_owner(record),
                record.active_gpu_hours,
                record.idle_gpu_hours,
                record.memory_idle_gpu_hours,
                record.unmeasured_gpu_hours,
                record.unallocated_gpu_hours,
            )
            return Held(record.window_start.timestamp(), view, source)
        case GpuSampleBatch():
            return Held(record.event_time.timestamp(), record, source)
        case Alert():
            return Held(record.event_time.timestamp(), None, source)  # its key says all a scrape shows
    raise TypeError(f"no series holds a {type(record).__name__}")


def _owner(row: WorkloadGpuUsage | IdleGpuHours) -> tuple[str, str, str, str, str]:
    return (
        _name(row.cluster),
        _name(row.namespace),
        _name(row.workload_kind),
        _name(row.workload_name),
        _name(row.workload_uid),
    )


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one scrape shows."""

    clusters: list[ClusterView]
    nodes: list[NodeView]
    workloads: list[WorkloadView]
    gpus: list[GpuSampleBatch]
    alerts_open: dict[tuple[str, str], int]
    """Open alerts per (cluster, alert name); 0 for a name whose alerts all resolved."""
    idle: list[IdleView]
    """The rows of each cluster's newest idle_gpu_hours window."""


class LatestState:
    """Keeps the newest row per series; records of other types are ignored."""

    def __init__(self, *, workload_max_age_windows: int = 2) -> None:
        self._max_age_windows = workload_max_age_windows
        self._lock = threading.Lock()
        self._clusters: dict[SeriesKey, Held] = {}
        self._nodes: dict[SeriesKey, Held] = {}
        self._workloads: dict[SeriesKey, Held] = {}
        self._newest_workload_end: dict[str, float] = {}
        self._gpus: dict[SeriesKey, Held] = {}
        self._open: dict[SeriesKey, Held] = {}
        self._alert_names: dict[SeriesKey, Held] = {}
        self._idle: dict[SeriesKey, Held] = {}
        self._newest_idle: dict[str, float] = {}
        self._tables: dict[str, dict[SeriesKey, Held]] = {
            "cluster": self._clusters,
            "node": self._nodes,
            "workload": self._workloads,
            "gpus": self._gpus,
            "alert": self._open,
            "alert-name": self._alert_names,
            "idle": self._idle,
        }
        self._changed: set[SeriesKey] = set()

    def apply(self, record: Record, wire: bytes | None = None) -> None:
        """Take ``record`` (arrived as ``wire``) into the state if it is newer than what its
        series holds."""
        if not isinstance(record, _HELD_MODELS):
            return
        value = held(record, wire)
        with self._lock:
            match record:
                case ClusterGpuAllocation():
                    self._newer(self._clusters, ("cluster", value.view.cluster), value)
                case NodeGpuAllocation():
                    self._newer(self._nodes, ("node", value.view.cluster, value.view.node), value)
                case WorkloadGpuUsage():
                    key = ("workload", value.view.cluster, value.view.workload_uid)
                    self._newer(self._workloads, key, value)
                    self._workload_end(value.view)
                case GpuSampleBatch():
                    self._newer(self._gpus, ("gpus", _name(record.cluster), _name(record.node)), value)
                case IdleGpuHours():
                    gpu = (value.view.cluster, _name(record.node), _name(record.device_id))
                    self._newer(self._idle, ("idle", *gpu, value.view.workload_uid), value)
                    self._idle_window(value.view.cluster, value.when)
                case Alert():
                    name = ("alert-name", record.cluster, record.alert)
                    entity = ("alert", record.cluster, record.alert, record.entity)
                    self._take(self._alert_names, name, value)
                    if record.state == AlertState.OPENED:
                        self._take(self._open, entity, value)
                    elif entity in self._open:
                        self._drop(self._open, entity)

    def _newer(self, table: dict[SeriesKey, Held], key: SeriesKey, value: Held) -> None:
        old = table.get(key)
        if old is None or value.when >= old.when:
            self._take(table, key, value)

    def _take(self, table: dict[SeriesKey, Held], key: SeriesKey, value: Held) -> None:
        table[key] = value
        self._changed.add(key)

    def _drop(self, table: dict[SeriesKey, Held], key: SeriesKey) -> None:
        del table[key]
        self._changed.add(key)

    def _workload_end(self, view: WorkloadView) -> None:
        newest = self._newest_workload_end.get(view.cluster, view.window_end)
        self._newest_workload_end[view.cluster] = max(view.window_end, newest)

    def _idle_window(self, cluster: str, start: float) -> None:
        self._newest_idle[cluster] = max(start, self._newest_idle.get(cluster, start))

    def snapshot(self) -> Snapshot:
        """The current series; workloads that ended are dropped here, for good."""
        with self._lock:
            for key, value in list(self._workloads.items()):
                if self._ended(value.view):
                    self._drop(self._workloads, key)
            for key, value in list(self._idle.items()):
                if value.when < self._newest_idle[value.view.cluster]:
                    self._drop(self._idle, key)
            alerts_open = {(key[1], key[2]): 0 for key in self._alert_names}
            for key in self._open:
                alerts_open[(key[1], key[2])] += 1
            return Snapshot(
                clusters=[value.view for value in self._clusters.values()],
                nodes=[value.view for value in self._nodes.values()],
                workloads=[value.view for value in self._workloads.values()],
                gpus=[value.view for value in self._gpus.values()],
                alerts_open=alerts_open,
                idle=[value.view for value in self._idle.values()],
            )

    def _ended(self, view: WorkloadView) -> bool:
        behind_s = self._newest_workload_end[view.cluster] - view.window_end
        return behind_s > self._max_age_windows * view.window_s

    # --- checkpoints -------------------------------------------------------------------------

    def changed(self) -> set[SeriesKey]:
        """Keys changed since the last call (the caller takes the set; a fresh one starts)."""
        with self._lock:
            changed, self._changed = self._changed, set()
            return changed

    def live(self) -> list[SeriesKey]:
        """Every key that has a row now."""
        with self._lock:
            return [key for table in self._tables.values() for key in table]

    def rows(self, keys: Iterable[SeriesKey]) -> list[tuple[SeriesKey, bytes | Record | None]]:
        """What each key holds now: the bytes its row arrived as, the row where it came without
        them, None where the series is gone."""
        with self._lock:
            values = [(key, self._tables[key[0]].get(key)) for key in keys]
        return [(key, None if value is None else value.source) for key, value in values]

    def load(self, key: SeriesKey, row: Record, wire: bytes) -> None:
        """Take a checkpointed row back as the value of ``key`` (not counted as a change)."""
        value = held(row, wire)
        with self._lock:
            self._tables[key[0]][key] = value
            if isinstance(value.view, WorkloadView):
                self._workload_end(value.view)
            elif isinstance(value.view, IdleView):
                self._idle_window(value.view.cluster, value.when)
