"""Renders :class:`~gpulens.consumers.prometheus.state.LatestState` as Primus-Lens's metrics at scrape time.

A collector, not global gauges: each scrape shows exactly the series the state holds now, so
the series of a workload that ended disappear instead of freezing at their last value.
Every metric has a ``cluster`` label; a value the row does not know (null) is left out. The
per-GPU gauges (:mod:`gpulens.schemas.model.gpu_metrics`) are there only in the per-GPU mode, which holds
each node's newest sample batch; otherwise the node agents serve them.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpulens.consumers.prometheus.state import ClusterView, IdleView, LatestState, NodeView, WorkloadView
from gpulens.schemas.model.gpu_metrics import (
    GPU_GAUGES,
    GPU_LABELS,
    GaugeDef,
    gauge_families,
    gpu_label_values,
)

CLUSTER_GAUGES: tuple[GaugeDef[ClusterView], ...] = (
    GaugeDef(
        "gpu_allocation_rate",
        "GPUs held / capacity, time-weighted over the newest window.",
        lambda r: r.allocation_rate_avg,
    ),
    GaugeDef(
        "cluster_gpu_capacity",
        "Allocatable GPUs of Ready, schedulable nodes at the newest window end.",
        lambda r: r.gpu_capacity,
    ),
    GaugeDef(
        "cluster_gpus_allocated",
        "GPUs held by pods at the newest window end.",
        lambda r: r.gpus_allocated_end,
    ),
    GaugeDef(
        "cluster_gpu_pods_pending",
        "GPU pods not yet bound at the newest window end.",
        lambda r: r.pods_pending_end,
    ),
)
NODE_GAUGES: tuple[GaugeDef[NodeView], ...] = (
    GaugeDef(
        "node_k8s_gpu_allocation_rate",
        "GPUs held / capacity of the node over the newest window.",
        lambda r: r.allocation_rate_avg,
    ),
)
WORKLOAD_GAUGES: tuple[GaugeDef[WorkloadView], ...] = (
    GaugeDef(
        "consumer_pod_gpu_usage",
        "Mean utilization (%) of the workload's GPUs over the newest window.",
        lambda r: r.utilization_avg,
    ),
    GaugeDef(
        "consumer_pod_gpu_allocated",
        "GPUs the workload's pods hold at the newest window end.",
        lambda r: r.gpus_allocated_end,
    ),
    GaugeDef(
        "consumer_pod_active",
        "The workload's pods holding GPUs at the newest window end.",
        lambda r: r.pods_active_end,
    ),
)
CLUSTER_LABELS = ("cluster",)
NODE_LABELS = ("cluster", "node")
WORKLOAD_LABELS = ("cluster", "namespace", "kind", "name", "uid")
IDLE_KINDS = ("active", "idle", "memory_idle", "unmeasured")
_HOUR_S = 3600.0
"""How held GPU-hours were spent (idle_gpu_hours), the ``usage`` label of ``owner_gpu_seconds``."""


class StateCollector(Collector):
    """A prometheus-client collector over a :class:`LatestState`."""

    def __init__(self, state: LatestState) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        snap = self._state.snapshot()
        yield from gauge_families(CLUSTER_GAUGES, CLUSTER_LABELS, (((r.cluster,), r) for r in snap.clusters))
        yield from gauge_families(NODE_GAUGES, NODE_LABELS, (((r.cluster, r.node), r) for r in snap.nodes))
        yield from gauge_families(
            WORKLOAD_GAUGES,
            WORKLOAD_LABELS,
            (
                ((r.cluster, r.namespace, r.workload_kind, r.workload_name, r.workload_uid), r)
                for r in snap.workloads
            ),
        )
        yield from gauge_families(
            GPU_GAUGES,
            GPU_LABELS,
            ((gpu_label_values(b.cluster, b.node, s), s) for b in snap.gpus for s in b.samples),
        )
        yield from _idle_families(snap.idle)
        alerts = GaugeMetricFamily(
            "gpulens_alerts_open", "Alerts opened and not yet resolved.", labels=("cluster", "alert")
        )
        for (cluster, alert), count in sorted(snap.alerts_open.items()):
            alerts.add_metric((cluster, alert), count)
        yield alerts


def _idle_families(rows: list[IdleView]) -> Iterator[Metric]:
    """Each owner's GPU-seconds (Prometheus's base unit) of the newest idle_gpu_hours window by
    usage, summed over its GPUs, and each cluster's unallocated GPU-seconds of that window."""
    held: dict[tuple[str, ...], list[float]] = {}
    unallocated: dict[str, float] = {}
    for row in rows:
        if row.workload_uid:
            labels = (row.cluster, row.namespace, row.workload_kind, row.workload_name, row.workload_uid)
            sums = held.setdefault(labels, [0.0] * len(IDLE_KINDS))
            for i, kind in enumerate(IDLE_KINDS):
                sums[i] += getattr(row, f"{kind}_gpu_hours") * _HOUR_S
        else:
            unallocated[row.cluster] = unallocated.get(row.cluster, 0.0) + row.unallocated_gpu_hours * _HOUR_S
    owners = GaugeMetricFamily(
        "owner_gpu_seconds",
        "GPU-seconds the workload's pods held in the newest idle_gpu_hours window (an hour), by usage.",
        labels=(*WORKLOAD_LABELS, "usage"),
    )
    for owner, sums in sorted(held.items()):
        for kind, value in zip(IDLE_KINDS, sums, strict=True):
            owners.add_metric((*owner, kind), value)
    yield owners
    free = GaugeMetricFamily(
        "cluster_unallocated_gpu_seconds",
        "GPU-seconds of the GPUs agents report that nobody held, in the newest idle_gpu_hours window.",
        labels=("cluster",),
    )
    for cluster, value in sorted(unallocated.items()):
        free.add_metric((cluster,), value)
    yield free
