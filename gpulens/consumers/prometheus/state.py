"""The newest value of every exported series, as the derived topics tell it.

"Newest" is by event time (window start, sample time), not by arrival: a late or replayed
row of an older window never hides a newer one. The consuming thread applies records while
the HTTP thread takes snapshots, hence the lock; each hold is one record, one snapshot or one
checkpoint's lookup, never a whole poll batch.

Every series has a key, ``(kind, *labels)``, and the row that is its value, kept with the
bytes it arrived as (its wire format: a checkpoint writes them as they are, encoding a GPU
sample batch again would cost about three times its decoding); the state names the keys that
changed since it was last asked, so that a checkpoint writes only those, and takes rows back
by key at a restart (see :mod:`gpulens.consumers.prometheus.checkpointing`):

- ``("cluster", cluster)``: the newest :class:`ClusterGpuAllocation`;
- ``("node", cluster, node)``: the newest :class:`NodeGpuAllocation`;
- ``("workload", cluster, uid)``: the newest :class:`WorkloadGpuUsage` (gone once it ended);
- ``("gpus", cluster, node)``: the newest :class:`GpuSampleBatch`;
- ``("alert", cluster, alert, entity)``: the :class:`Alert` that opened it (gone once resolved);
- ``("alert-name", cluster, alert)``: the newest :class:`Alert` of that name, whatever its state:
  it keeps a name whose alerts all resolved exported with 0;
- ``("idle", cluster, node, device, workload uid)``: the newest :class:`IdleGpuHours` of that
  GPU and owner; only those of the cluster's newest window are shown (and kept past a scrape).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from operator import attrgetter
from typing import Any

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

_BY_WINDOW: Callable[[Any], datetime] = attrgetter("window_start")
_BY_EVENT_TIME: Callable[[Any], datetime] = attrgetter("event_time")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one scrape shows."""

    clusters: list[ClusterGpuAllocation]
    nodes: list[NodeGpuAllocation]
    workloads: list[WorkloadGpuUsage]
    gpus: list[GpuSampleBatch]
    alerts_open: dict[tuple[str, str], int]
    """Open alerts per (cluster, alert name); 0 for a name whose alerts all resolved."""
    idle: list[IdleGpuHours]
    """The rows of each cluster's newest idle_gpu_hours window."""


