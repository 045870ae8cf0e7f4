"""GPU consumers: per workload and window, GPUs held by its pods and how busy those GPUs were.

A pod belongs to the last link of its owner chain (pod -> ReplicaSet -> Deployment counts
for the Deployment); a bare pod is its own workload. GPUs held follow the DESIGN.md
definitions (time-weighted, events of one instant applied together); utilization is the
mean and max of the samples of GPUs its pods held when sampled (container -> GPU mapping).
Rows are written for workloads that held GPUs or were sampled in the window. Event time,
windows and state keys follow the aggregators' skeleton (:mod:`gpulens.pipeline.aggregating`).

State is checkpointed key by key: ``["cluster", c]`` (window, instant), ``["pod", c, uid]`` (its
workload and the milli-GPUs it holds), ``["usage", c, workload uid]`` (the window's series and
samples, and whether its amount changed at the current instant) and ``["holders", c, ...]``
(which pod holds which GPU, see :mod:`gpulens.pipeline.holders`). Every entry is bounded: the
workloads changed at the instant were once listed in the cluster's entry, and a 125,000-GPU
cluster's start (every pod at one instant) made it 1.1 MB, past the broker's record size.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain
from types import MappingProxyType
from typing import Any

from gpulens.pipeline.aggregating import BaseWindowedAggregator, NodeGroupedSnapshot, held_fields
from gpulens.pipeline.checkpointing import StateKey
from gpulens.pipeline.holders import GpuHolders, PodRef, SharedHolders
from gpulens.pipeline.state_tables import workload_chain
from gpulens.pipeline.windows import HeldAmount, TumblingWindows, milli
from gpulens.schemas.model.ids import event_id
from gpulens.schemas.model.models import (
    ChangeType,
    ContainerEvent,
    DeviceInventory,
    Event,
    GpuSampleBatch,
    PodEvent,
    Watermark,
    WorkloadGpuUsage,
)
from gpulens.schemas.wire.sample_columns import SampleColumns, columns


@dataclass(frozen=True, slots=True)
class _Workload:
    uid: str
    kind: str
    name: str
    namespace: str


@dataclass(slots=True)
class _Usage:
    series: HeldAmount
    held: int = 0
    pods: int = 0
    util_sum: float = 0.0
    util_count: int = 0
    util_max: float | None = None


@dataclass
class _Cluster:
    name: str
    window_start: int
    instant: int
    holders: GpuHolders
    """Shared with the worker's other operators that keep holders (:class:`SharedHolders`)."""
    pods: dict[str, tuple[_Workload, int]] = field(default_factory=dict)
    """uid of a pod holding GPUs -> (its workload, milli-GPUs)."""
    workload_of: dict[str, _Workload] = field(default_factory=dict)
    """uid of any known pod -> its workload (samples find workloads through it)."""
    usage: dict[str, _Usage] = field(default_factory=dict)
    workloads: dict[str, _Workload] = field(default_factory=dict)
    touched: set[str] = field(default_factory=set)


