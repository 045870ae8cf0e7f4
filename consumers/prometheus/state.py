"""The newest value of every exported series, as the derived topics tell it.

"Newest" is by event time (window start, sample time), not by arrival: a late or replayed
row of an older window never hides a newer one. The consuming thread applies records while
the HTTP thread takes snapshots, hence the lock.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass

from schemas.models import (
    Alert,
    AlertState,
    ClusterGpuAllocation,
    GpuSampleBatch,
    NodeGpuAllocation,
    Record,
    WorkloadGpuUsage,
)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one scrape shows."""

    clusters: list[ClusterGpuAllocation]
    nodes: list[NodeGpuAllocation]
    workloads: list[WorkloadGpuUsage]
    gpus: list[GpuSampleBatch]
    alerts_open: dict[tuple[str, str], int]
    """Open alerts per (cluster, alert name); 0 for a name whose alerts all resolved."""


class LatestState:
    """Keeps the newest row per series; records of other types are ignored."""

    def __init__(self, *, workload_max_age_windows: int = 2) -> None:
        self._max_age_windows = workload_max_age_windows
        self._lock = threading.Lock()
        self._clusters: dict[str, ClusterGpuAllocation] = {}
        self._nodes: dict[tuple[str, str], NodeGpuAllocation] = {}
        self._workloads: dict[tuple[str, str], WorkloadGpuUsage] = {}
        self._newest_workload_end: dict[str, float] = {}
        self._gpus: dict[tuple[str, str], GpuSampleBatch] = {}
        self._open: defaultdict[tuple[str, str], set[str]] = defaultdict(set)

    def apply(self, record: Record) -> None:
        """Take ``record`` into the state if it is newer than what its series holds."""
        with self._lock:
            match record:
                case ClusterGpuAllocation():
                    old = self._clusters.get(record.cluster)
                    if old is None or record.window_start >= old.window_start:
                        self._clusters[record.cluster] = record
                case NodeGpuAllocation():
                    key = (record.cluster, record.node)
                    old_node = self._nodes.get(key)
                    if old_node is None or record.window_start >= old_node.window_start:
                        self._nodes[key] = record
                case WorkloadGpuUsage():
                    self._apply_workload(record)
                case GpuSampleBatch():
                    key = (record.cluster, record.node)
                    old_batch = self._gpus.get(key)
                    if old_batch is None or record.event_time >= old_batch.event_time:
                        self._gpus[key] = record
                case Alert():
                    entities = self._open[(record.cluster, record.alert)]
                    if record.state == AlertState.OPENED:
                        entities.add(record.entity)
                    else:
                        entities.discard(record.entity)

    def _apply_workload(self, row: WorkloadGpuUsage) -> None:
        key = (row.cluster, row.workload_uid)
        old = self._workloads.get(key)
        if old is None or row.window_start >= old.window_start:
            self._workloads[key] = row
        end = row.window_end.timestamp()
        self._newest_workload_end[row.cluster] = max(end, self._newest_workload_end.get(row.cluster, end))

    def snapshot(self) -> Snapshot:
        """The current series; workloads that ended are dropped here, for good."""
        with self._lock:
            for key, row in list(self._workloads.items()):
                if self._ended(row):
                    del self._workloads[key]
            return Snapshot(
                clusters=list(self._clusters.values()),
                nodes=list(self._nodes.values()),
                workloads=list(self._workloads.values()),
                gpus=list(self._gpus.values()),
                alerts_open={key: len(entities) for key, entities in self._open.items()},
            )

    def _ended(self, row: WorkloadGpuUsage) -> bool:
        window_s = (row.window_end - row.window_start).total_seconds()
        behind_s = self._newest_workload_end[row.cluster] - row.window_end.timestamp()
        return behind_s > self._max_age_windows * window_s
