"""GPU allocation over tumbling windows, per cluster and per node, in event time.

Definitions (DESIGN.md): a pod holds GPUs while bound, Running and not deleted; events of
one instant are applied together, so an amount "at an instant" is the amount after all of
that instant's events; a window ``[start, end)`` reports the time-weighted mean, the largest
amount at any instant, and the amount at its end; windows without events still get their
row (state carries over), handed over one window at a time by :meth:`AllocationAggregator.advance`
so that a long gap is never one list. Node rows are written for nodes that held GPUs or changed
in the window; a node missing from a window held nothing and did not change.

Records must arrive in non-decreasing event time per cluster (the runner merges partitions
by event time); an earlier one raises :class:`LateEvent`, and the caller dead-letters it. How
time moves, windows close and state is keyed is the aggregators' shared skeleton
(:mod:`gpulens.pipeline.aggregating`); this module says what is counted.

State is checkpointed key by key (:class:`~gpulens.pipeline.checkpointing.Stateful`): ``["cluster", c]``
(window, instant, cluster series and counts), ``["pod", c, uid]`` and ``["node", c, name]``
(the node's state, its window series and whether it changed in the window).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from gpulens.pipeline.aggregating import BaseWindowedAggregator, held_fields
from gpulens.pipeline.checkpointing import StateKey
from gpulens.pipeline.windows import HeldAmount, TumblingWindows, milli, to_ms
from gpulens.schemas.model.ids import event_id
from gpulens.schemas.model.models import (
    ChangeType,
    ClusterGpuAllocation,
    ClusterOverview,
    Event,
    GpuSampleBatch,
    NodeEvent,
    NodeGpuAllocation,
    PodEvent,
    Watermark,
)
from gpulens.schemas.wire.sample_columns import SampleColumns, columns


@dataclass(slots=True)
class _Pod:
    amount: int
    """milli-GPUs."""
    node: str | None
    holding: bool
    pending: bool


@dataclass(slots=True)
class _Node:
    allocatable: float = 0.0
    available: bool = False
    """Ready and schedulable: counts toward capacity."""
    model: str | None = None
    held: int = 0
    running: int = 0
    exists: bool = False
    ready: bool = False


@dataclass
class _Cluster:
    name: str
    window_start: int
    instant: int
    series: HeldAmount
    pods: dict[str, _Pod] = field(default_factory=dict)
    nodes: dict[str, _Node] = field(default_factory=dict)
    node_series: dict[str, HeldAmount] = field(default_factory=dict)
    touched: set[str] = field(default_factory=set)
    """Nodes whose amount changed at the current instant."""
    changed_in_window: set[str] = field(default_factory=set)
    held: int = 0
    running: int = 0
    pending: int = 0
    util_sum: float = 0.0
    util_count: int = 0

    @property
    def capacity(self) -> float:
        return sum(n.allocatable for n in self.nodes.values() if n.available)


AllocationRow = ClusterGpuAllocation | NodeGpuAllocation | ClusterOverview


class AllocationAggregator(BaseWindowedAggregator[_Cluster, AllocationRow]):
    """cluster_gpu_allocation and node_gpu_allocation rows from pod and node events."""

    def __init__(self, windows: TumblingWindows, *, per_node: bool = True, overview: bool = False) -> None:
        super().__init__(windows)
        self.per_node = per_node
        self.overview = overview
        """Also write cluster_overview rows (then GPU samples count toward utilization)."""

    def process(self, event: Event | SampleColumns) -> list[AllocationRow]:
        """Apply a pod, node or sample event, or close windows on a final watermark."""
        if self._moves_time(event):
            return self.apply(event)
        if isinstance(event, Watermark) and event.final:
            return self._closed_by(event) + self.finish(event.cluster, to_ms(event.event_time))
        return []

    def apply(self, event: PodEvent | NodeEvent | GpuSampleBatch | SampleColumns) -> list[AllocationRow]:
        """Apply one event; returns the rows of the windows its time closed (all of them:
        the worker takes them from :meth:`advance` one window at a time first)."""
        rows = self._closed_by(event)
        cluster = self._enter(event)
        if isinstance(event, PodEvent):
            self._apply_pod(cluster, event)
        elif isinstance(event, NodeEvent):
            self._apply_node(cluster, event)
        else:
            self._samples(cluster, columns(event)[1])
        return rows

    def process_samples(self, run: Sequence[SampleColumns]) -> list[AllocationRow] | None:
        """A run of one cluster's sample batches, in event-time order, applied as one by one
        would (None, nothing applied, where it cannot: :meth:`_run_cluster`). Samples close no
        window here and move no amount: time moves once, to the last batch's instant."""
        cluster = self._run_cluster(run) if self.overview else None
        if cluster is None:
            return None
        self._move(cluster, run[-1].event_ms)
        for batch in run:
            self._samples(cluster, batch.utilizations)  # batch by batch: the same float sums
        return []

    @staticmethod
    def _samples(cluster: _Cluster, utilizations: list[float | None]) -> None:
        values = [utilization for utilization in utilizations if utilization is not None]
        cluster.util_sum += sum(values)
        cluster.util_count += len(values)

    def _closes_windows(self, event: Event | SampleColumns) -> bool:
        return self._moves_time(event) or (isinstance(event, Watermark) and event.final)

    def _moves_time(
        self, event: Event | SampleColumns
    ) -> TypeGuard[PodEvent | NodeEvent | GpuSampleBatch | SampleColumns]:
        samples = self.overview and isinstance(event, GpuSampleBatch | SampleColumns)
        return isinstance(event, PodEvent | NodeEvent) or samples

    def _open(self, name: str, at: int) -> _Cluster:
        start = self.windows.start_of(at)
        return _Cluster(name, start, at, HeldAmount(since=start))

    # --- state changes ----------------------------------------------------------------------

    def _apply_pod(self, cluster: _Cluster, event: PodEvent) -> None:
        self._changed.add(("pod", cluster.name, event.uid))
        old = cluster.pods.pop(event.uid, None)
        if old is not None:
            self._count(cluster, old, -1)
        if event.type != ChangeType.DELETED:
            new = _Pod(
                amount=milli(event.gpu_amount),
                node=event.node,
                holding=event.holds_gpus,
                pending=event.node is None and event.phase == "Pending" and event.gpu_amount > 0,
            )
            cluster.pods[event.uid] = new
            self._count(cluster, new, +1)

    def _count(self, cluster: _Cluster, pod: _Pod, sign: int) -> None:
        if pod.pending:
            cluster.pending += sign
        if not pod.holding:
            return
        cluster.held += sign * pod.amount
        cluster.running += sign
        if pod.node is not None:
            node = cluster.nodes.setdefault(pod.node, _Node())
            node.held += sign * pod.amount
            node.running += sign
            cluster.touched.add(pod.node)
            self._changed.add(("node", cluster.name, pod.node))

    def _apply_node(self, cluster: _Cluster, event: NodeEvent) -> None:
        node = cluster.nodes.setdefault(event.node, _Node())
        deleted = event.type == ChangeType.DELETED
        node.allocatable = 0.0 if deleted else event.gpus_allocatable
        node.available = not deleted and event.ready and event.schedulable
        node.exists, node.ready = not deleted, event.ready
        node.model = event.gpu_model or node.model
        cluster.touched.add(event.node)
        self._changed.add(("node", cluster.name, event.node))

    # --- windows ----------------------------------------------------------------------------

    def _settle(self, cluster: _Cluster) -> None:
        cluster.series.settle(cluster.instant, cluster.held)
        if not self.per_node:
            cluster.touched.clear()
            return
        for name in cluster.touched:
            self._changed.add(("node", cluster.name, name))
            series = cluster.node_series.get(name)
            if series is None:
                series = cluster.node_series[name] = HeldAmount(since=cluster.window_start)
            series.settle(cluster.instant, cluster.nodes[name].held)
            cluster.changed_in_window.add(name)
        cluster.touched.clear()

    def _window_rows(self, cluster: _Cluster, start: int, end: int) -> list[AllocationRow]:
        """The window's rows: cluster, overview, nodes."""
        if self.per_node:  # closing changes every node series
            self._changed.update(("node", cluster.name, name) for name in cluster.node_series)
        row = self._cluster_row(cluster, start, end)
        rows: list[AllocationRow] = [row]
        if self.overview:
            rows.append(self._overview_row(cluster, row))
        if self.per_node:
            rows += self._node_rows(cluster, start, end)
        return rows

    def _cluster_row(self, cluster: _Cluster, start: int, end: int) -> ClusterGpuAllocation:
        held = held_fields(cluster.series, start, end)
        capacity = cluster.capacity
        return ClusterGpuAllocation(
            event_id=event_id(cluster.name, "cluster_gpu_allocation", start, end),
            cluster=cluster.name,
            gpu_capacity=capacity,
            allocation_rate_avg=held["gpus_allocated_avg"] / capacity if capacity else None,
            pods_running_end=cluster.running,
            pods_pending_end=cluster.pending,
            **held,
        )

    def _overview_row(self, cluster: _Cluster, allocation: ClusterGpuAllocation) -> ClusterOverview:
        nodes = [n for n in cluster.nodes.values() if n.exists]
        healthy = [n for n in nodes if n.available]
        gpu_nodes = [n for n in healthy if n.allocatable > 0]
        row = ClusterOverview(
            event_id=event_id(cluster.name, "cluster_overview", allocation.window_start.isoformat()),
            cluster=cluster.name,
            window_start=allocation.window_start,
            window_end=allocation.window_end,
            nodes_total=len(nodes),
            nodes_healthy=len(healthy),
            nodes_not_ready=sum(1 for n in nodes if not n.ready),
            nodes_cordoned=sum(1 for n in nodes if n.ready and not n.available),
            nodes_fully_idle=sum(1 for n in gpu_nodes if n.held == 0),
            nodes_partially_idle=sum(1 for n in gpu_nodes if 0 < n.held < milli(n.allocatable)),
            nodes_busy=sum(1 for n in gpu_nodes if n.held >= milli(n.allocatable)),
            gpu_capacity=allocation.gpu_capacity,
            gpus_allocated_avg=allocation.gpus_allocated_avg,
            allocation_rate_avg=allocation.allocation_rate_avg,
            gpu_utilization_avg=cluster.util_sum / cluster.util_count if cluster.util_count else None,
            gpu_samples=cluster.util_count,
        )
        cluster.util_sum, cluster.util_count = 0.0, 0
        return row

    def _node_rows(self, cluster: _Cluster, start: int, end: int) -> list[AllocationRow]:
        rows: list[AllocationRow] = []
        for name in sorted(cluster.node_series):
            series = cluster.node_series[name]
            if series.peak == 0 and name not in cluster.changed_in_window:
                del cluster.node_series[name]  # idle and unchanged: no row until it changes
                continue
            held = held_fields(series, start, end)
            node = cluster.nodes[name]
            capacity = node.allocatable if node.available else 0.0
            rows.append(
                NodeGpuAllocation(
                    event_id=event_id(cluster.name, name, "node_gpu_allocation", start, end),
                    cluster=cluster.name,
                    node=name,
                    gpu_model=node.model,
                    gpu_capacity=capacity,
                    allocation_rate_avg=held["gpus_allocated_avg"] / capacity if capacity else None,
                    pods_running_end=node.running,
                    **held,
                )
            )
        cluster.changed_in_window.clear()
        return rows

    # --- checkpoint: ["pod", c, uid] and ["node", c, name] besides ["cluster", c] --------------

    def _keys(self, cluster: _Cluster) -> Iterator[StateKey]:
        yield from (("pod", cluster.name, uid) for uid in cluster.pods)
        yield from (("node", cluster.name, node) for node in cluster.nodes)

    def _dump(self, cluster: _Cluster, key: StateKey) -> Any:
        if key[0] == "cluster":
            return [
                cluster.window_start, cluster.instant, _series(cluster.series), cluster.held,
                cluster.running, cluster.pending, cluster.util_sum, cluster.util_count,
            ]  # fmt: skip
        if key[0] == "pod":
            pod = cluster.pods.get(key[2])
            return None if pod is None else [pod.amount, pod.node, pod.holding, pod.pending]
        node = cluster.nodes.get(key[2])
        if node is None:
            return None
        series = cluster.node_series.get(key[2])
        return [
            node.allocatable, node.available, node.model, node.held, node.running, node.exists,
            node.ready, None if series is None else _series(series), key[2] in cluster.changed_in_window,
            key[2] in cluster.touched,
        ]  # fmt: skip

    def _load(self, cluster: _Cluster, key: StateKey, value: Any) -> None:
        if key[0] == "cluster":
            cluster.window_start, cluster.instant, series, *rest = value
            cluster.series = HeldAmount(*series)
            cluster.held, cluster.running, cluster.pending, cluster.util_sum, cluster.util_count = rest
        elif key[0] == "pod":
            cluster.pods[key[2]] = _Pod(*value)
        else:
            *fields, series, changed, touched = value
            cluster.nodes[key[2]] = _Node(*fields)
            if series is not None:
                cluster.node_series[key[2]] = HeldAmount(*series)
            if changed:
                cluster.changed_in_window.add(key[2])
            if touched:
                cluster.touched.add(key[2])


def _series(series: HeldAmount) -> list[int]:
    return [series.since, series.value, series.integral, series.maximum]
