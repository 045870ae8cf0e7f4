"""The node's own per-GPU gauges on the agent's ``/metrics``, with the pod holding each GPU.

Every node serves its GPUs' newest readings itself, as dcgm-exporter and AMD's
device-metrics-exporter do, so no central process has to decode every node's samples to
serve them. Names, help and the first labels are those of :mod:`gpulens.schemas.model.gpu_metrics` (what
the central exporter serves in its per-GPU mode); the agent adds who holds the GPU
(:data:`~gpulens.schemas.model.gpu_metrics.POD_LABELS`) from the kubelet's pod-resources answer of the same
round. Device plugins name a GPU by UUID, PCI address or serial; the inventory's aliases map
each of those names to the sample's ``device_id``.

A collector over the newest round, not gauges set in place: a scrape shows exactly the GPUs
of the last round (a GPU gone, or a collector failing, drops out instead of freezing). The
agent's loop swaps the round in one assignment, so the HTTP thread needs no lock.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gpulens.producers.agent.collecting import ContainerKey
from gpulens.schemas.model.gpu_metrics import (
    GPU_GAUGES,
    GPU_LABELS,
    POD_LABELS,
    gauge_families,
    gpu_label_values,
)
from gpulens.schemas.model.models import DeviceAssignment, DeviceKind, GpuDevice, GpuSample


@dataclass(frozen=True, slots=True)
class _Round:
    rows: tuple[tuple[tuple[str, ...], GpuSample], ...] = ()


def holders(
    gpus: Sequence[GpuDevice], held: Mapping[ContainerKey, tuple[DeviceAssignment, ...]]
) -> dict[str, list[ContainerKey]]:
    """``device_id`` -> the containers holding that GPU, in order, whatever name the device
    plugin gave it."""
    alias = {name: gpu.device_id for gpu in gpus for name in gpu.aliases}
    found: dict[str, list[ContainerKey]] = {}
    for container, devices in sorted(held.items()):
        for device in devices:
            if device.kind == DeviceKind.GPU:
                found.setdefault(alias.get(device.device_id, device.device_id), []).append(container)
    return found


class GpuGauges(Collector):
    """The newest round's samples as :data:`~gpulens.schemas.model.gpu_metrics.GPU_GAUGES`."""

    def __init__(self) -> None:
        self._round = _Round()

    def update(
        self,
        cluster: str,
        node: str,
        samples: Sequence[GpuSample],
        gpus: Sequence[GpuDevice],
        held: Mapping[ContainerKey, tuple[DeviceAssignment, ...]],
    ) -> None:
        """Show ``samples`` from now on, each GPU labelled with the containers of ``held``
        holding it (several sharing one: each label comma-joined, in the same order)."""
        by_gpu = holders(gpus, held)
        rows = []
        for sample in samples:
            containers = by_gpu.get(sample.device_id, [])
            pods = tuple(",".join(part) for part in zip(*containers, strict=True)) or ("", "", "")
            rows.append(((*gpu_label_values(cluster, node, sample), *pods), sample))
        self._round = _Round(tuple(rows))

    def collect(self) -> Iterator[Metric]:
        return gauge_families(GPU_GAUGES, (*GPU_LABELS, *POD_LABELS), self._round.rows)
