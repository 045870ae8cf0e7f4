"""The worker's operators: what each reads, what it writes, and how it knows what it wrote.

An operator is pure event-time logic (allocation windows, alerts, device changelog) behind
one small contract, so the worker that runs them (merge, transactions, restarts) is written
once. ``remember``/``published`` let a restarted worker skip rows it published before the
crash: its rebuilt state may emit them again, on a different input record than the first run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from pipeline.alerting import AlertDetector, AlertRules
from pipeline.allocation import AllocationAggregator
from pipeline.device_changes import diff
from pipeline.state_tables import StateTables, Tombstone
from pipeline.windows import TumblingWindows, to_ms
from pipeline.workload_usage import WorkloadUsage
from schemas.models import (
    ClusterGpuAllocation,
    ClusterOverview,
    ContainerEvent,
    DeviceInventory,
    Event,
    NodeEvent,
    NodeGpuAllocation,
    PodEvent,
    Record,
    WorkloadState,
)
from schemas.topics import (
    ALERTS,
    CLUSTER_ALLOCATION,
    CLUSTER_OVERVIEW,
    CONTAINERS,
    DEVICE_CHANGELOG,
    DEVICE_INVENTORY,
    GPU_SAMPLES,
    NODE_ALLOCATION,
    NODES,
    PODS,
    STATE_CONTAINERS,
    STATE_INVENTORY,
    STATE_NODES,
    STATE_PODS,
    STATE_TOPICS,
    STATE_WORKLOADS,
    WATERMARKS,
    WORKLOAD_USAGE,
    WORKLOADS,
    TopicSpec,
    record_key,
)

INPUT_ORDER = (NODES, DEVICE_INVENTORY, CONTAINERS, WORKLOADS, PODS, GPU_SAMPLES, WATERMARKS)
"""At one instant, records are applied in this topic order (nodes before the pods on them, ...)."""

Row = Record | Tombstone
"""What an operator emits: a record, or the end of an entity on a compacted topic."""


class Operator(Protocol):
    """Event-time logic the worker runs."""

    name: str
    inputs: tuple[TopicSpec, ...]
    restore_from: tuple[TopicSpec, ...]
    """Output topics to read at start to learn what was already published."""
    skip_replayed: bool
    """Rows caused by a record processed before a restart were published then (each row
    follows from exactly one record, always the same one): drop them while replaying."""

    def process(self, event: Event) -> Sequence[Row]:
        """Rows caused by ``event`` (raises LateEvent for an event older than applied time)."""
        ...

    def output(self, row: Row) -> TopicSpec:
        """The topic a row goes to."""
        ...

    def remember(self, row: Row) -> None:
        """A row read back from ``restore_from`` at start (a Tombstone from a compacted topic)."""
        ...

    def published(self, row: Row) -> bool:
        """Whether ``row`` was published before a restart."""
        ...


class EventIdLedger:
    """Remembers published rows by event id (for low-volume outputs)."""

    skip_replayed = False

    def __init__(self) -> None:
        self._ids: set[str] = set()

    def remember(self, row: Record) -> None:
        self._ids.add(getattr(row, "event_id", ""))

    def published(self, row: Record) -> bool:
        return getattr(row, "event_id", None) in self._ids


class AllocationOperator:
    """cluster_gpu_allocation and node_gpu_allocation windows."""

    name = "allocation"
    restore_from = (CLUSTER_ALLOCATION,)
    skip_replayed = False

    def __init__(self, windows: TumblingWindows, *, per_node: bool, overview: bool = False) -> None:
        self._aggregator = AllocationAggregator(windows, per_node=per_node, overview=overview)
        self.inputs = (NODES, PODS, GPU_SAMPLES, WATERMARKS) if overview else (NODES, PODS, WATERMARKS)
        # Windows close in order per cluster, and a window's node rows share the cluster row's
        # transaction: the last cluster window published says what is done.
        self._published_until: dict[str, int] = {}

    def process(self, event: Event) -> Sequence[Record]:
        return self._aggregator.process(event)

    def output(self, row: Record) -> TopicSpec:
        if isinstance(row, ClusterOverview):
            return CLUSTER_OVERVIEW
        return CLUSTER_ALLOCATION if isinstance(row, ClusterGpuAllocation) else NODE_ALLOCATION

    def remember(self, row: Record) -> None:
        assert isinstance(row, ClusterGpuAllocation)
        start = to_ms(row.window_start)
        self._published_until[row.cluster] = max(start, self._published_until.get(row.cluster, start))

    def published(self, row: Record) -> bool:
        assert isinstance(row, ClusterGpuAllocation | NodeGpuAllocation | ClusterOverview)
        return to_ms(row.window_start) <= self._published_until.get(row.cluster, -1)


class WorkloadUsageOperator(EventIdLedger):
    """workload_gpu_usage windows (Primus-Lens "GPU consumers")."""

    name = "workloads"
    inputs = (DEVICE_INVENTORY, CONTAINERS, PODS, GPU_SAMPLES, WATERMARKS)
    restore_from = (WORKLOAD_USAGE,)

    def __init__(self, windows: TumblingWindows) -> None:
        super().__init__()
        self._usage = WorkloadUsage(windows)

    def process(self, event: Event) -> Sequence[Record]:
        return self._usage.process(event)

    def output(self, _row: Record) -> TopicSpec:
        return WORKLOAD_USAGE


class AlertOperator(EventIdLedger):
    """GpuIdle, GpuPodPending, NodeNotReady and GpuLost alerts."""

    name = "alerts"
    inputs = (NODES, DEVICE_INVENTORY, CONTAINERS, PODS, GPU_SAMPLES)
    restore_from = (ALERTS,)

    def __init__(self, rules: AlertRules) -> None:
        super().__init__()
        self._detector = AlertDetector(rules)

    def process(self, event: Event) -> Sequence[Record]:
        return self._detector.process(event)

    def output(self, _row: Record) -> TopicSpec:
        return ALERTS


class DeviceChangelogOperator(EventIdLedger):
    """DeviceChange records from successive inventories of each node."""

    name = "changelog"
    inputs = (DEVICE_INVENTORY,)
    restore_from = (DEVICE_CHANGELOG,)

    def __init__(self) -> None:
        super().__init__()
        self._last: dict[tuple[str, str], DeviceInventory] = {}

    def process(self, event: Event) -> Sequence[Record]:
        assert isinstance(event, DeviceInventory)
        key = (event.cluster, event.node)
        changes = list(diff(self._last.get(key), event))
        self._last[key] = event
        return changes

    def output(self, _row: Record) -> TopicSpec:
        return DEVICE_CHANGELOG


class StateOperator:
    """Compacted state topics: pods, nodes, device inventories, containers, workloads.

    Rows of records processed before a restart are dropped while replaying (compaction may
    have removed them from the topics, so reading back cannot tell). Rows read back at start
    also count as published, by event id, and a key whose newest value is a tombstone as
    deleted: a record processed again because its offset commit was not visible yet when
    the worker restarted publishes nothing twice.
    """

    name = "state"
    inputs = (NODES, DEVICE_INVENTORY, CONTAINERS, WORKLOADS, PODS)
    restore_from = STATE_TOPICS
    skip_replayed = True

    def __init__(self) -> None:
        self._tables = StateTables()
        self._published: set[tuple[str, bytes, str]] = set()
        """(topic, key, event id) of the rows read back."""
        self._gone: set[tuple[str, bytes]] = set()
        """(topic, key) whose newest published value is a tombstone."""

    def process(self, event: Event) -> Sequence[Row]:
        return self._tables.process(event)

    def output(self, row: Row) -> TopicSpec:
        if isinstance(row, Tombstone):
            return row.topic
        return STATE_OUTPUTS[type(row)]

    def remember(self, row: Row) -> None:
        if isinstance(row, Tombstone):
            self._gone.add((row.topic.name, row.key))
            return
        where = self._where(row)
        self._published.add((*where, getattr(row, "event_id", "")))
        self._gone.discard(where)

    def published(self, row: Row) -> bool:
        if isinstance(row, Tombstone):
            where = (row.topic.name, row.key)
            if where in self._gone:
                return True
            self._gone.add(where)
            return False
        where = self._where(row)
        if (*where, getattr(row, "event_id", "")) in self._published:
            return True
        self._gone.discard(where)
        return False

    def _where(self, row: Record) -> tuple[str, bytes]:
        spec = STATE_OUTPUTS[type(row)]
        return spec.name, record_key(spec, row)


STATE_OUTPUTS: dict[type[Record], TopicSpec] = {
    PodEvent: STATE_PODS,
    NodeEvent: STATE_NODES,
    DeviceInventory: STATE_INVENTORY,
    ContainerEvent: STATE_CONTAINERS,
    WorkloadState: STATE_WORKLOADS,
}
