"""The per-GPU gauges under Primus-Lens's names: defined once, served by whoever holds samples.

Each node agent serves its own GPUs' gauges on its ``/metrics`` (as dcgm-exporter and AMD's
device-metrics-exporter do), with the pod that holds each GPU; the central exporter serves the
same names only in its per-GPU mode, from the newest batch per node. Both render a
:class:`~gpulens.schemas.model.models.GpuSample` through :data:`GPU_GAUGES`, so the names, help and label
order cannot drift apart. A reading the sample does not have (null) is left out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from prometheus_client.core import GaugeMetricFamily, Metric

from gpulens.schemas.model.models import GpuSample

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class GaugeDef(Generic[R]):
    """One exported gauge: its name, help and the column of the row it shows."""

    name: str
    doc: str
    value: Callable[[R], float | None]


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

GPU_LABELS = ("cluster", "node", "gpu_id", "device_id")
"""``gpu_id`` is the GPU's index on the node, as Primus-Lens labels it; ``device_id`` its stable id."""

POD_LABELS = ("namespace", "pod", "container")
"""Who holds the GPU, as the kubelet says (the agent's labels, after :data:`GPU_LABELS`); empty
when no container holds it, each holder comma-joined when several share it."""


def gpu_label_values(cluster: str, node: str, sample: GpuSample) -> tuple[str, str, str, str]:
    """The :data:`GPU_LABELS` of one sample."""
    return cluster, node, str(sample.index), sample.device_id


def gauge_families(
    gauges: Sequence[GaugeDef[R]], labels: Sequence[str], rows: Iterable[tuple[Sequence[str], R]]
) -> Iterator[Metric]:
    """One family per gauge, one series per row (label values, row) that has the gauge's value."""
    families = [GaugeMetricFamily(g.name, g.doc, labels=labels) for g in gauges]
    for label_values, row in rows:
        for gauge, family in zip(gauges, families, strict=True):
            value = gauge.value(row)
            if value is not None:
                family.add_metric(label_values, value)
    yield from families