class LatestState:
    """Keeps the newest row per series; records of other types are ignored."""

    def __init__(self, *, workload_max_age_windows: int = 2) -> None:
        self._max_age_windows = workload_max_age_windows
        self._lock = threading.Lock()
        self._clusters: dict[SeriesKey, ClusterGpuAllocation] = {}
        self._nodes: dict[SeriesKey, NodeGpuAllocation] = {}
        self._workloads: dict[SeriesKey, WorkloadGpuUsage] = {}
        self._newest_workload_end: dict[str, float] = {}
        self._gpus: dict[SeriesKey, GpuSampleBatch] = {}
        self._open: dict[SeriesKey, Alert] = {}
        self._alert_names: dict[SeriesKey, Alert] = {}
        self._idle: dict[SeriesKey, IdleGpuHours] = {}
        self._newest_idle: dict[str, datetime] = {}
        self._tables: dict[str, dict[SeriesKey, Any]] = {
            "cluster": self._clusters,
            "node": self._nodes,
            "workload": self._workloads,
            "gpus": self._gpus,
            "alert": self._open,
            "alert-name": self._alert_names,
            "idle": self._idle,
        }
        self._wire: dict[SeriesKey, bytes] = {}
        """The bytes each row arrived as, where known."""
        self._changed: set[SeriesKey] = set()

    def apply(self, record: Record, wire: bytes | None = None) -> None:
        """Take ``record`` (arrived as ``wire``) into the state if it is newer than what its
        series holds."""
        with self._lock:
            match record:
                case ClusterGpuAllocation():
                    self._newer(self._clusters, ("cluster", record.cluster), record, wire, _BY_WINDOW)
                case NodeGpuAllocation():
                    self._newer(self._nodes, ("node", record.cluster, record.node), record, wire, _BY_WINDOW)
                case WorkloadGpuUsage():
                    key = ("workload", record.cluster, record.workload_uid)
                    self._newer(self._workloads, key, record, wire, _BY_WINDOW)
                    self._workload_end(record)
                case GpuSampleBatch():
                    key = ("gpus", record.cluster, record.node)
                    self._newer(self._gpus, key, record, wire, _BY_EVENT_TIME)
                case IdleGpuHours():
                    gpu = (record.cluster, record.node, record.device_id)
                    self._newer(self._idle, ("idle", *gpu, record.workload_uid), record, wire, _BY_WINDOW)
                    self._idle_window(record)
                case Alert():
                    name = ("alert-name", record.cluster, record.alert)
                    entity = ("alert", record.cluster, record.alert, record.entity)
                    self._take(self._alert_names, name, record, wire)
                    if record.state == AlertState.OPENED:
                        self._take(self._open, entity, record, wire)
                    elif entity in self._open:
                        self._drop(self._open, entity)

    def _newer(
        self,
        table: dict[SeriesKey, Any],
        key: SeriesKey,
        row: Record,
        wire: bytes | None,
        when: Callable[[Any], datetime],
    ) -> None:
        old = table.get(key)
        if old is None or when(row) >= when(old):
            self._take(table, key, row, wire)

    def _take(self, table: dict[SeriesKey, Any], key: SeriesKey, row: Record, wire: bytes | None) -> None:
        table[key] = row
        if wire is None:
            self._wire.pop(key, None)
        else:
            self._wire[key] = wire
        self._changed.add(key)

    def _drop(self, table: dict[SeriesKey, Any], key: SeriesKey) -> None:
        del table[key]
        self._wire.pop(key, None)
        self._changed.add(key)

    def _workload_end(self, row: WorkloadGpuUsage) -> None:
        end = row.window_end.timestamp()
        self._newest_workload_end[row.cluster] = max(end, self._newest_workload_end.get(row.cluster, end))

    def _idle_window(self, row: IdleGpuHours) -> None:
        newest = self._newest_idle.get(row.cluster)
        self._newest_idle[row.cluster] = row.window_start if newest is None else max(newest, row.window_start)

    def snapshot(self) -> Snapshot:
        """The current series; workloads that ended are dropped here, for good."""
        with self._lock:
            for key, row in list(self._workloads.items()):
                if self._ended(row):
                    self._drop(self._workloads, key)
            for key, idle in list(self._idle.items()):
                if idle.window_start < self._newest_idle[idle.cluster]:
                    self._drop(self._idle, key)
            alerts_open = {(key[1], key[2]): 0 for key in self._alert_names}
            for key in self._open:
                alerts_open[(key[1], key[2])] += 1
            return Snapshot(
                clusters=list(self._clusters.values()),
                nodes=list(self._nodes.values()),
                workloads=list(self._workloads.values()),
                gpus=list(self._gpus.values()),
                alerts_open=alerts_open,
                idle=list(self._idle.values()),
            )

    def _ended(self, row: WorkloadGpuUsage) -> bool:
        window_s = (row.window_end - row.window_start).total_seconds()
        behind_s = self._newest_workload_end[row.cluster] - row.window_end.timestamp()
        return behind_s > self._max_age_windows * window_s

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

    def rows(self, keys: Iterable[SeriesKey]) -> list[tuple[SeriesKey, Record | None, bytes | None]]:
        """The row of each key now (None: the series is gone) and the bytes it arrived as."""
        with self._lock:
            return [(key, self._tables[key[0]].get(key), self._wire.get(key)) for key in keys]

    def load(self, key: SeriesKey, row: Record, wire: bytes) -> None:
        """Take a checkpointed row back as the value of ``key`` (not counted as a change)."""
        with self._lock:
            self._tables[key[0]][key] = row
            self._wire[key] = wire
            if isinstance(row, WorkloadGpuUsage):
                self._workload_end(row)
            elif isinstance(row, IdleGpuHours):
                self._idle_window(row)