class WorkloadUsage(NodeGroupedSnapshot, BaseWindowedAggregator[_Cluster, WorkloadGpuUsage]):
    """workload_gpu_usage rows from pod, container, inventory and sample events."""

    hot_kinds = frozenset({"usage"})
    """Kinds checkpointed in a state log of their own (every sampled workload's series changes at every cycle;
    :class:`~gpulens.pipeline.checkpointing.SplitsHotState`)."""
    node_at = MappingProxyType({"holders": 3})

    def __init__(self, windows: TumblingWindows, shared: SharedHolders | None = None) -> None:
        super().__init__(windows)
        self._shared, self._reader = SharedHolders.joined(shared)

    def process(self, event: Event | SampleColumns) -> list[WorkloadGpuUsage]:
        """Apply one event; returns the rows of the windows its time closed (all of them:
        :meth:`advance` first hands them over one by one)."""
        rows = self._closed_by(event)
        cluster = self._enter(event)
        if isinstance(event, PodEvent):
            self._pod(cluster, event)
        elif isinstance(event, GpuSampleBatch | SampleColumns):
            names, utilizations = columns(event)
            self._samples(cluster, cluster.holders.holders(names, event.node), utilizations)
        elif isinstance(event, ContainerEvent):
            cluster.holders.container(event)
        elif isinstance(event, DeviceInventory):
            cluster.holders.inventory(event)
        elif isinstance(event, Watermark) and event.final and cluster.window_start <= cluster.instant:
            self._settle(cluster)
            rows += self._close_window(cluster)  # the window holding the final watermark
        return rows

    def _open(self, name: str, at: int) -> _Cluster:
        return _Cluster(name, self.windows.start_of(at), at, self._shared.of(name))

    def _usage(self, cluster: _Cluster, workload: _Workload) -> _Usage:
        self._changed.add(("usage", cluster.name, workload.uid))
        cluster.workloads[workload.uid] = workload
        usage = cluster.usage.get(workload.uid)
        if usage is None:
            usage = cluster.usage[workload.uid] = _Usage(HeldAmount(since=cluster.window_start))
        return usage

    def _pod(self, cluster: _Cluster, pod: PodEvent) -> None:
        top = workload_chain(pod)[-1]
        workload = _Workload(top.uid, top.kind, top.name, pod.namespace)
        if pod.type == ChangeType.DELETED:  # what state holds follows the pods that exist
            cluster.workload_of.pop(pod.uid, None)
        else:
            cluster.workload_of[pod.uid] = workload
        self._changed.add(("pod", cluster.name, pod.uid))
        previous = cluster.pods.pop(pod.uid, None)
        if previous is not None:
            usage = self._usage(cluster, previous[0])
            usage.held -= previous[1]
            usage.pods -= 1
            cluster.touched.add(previous[0].uid)
        if pod.holds_gpus:
            amount = milli(pod.gpu_amount)
            cluster.pods[pod.uid] = (workload, amount)
            usage = self._usage(cluster, workload)
            usage.held += amount
            usage.pods += 1
            cluster.touched.add(workload.uid)

    def process_samples(self, run: Sequence[SampleColumns]) -> list[WorkloadGpuUsage] | None:
        """A run of one cluster's sample batches, in event-time order, applied as one by one
        would (None, nothing applied, where it cannot: :meth:`_run_cluster`). Samples close no
        window here and settle nothing: time moves once, to the last batch's instant."""
        cluster = self._run_cluster(run)
        if cluster is None:
            return None
        self._move(cluster, run[-1].event_ms)
        holders = cluster.holders
        self._samples(
            cluster,
            list(chain.from_iterable(holders.holders(batch.device_ids, batch.node) for batch in run)),
            list(chain.from_iterable(batch.utilizations for batch in run)),
        )
        return []

    def _samples(
        self, cluster: _Cluster, holders: list[PodRef | None], utilizations: list[float | None]
    ) -> None:
        """Count each GPU's utilization toward the workload of the pod holding it, in order."""
        workload_of = cluster.workload_of
        last: _Workload | None = None
        usages: dict[str, _Usage] = {}  # looked up once per call: a run's batches repeat workloads
        for utilization, holder in zip(utilizations, holders, strict=True):
            if utilization is None or holder is None:
                continue
            workload = workload_of.get(holder.uid or "")
            if workload is None:
                continue
            if workload is not last:  # a node's GPUs mostly serve one pod: checked first
                found = usages.get(workload.uid)
                if found is None:
                    found = usages[workload.uid] = self._usage(cluster, workload)
                usage, last = found, workload
            usage.util_sum += utilization
            usage.util_count += 1
            if usage.util_max is None or utilization > usage.util_max:
                usage.util_max = utilization

    def _settle(self, cluster: _Cluster) -> None:
        for uid in cluster.touched:
            self._changed.add(("usage", cluster.name, uid))
            usage = cluster.usage[uid]
            usage.series.settle(cluster.instant, usage.held)
        cluster.touched.clear()

    def _window_rows(self, cluster: _Cluster, start: int, end: int) -> list[WorkloadGpuUsage]:
        """The window's rows: one per workload that held GPUs or was sampled."""
        self._changed.update(("usage", cluster.name, uid) for uid in cluster.usage)  # every series closes
        rows: list[WorkloadGpuUsage] = []
        for uid in sorted(cluster.usage):
            usage = cluster.usage[uid]
            series = usage.series
            if series.peak == 0 and usage.util_count == 0:
                del cluster.usage[uid]  # nothing held, nothing sampled: no row until it changes
                continue
            rows.append(self._row(cluster, cluster.workloads[uid], usage, start, end))
        return rows

    def _row(
        self, cluster: _Cluster, workload: _Workload, usage: _Usage, start: int, end: int
    ) -> WorkloadGpuUsage:
        row = WorkloadGpuUsage(
            event_id=event_id(cluster.name, workload.uid, "workload_gpu_usage", start, end),
            cluster=cluster.name,
            workload_uid=workload.uid,
            workload_kind=workload.kind,
            workload_name=workload.name,
            namespace=workload.namespace,
            **held_fields(usage.series, start, end),
            utilization_avg=usage.util_sum / usage.util_count if usage.util_count else None,
            utilization_max=usage.util_max,
            samples=usage.util_count,
            pods_active_end=usage.pods,
        )
        usage.util_sum, usage.util_count, usage.util_max = 0.0, 0, None
        return row

    # --- checkpoint: ["pod", ...], ["usage", ...], ["holders", ...] besides ["cluster", c] ---

    def _take_changed(self, cluster: _Cluster) -> Iterable[StateKey]:
        return cluster.holders.take_changed(cluster.name, self._reader)

    def _keys(self, cluster: _Cluster) -> Iterator[StateKey]:
        yield from (("pod", cluster.name, uid) for uid in cluster.workload_of)
        yield from (("usage", cluster.name, uid) for uid in cluster.usage)
        yield from (("holders", cluster.name, *key) for key in cluster.holders.live())

    def _dump(self, cluster: _Cluster, key: StateKey) -> Any:
        kind = key[0]
        if kind == "cluster":
            return [cluster.window_start, cluster.instant]
        if kind == "holders":
            return cluster.holders.dump(key[2:])
        if kind == "pod":
            workload = cluster.workload_of.get(key[2])
            held = cluster.pods.get(key[2])
            return None if workload is None else [_fields(workload), None if held is None else held[1]]
        usage = cluster.usage.get(key[2])
        if usage is None:
            return None
        series = usage.series
        return [
            _fields(cluster.workloads[key[2]]), [series.since, series.value, series.integral, series.maximum],
            usage.held, usage.pods, usage.util_sum, usage.util_count, usage.util_max,
            key[2] in cluster.touched,
        ]  # fmt: skip

    def _load(self, cluster: _Cluster, key: StateKey, value: Any) -> None:
        kind = key[0]
        if kind == "cluster":
            cluster.window_start, cluster.instant, *listed = value
            if listed:  # written before the touched flag moved to each usage entry
                cluster.touched.update(listed[0])
        elif kind == "holders":
            cluster.holders.load(key[2:], value)
        elif kind == "pod":
            workload, amount = _Workload(*value[0]), value[1]
            cluster.workload_of[key[2]] = workload
            if amount is not None:
                cluster.pods[key[2]] = (workload, amount)
        else:
            workload, series, held, pods, util_sum, util_count, util_max, *touched = value
            cluster.workloads[key[2]] = _Workload(*workload)
            cluster.usage[key[2]] = _Usage(HeldAmount(*series), held, pods, util_sum, util_count, util_max)
            if touched and touched[0]:
                cluster.touched.add(key[2])


def _fields(workload: _Workload) -> list[str]:
    return [workload.uid, workload.kind, workload.name, workload.namespace]
