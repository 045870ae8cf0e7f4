"""The worker's operators: what each reads, what it writes, and how it knows what it wrote.

An operator is pure event-time logic (allocation windows, alerts, device changelog) behind
one small contract, so the worker that runs them (merge, transactions, restarts) is written
once. Each operator's state is checkpointed (:mod:`gpulens.pipeline.checkpointing`): a restart
restores it instead of re-reading the inputs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

from gpulens.pipeline.alerting import AlertDetector, AlertRules
from gpulens.pipeline.allocation import AllocationAggregator
from gpulens.pipeline.checkpointing import Stateful, StateKey
from gpulens.pipeline.device_changes import diff, pack, packed_json, unpack
from gpulens.pipeline.holders import SharedHolders
from gpulens.pipeline.idle_owners import IdleOwners, IdleRules
from gpulens.pipeline.latest_samples import LatestSamples
from gpulens.pipeline.pending_waits import PendingWaits
from gpulens.pipeline.settings import PipelineSettings
from gpulens.pipeline.state_tables import STATE_TOPIC_OF, StateTables, Tombstone
from gpulens.pipeline.windows import TumblingWindows
from gpulens.pipeline.workload_usage import WorkloadUsage
from gpulens.schemas.model.models import (
    ClusterGpuAllocation,
    ClusterOverview,
    DeviceInventory,
    Event,
    GpuSampleBatch,
    Record,
)
from gpulens.schemas.model.topics import (
    ALERTS,
    CLUSTER_ALLOCATION,
    CLUSTER_OVERVIEW,
    CONTAINERS,
    DEVICE_CHANGELOG,
    DEVICE_INVENTORY,
    GPU_HEALTH,
    GPU_SAMPLES,
    IDLE_GPU_HOURS,
    NODE_ALLOCATION,
    NODES,
    PENDING_PODS,
    PODS,
    STATE_GPU_SAMPLES,
    WATERMARKS,
    WORKLOAD_USAGE,
    WORKLOADS,
    TopicSpec,
)
from gpulens.schemas.wire.sample_columns import SampleColumns

INPUT_ORDER = (NODES, DEVICE_INVENTORY, CONTAINERS, WORKLOADS, PODS, GPU_HEALTH, GPU_SAMPLES, WATERMARKS)
"""At one instant, records are applied in this topic order (nodes before the pods on them, ...)."""

Row = Record | Tombstone | SampleColumns
"""What an operator emits: a record, the end of an entity on a compacted topic, or a GPU sample
batch read by column, republished as it was read (`latest`)."""
Given = Event | SampleColumns
"""What an operator is given: an event, or a GPU sample batch the worker read by column
(:mod:`gpulens.schemas.wire.sample_columns`), which stands for the GpuSampleBatch it holds."""


class Operator(Protocol):
    """Event-time logic the worker runs."""

    name: str
    """Names its state log: ``gpulens.worker.<group>.<name>.changelog`` (and
    ``….<name>.hot.changelog``: :class:`~gpulens.pipeline.checkpointing.SplitsHotState`)."""

    @property
    def inputs(self) -> tuple[TopicSpec, ...]:
        """The topics it reads."""
        ...

    @property
    def state(self) -> Stateful:
        """What a restart restores instead of re-reading the inputs."""
        ...

    def advance(self, event: Given) -> Iterator[Sequence[Row]]:
        """The rows of the windows ``event``'s time closes, one window at a time, lazily (a day's
        gap is thousands of windows). State between two of them is a sound checkpoint: the
        worker may commit there and, after a restart, give ``event`` again, which closes only
        the windows left. ``process(event)`` afterwards returns only what the event itself causes."""
        ...

    def process(self, event: Given) -> Sequence[Row]:
        """Rows caused by ``event`` (raises LateEvent for an event older than applied time)."""
        ...

    def output(self, row: Row) -> TopicSpec:
        """The topic a row goes to."""
        ...


@runtime_checkable
class TakesSampleRuns(Protocol):
    """An operator that may take a run of GPU sample batches at once (the fleet's sample path:
    the worker's work per batch, not per run, was most of its time)."""

    def process_samples(self, run: Sequence[SampleColumns]) -> Sequence[Row] | None:
        """The rows of a run of one cluster's sample batches in event-time order, all applied as
        one by one would apply them; None, with nothing applied, where it cannot (a window closes
        within the run, ...): the worker then gives it the batches one by one."""
        ...


@runtime_checkable
class WritesCompacted(Protocol):
    """An operator writing compacted topics (:mod:`gpulens.pipeline.compaction`)."""

    @property
    def compacted(self) -> tuple[TopicSpec, ...]:
        """The compacted topics it writes."""
        ...


class _Unwindowed:
    """An operator without windows: its work per event is bounded, nothing to close first."""

    def advance(self, _event: Given) -> Iterator[Sequence[Row]]:
        return iter(())


class AllocationOperator:
    """cluster_gpu_allocation and node_gpu_allocation windows."""

    name = "allocation"

    def __init__(self, windows: TumblingWindows, *, per_node: bool, overview: bool = False) -> None:
        self.state = self._aggregator = AllocationAggregator(windows, per_node=per_node, overview=overview)
        self.inputs = (NODES, PODS, GPU_SAMPLES, WATERMARKS) if overview else (NODES, PODS, WATERMARKS)

    def advance(self, event: Given) -> Iterator[Sequence[Record]]:
        return self._aggregator.advance(event)

    def process(self, event: Given) -> Sequence[Record]:
        return self._aggregator.process(event)

    def process_samples(self, run: Sequence[SampleColumns]) -> Sequence[Record] | None:
        return self._aggregator.process_samples(run)

    def output(self, row: Row) -> TopicSpec:
        if isinstance(row, ClusterOverview):
            return CLUSTER_OVERVIEW
        return CLUSTER_ALLOCATION if isinstance(row, ClusterGpuAllocation) else NODE_ALLOCATION


class WorkloadUsageOperator:
    """workload_gpu_usage windows (Primus-Lens "GPU consumers")."""

    name = "workloads"
    inputs = (DEVICE_INVENTORY, CONTAINERS, PODS, GPU_SAMPLES, WATERMARKS)

    def __init__(self, windows: TumblingWindows, shared: SharedHolders | None = None) -> None:
        self.state = self._usage = WorkloadUsage(windows, shared)

    def advance(self, event: Given) -> Iterator[Sequence[Record]]:
        return self._usage.advance(event)

    def process(self, event: Given) -> Sequence[Record]:
        return self._usage.process(event)

    def process_samples(self, run: Sequence[SampleColumns]) -> Sequence[Record] | None:
        return self._usage.process_samples(run)

    def output(self, _row: Row) -> TopicSpec:
        return WORKLOAD_USAGE


class IdleOwnersOperator:
    """idle_gpu_hours windows: each GPU's hours by owner and kind (active, idle, memory-idle, ...)."""

    name = "idle"
    inputs = (DEVICE_INVENTORY, CONTAINERS, PODS, GPU_SAMPLES, WATERMARKS)

    def __init__(
        self, windows: TumblingWindows, rules: IdleRules, shared: SharedHolders | None = None
    ) -> None:
        self.state = self._owners = IdleOwners(windows, rules, shared)

    def advance(self, event: Given) -> Iterator[Sequence[Record]]:
        return self._owners.advance(event)

    def process(self, event: Given) -> Sequence[Record]:
        return self._owners.process(event)

    def output(self, _row: Row) -> TopicSpec:
        return IDLE_GPU_HOURS


class PendingWaitsOperator:
    """pending_gpu_pods: why each GPU pod waits, judged at window ends."""

    name = "pending"
    inputs = (NODES, PODS, WORKLOADS, WATERMARKS)

    def __init__(self, windows: TumblingWindows) -> None:
        self.state = self._waits = PendingWaits(windows)

    def advance(self, event: Given) -> Iterator[Sequence[Record]]:
        return self._waits.advance(event)

    def process(self, event: Given) -> Sequence[Record]:
        return self._waits.process(event)

    def output(self, _row: Row) -> TopicSpec:
        return PENDING_PODS


class AlertOperator(_Unwindowed):
    """GpuIdle, GpuPodPending, GpuPendingPileUp, NodeNotReady, GpuLost, GpuUnhealthy and
    GpuTelemetryStale alerts."""

    name = "alerts"
    inputs = (NODES, DEVICE_INVENTORY, CONTAINERS, PODS, GPU_HEALTH, GPU_SAMPLES)

    def __init__(self, rules: AlertRules, shared: SharedHolders | None = None) -> None:
        self.state = self._detector = AlertDetector(rules, shared)

    def process(self, event: Given) -> Sequence[Record]:
        return self._detector.process(event)

    def process_samples(self, run: Sequence[SampleColumns]) -> Sequence[Record] | None:
        return self._detector.process_samples(run)

    def output(self, _row: Row) -> TopicSpec:
        return ALERTS


class DeviceChangelogOperator(_Unwindowed):
    """DeviceChange records from successive inventories of each node.

    Its state, ``["inventory", cluster, node]``, is each node's last inventory as JSON; it is
    kept (packed: :func:`~gpulens.pipeline.device_changes.pack`) and written only when the
    devices changed, since an equal inventory diffs the same.
    """

    name = "changelog"
    inputs = (DEVICE_INVENTORY,)

    def __init__(self) -> None:
        self.state = self
        self._last: dict[tuple[str, str], bytes] = {}
        self._changed: set[StateKey] = set()

    def process(self, event: Given) -> Sequence[Record]:
        assert isinstance(event, DeviceInventory)
        key = (event.cluster, event.node)
        packed = self._last.get(key)
        changes = list(diff(None if packed is None else unpack(packed), event))
        if changes or packed is None:
            self._last[key] = pack(event)
            self._changed.add(("inventory", *key))
        return changes

    def output(self, _row: Row) -> TopicSpec:
        return DEVICE_CHANGELOG

    def changed(self) -> set[StateKey]:
        changed, self._changed = self._changed, set()
        return changed

    def live(self) -> Iterator[StateKey]:
        return (("inventory", *key) for key in self._last)

    def dump(self, key: StateKey) -> Any:
        packed = self._last.get((key[1], key[2]))
        return None if packed is None else packed_json(packed)

    def load(self, key: StateKey, value: Any) -> None:
        self._last[(key[1], key[2])] = pack(DeviceInventory.model_validate(value))


class LatestSamplesOperator(_Unwindowed):
    """Each node's newest GPU sample batch on a compacted topic, at most one per interval."""

    name = "latest"
    inputs = (GPU_SAMPLES,)
    compacted = (STATE_GPU_SAMPLES,)

    def __init__(self, every_ms: int) -> None:
        self.state = self._latest = LatestSamples(every_ms)

    def process(self, event: Given) -> Sequence[Row]:
        assert isinstance(event, GpuSampleBatch | SampleColumns)
        return self._latest.process(event)

    def output(self, _row: Row) -> TopicSpec:
        return STATE_GPU_SAMPLES


class StateOperator(_Unwindowed):
    """Compacted state topics: pods, nodes, device inventories, containers, workloads."""

    name = "state"
    inputs = (NODES, DEVICE_INVENTORY, CONTAINERS, WORKLOADS, PODS)
    compacted = tuple(STATE_TOPIC_OF.values())

    def __init__(self) -> None:
        self.state = self._tables = StateTables()

    def process(self, event: Given) -> Sequence[Row]:
        assert isinstance(event, Event)  # its inputs hold no GPU samples
        return self._tables.process(event)

    def output(self, row: Row) -> TopicSpec:
        if isinstance(row, Tombstone):
            return row.topic
        assert not isinstance(row, SampleColumns)  # its inputs hold no GPU samples
        return STATE_TOPIC_OF[type(row)]


def operators_for(pipeline: PipelineSettings) -> list[Operator]:
    """The operators of the chosen processors, in the order the worker runs them (one place, so
    `gpulens worker` and the throughput bench run the same)."""
    chosen, windows = pipeline.processors, TumblingWindows(pipeline.window_s * 1000)
    shared = SharedHolders()  # GPU names and holders: one table per cluster, not one per operator
    made: list[Operator] = []
    if "allocation" in chosen:
        made.append(AllocationOperator(windows, per_node=pipeline.per_node, overview=pipeline.overview))
    if "workloads" in chosen:
        made.append(WorkloadUsageOperator(windows, shared))
    if "idle" in chosen:
        rules = IdleRules(
            idle_below=pipeline.idle_below,
            compute_idle_below=pipeline.compute_idle_below,
            memory_floor_bytes=pipeline.memory_floor_mib * 1024 * 1024,
            sample_valid_ms=round(pipeline.sample_valid_s * 1000),
            owner_labels=pipeline.owner_labels,
        )
        made.append(IdleOwnersOperator(TumblingWindows(pipeline.idle_window_s * 1000), rules, shared))
    if "alerts" in chosen:
        made.append(
            AlertOperator(
                AlertRules(
                    pipeline.idle_below,
                    pipeline.idle_for,
                    pipeline.pending_for,
                    pipeline.stale_after,
                    pile_up_pods=pipeline.pile_up_pods,
                    pile_up_idle_gpus=pipeline.pile_up_idle_gpus,
                ),
                shared,
            )
        )
    if "changelog" in chosen:
        made.append(DeviceChangelogOperator())
    if "state" in chosen:
        made.append(StateOperator())
    if "pending" in chosen:
        made.append(PendingWaitsOperator(windows))
    if "latest" in chosen:
        made.append(LatestSamplesOperator(round(pipeline.latest_every_s * 1000)))
    return made
