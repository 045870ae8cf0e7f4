"""Renders :class:`~consumers.prometheus.state.LatestState` as Primus-Lens's metrics at scrape time.

A collector, not global gauges: each scrape shows exactly the series the state holds now, so
the series of a workload that ended disappear instead of freezing at their last value.
Every metric has a ``cluster`` label; a value the row does not know (null) is left out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from consumers.prometheus.state import LatestState
from schemas.models import ClusterGpuAllocation, GpuSample, NodeGpuAllocation, WorkloadGpuUsage

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class GaugeDef(Generic[R]):
    """One exported gauge: its name, help and the column of the row it shows."""

    name: str
    doc: str
    value: Callable[[R], float | None]


CLUSTER_GAUGES: tuple[GaugeDef[ClusterGpuAllocation], ...] = (
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
NODE_GAUGES: tuple[GaugeDef[NodeGpuAllocation], ...] = (
    GaugeDef(
        "node_k8s_gpu_allocation_rate",
        "GPUs held / capacity of the node over the newest window.",
        lambda r: r.allocation_rate_avg,
    ),
)
WORKLOAD_GAUGES: tuple[GaugeDef[WorkloadGpuUsage], ...] = (
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
GPU_GAUGES: tuple[GaugeDef[GpuSample], ...] = (
    GaugeDef(
        "gpu_utilization", "GFX/SM activity (%) in the node's newest sample.", lambda s: s.utilization_pct
    ),
    GaugeDef(
        "gpu_socket_power_watts",
        "Socket/board power (W) in the node's newest sample.",
        lambda s: s.power_watts,
    ),
    GaugeDef(
        "gpu_memory_used_bytes",
        "VRAM used (bytes) in the node's newest sample.",
        lambda s: s.memory_used_bytes,
    ),
)

CLUSTER_LABELS = ("cluster",)
NODE_LABELS = ("cluster", "node")
WORKLOAD_LABELS = ("cluster", "namespace", "kind", "name", "uid")
GPU_LABELS = ("cluster", "node", "gpu_id", "device_id")
"""``gpu_id`` is the GPU's index on the node, as Primus-Lens labels it; ``device_id`` its stable id."""


def _families(
    gauges: Sequence[GaugeDef[R]], labels: Sequence[str], rows: Iterable[tuple[Sequence[str], R]]
) -> Iterator[Metric]:
    families = [GaugeMetricFamily(g.name, g.doc, labels=labels) for g in gauges]
    for label_values, row in rows:
        for gauge, family in zip(gauges, families, strict=True):
            value = gauge.value(row)
            if value is not None:
                family.add_metric(label_values, value)
    yield from families


class StateCollector(Collector):
    """A prometheus-client collector over a :class:`LatestState`."""

    def __init__(self, state: LatestState) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        snap = self._state.snapshot()
        yield from _families(CLUSTER_GAUGES, CLUSTER_LABELS, (((r.cluster,), r) for r in snap.clusters))
        yield from _families(NODE_GAUGES, NODE_LABELS, (((r.cluster, r.node), r) for r in snap.nodes))
        yield from _families(
            WORKLOAD_GAUGES,
            WORKLOAD_LABELS,
            (
                ((r.cluster, r.namespace, r.workload_kind, r.workload_name, r.workload_uid), r)
                for r in snap.workloads
            ),
        )
        yield from _families(
            GPU_GAUGES,
            GPU_LABELS,
            (((b.cluster, b.node, str(s.index), s.device_id), s) for b in snap.gpus for s in b.samples),
        )
        alerts = GaugeMetricFamily(
            "gpulens_alerts_open", "Alerts opened and not yet resolved.", labels=("cluster", "alert")
        )
        for (cluster, alert), count in sorted(snap.alerts_open.items()):
            alerts.add_metric((cluster, alert), count)
        yield alerts
