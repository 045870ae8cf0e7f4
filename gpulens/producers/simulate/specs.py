"""What a simulation is: the cluster's size and load, its GPU model, its workload mix, its churn.

Definitions only, no behaviour: :mod:`gpulens.producers.simulate.simulating` runs them. The rate
formulas live here too, so the command's help and the bench quote the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from gpulens.producers.simulate.exceptions import SimulationError

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
SOURCE = "simulate"
"""The ``source`` of every simulated record."""


def to_ms(at: datetime) -> int:
    """Milliseconds since the epoch: the simulator's clock is integral, so no float ever drifts."""
    return (at - EPOCH) // timedelta(milliseconds=1)


def from_ms(ms: int) -> datetime:
    """The UTC instant ``ms`` milliseconds after the epoch (exact, unlike ``fromtimestamp``)."""
    return EPOCH + timedelta(milliseconds=ms)


@dataclass(frozen=True, slots=True)
class GpuModel:
    """A GPU model as the device plugin, the node labels and the driver present it."""

    key: str
    name: str
    """Market name, as amdsmi / NVML report it."""
    vendor: str
    resource: str
    """Extended resource of the device plugin."""
    product_label: tuple[str, str]
    """Node label (key, value) naming the model: what the watcher reads as ``gpu_model``."""
    pci_vendor_id: str
    pci_device_id: str
    vram_bytes: int
    idle_watts: float
    max_watts: float
    idle_clock_mhz: float
    max_clock_mhz: float
    memory_clock_mhz: float
    vbios_version: str
    driver_version: str
    reports_all_temperatures: bool
    """amdsmi reports edge, junction and memory temperatures; our NVML collector the GPU's only."""


GPU_MODELS: dict[str, GpuModel] = {
    model.key: model
    for model in (
        GpuModel(
            key="h100",
            name="NVIDIA H100 80GB HBM3",
            vendor="NVIDIA",
            resource="nvidia.com/gpu",
            product_label=("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
            pci_vendor_id="0x10de",
            pci_device_id="0x2330",
            vram_bytes=81_559 * 1024 * 1024,
            idle_watts=70.0,
            max_watts=700.0,
            idle_clock_mhz=345.0,
            max_clock_mhz=1980.0,
            memory_clock_mhz=2619.0,
            vbios_version="96.00.99.00.01",
            driver_version="550.90.07",
            reports_all_temperatures=False,
        ),
        GpuModel(
            key="a100",
            name="NVIDIA A100-SXM4-80GB",
            vendor="NVIDIA",
            resource="nvidia.com/gpu",
            product_label=("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB"),
            pci_vendor_id="0x10de",
            pci_device_id="0x20b2",
            vram_bytes=81_920 * 1024 * 1024,
            idle_watts=55.0,
            max_watts=400.0,
            idle_clock_mhz=210.0,
            max_clock_mhz=1410.0,
            memory_clock_mhz=1593.0,
            vbios_version="92.00.45.00.06",
            driver_version="550.90.07",
            reports_all_temperatures=False,
        ),
        GpuModel(
            key="mi300x",
            name="AMD Instinct MI300X",
            vendor="AMD",
            resource="amd.com/gpu",
            product_label=("amd.com/gpu.product-name", "AMD_Instinct_MI300X"),
            pci_vendor_id="0x1002",
            pci_device_id="0x74a1",
            vram_bytes=192 * 1024**3,
            idle_watts=140.0,
            max_watts=750.0,
            idle_clock_mhz=132.0,
            max_clock_mhz=2100.0,
            memory_clock_mhz=1300.0,
            vbios_version="113-M3000100-102",
            driver_version="6.8.5",
            reports_all_temperatures=True,
        ),
    )
}


@dataclass(frozen=True, slots=True)
class WorkloadProfile:
    """One kind of GPU workload: how often it arrives, how big it is and how busy it keeps its GPUs."""

    name: str
    share: float
    """Fraction of arrivals."""
    namespace: str
    kind: str
    """Top owner kind; a Deployment owns its pods through a ReplicaSet."""
    group: str
    version: str
    image: str
    sizes: tuple[tuple[str, float], ...]
    """(GPUs, weight): ``"node"`` is a whole node, ``"half"`` half of one, else a number."""
    busy_pct: tuple[float, float]
    """Utilization range while busy; each pod draws its own level in it."""
    busy_s: float
    """Mean length of a busy stretch."""
    idle_s: float
    """Mean length of an idle stretch (dataloader stalls, checkpoints, a notebook left open)."""
    memory_fraction: tuple[float, float]
    """Share of VRAM a pod's process holds, drawn once per pod."""
    failure_rate: float
    """Chance that a pod ends Failed rather than Succeeded."""


WORKLOAD_PROFILES: tuple[WorkloadProfile, ...] = (
    WorkloadProfile(
        name="train",
        share=0.5,
        namespace="training",
        kind="Job",
        group="batch",
        version="v1",
        image="nvcr.io/nvidia/pytorch:24.05-py3",
        sizes=(("node", 0.5), ("half", 0.2), ("2", 0.15), ("1", 0.15)),
        busy_pct=(85.0, 99.0),
        busy_s=900.0,
        idle_s=30.0,
        memory_fraction=(0.7, 0.95),
        failure_rate=0.05,
    ),
    WorkloadProfile(
        name="infer",
        share=0.3,
        namespace="inference",
        kind="Deployment",
        group="apps",
        version="v1",
        image="vllm/vllm-openai:v0.5.3",
        sizes=(("1", 0.7), ("2", 0.3)),
        busy_pct=(25.0, 75.0),
        busy_s=600.0,
        idle_s=120.0,
        memory_fraction=(0.85, 0.92),
        failure_rate=0.01,
    ),
    WorkloadProfile(
        name="notebook",
        share=0.2,
        namespace="research",
        kind="StatefulSet",
        group="apps",
        version="v1",
        image="jupyter/pytorch-notebook:cuda12-2024-06-17",
        sizes=(("1", 1.0),),
        busy_pct=(40.0, 95.0),
        busy_s=120.0,
        idle_s=900.0,
        memory_fraction=(0.1, 0.6),
        failure_rate=0.0,
    ),
)


def gpus_of(size: str, gpus_per_node: int) -> int:
    """The GPUs a size of :attr:`WorkloadProfile.sizes` asks for on nodes of ``gpus_per_node``."""
    if size == "node":
        return gpus_per_node
    if size == "half":
        return max(1, gpus_per_node // 2)
    return min(int(size), gpus_per_node)


@dataclass(frozen=True, slots=True)
class ChurnRates:
    """Events per node per hour at ``--churn 1``; how long each lasts (uniform ranges, seconds)."""

    not_ready: float = 0.05
    not_ready_s: tuple[float, float] = (30.0, 300.0)
    removed: float = 0.005
    replaced_after_s: tuple[float, float] = (120.0, 900.0)
    gpu_lost: float = 0.01
    gpu_back_after_s: tuple[float, float] = (300.0, 1800.0)


RECORDS_PER_POD = 10
"""Lifecycle records per pod, about: 5 pod states, 2 container events, ~3 workload events."""


@dataclass(frozen=True, slots=True)
class SimulationSpec:
    """Everything a simulation depends on: the same spec always gives the same records."""

    nodes: int
    gpus_per_node: int
    interval_s: float
    start: datetime
    duration_s: float | None = None
    """None: run until stopped."""
    cluster: str = "sim"
    seed: int = 0
    gpu_model: str = "h100"
    load: float = 0.8
    """Offered GPU load: the arrival rate keeps this share of the GPUs asked for, on average."""
    arrivals_per_min: float | None = None
    """Pods arriving per minute; None derives it from ``load``."""
    pod_duration_s: float = 1800.0
    """Mean running time of a pod (exponential)."""
    churn: float = 1.0
    """Multiplier of :class:`ChurnRates`; 0 keeps every node and GPU up."""
    churn_rates: ChurnRates = field(default_factory=ChurnRates)
    profiles: tuple[WorkloadProfile, ...] = WORKLOAD_PROFILES

    def __post_init__(self) -> None:
        problems = [
            f"nodes must be at least 1, got {self.nodes}" if self.nodes < 1 else "",
            f"gpus_per_node must be 1 to 64, got {self.gpus_per_node}"
            if not 1 <= self.gpus_per_node <= 64
            else "",
            f"interval_s must be at least 0.001, got {self.interval_s}" if self.interval_s < 0.001 else "",
            f"duration_s must be above 0, got {self.duration_s}"
            if self.duration_s is not None and self.duration_s <= 0
            else "",
            f"unknown gpu_model {self.gpu_model!r}; known: {', '.join(GPU_MODELS)}"
            if self.gpu_model not in GPU_MODELS
            else "",
            f"load must be 0 or more, got {self.load}" if self.load < 0 else "",
            f"arrivals_per_min must be 0 or more, got {self.arrivals_per_min}"
            if self.arrivals_per_min is not None and self.arrivals_per_min < 0
            else "",
            f"pod_duration_s must be above 0, got {self.pod_duration_s}" if self.pod_duration_s <= 0 else "",
            f"churn must be 0 or more, got {self.churn}" if self.churn < 0 else "",
            "start must carry a time zone" if self.start.tzinfo is None else "",
            f"cluster must not be empty, got {self.cluster!r}" if not self.cluster else "",
        ]
        found = [p for p in problems if p]
        if found:
            raise SimulationError("; ".join(found))

    @property
    def model(self) -> GpuModel:
        return GPU_MODELS[self.gpu_model]

    @property
    def start_ms(self) -> int:
        return to_ms(self.start)

    @property
    def interval_ms(self) -> int:
        return max(1, round(self.interval_s * 1000))

    @property
    def end_ms(self) -> int | None:
        return None if self.duration_s is None else self.start_ms + round(self.duration_s * 1000)

    @property
    def mean_gpus_per_pod(self) -> float:
        """GPUs an arriving pod asks for, on average, given the workload mix and the node size."""
        total_share = sum(p.share for p in self.profiles)
        mean = 0.0
        for profile in self.profiles:
            weights = sum(w for _, w in profile.sizes)
            per_pod = sum(gpus_of(s, self.gpus_per_node) * w for s, w in profile.sizes) / weights
            mean += profile.share / total_share * per_pod
        return mean

    @property
    def arrivals_per_s(self) -> float:
        """λ: pods per second, given or from ``load * nodes * G / (mean GPUs per pod * pod duration)``."""
        if self.arrivals_per_min is not None:
            return self.arrivals_per_min / 60
        capacity = self.nodes * self.gpus_per_node
        return self.load * capacity / (self.mean_gpus_per_pod * self.pod_duration_s)

    @property
    def batches_per_s(self) -> float:
        """GpuSampleBatch records per second: one per node per interval."""
        return self.nodes / self.interval_s

    @property
    def records_per_s(self) -> float:
        """Records per second in the steady state: sample batches plus pod lifecycles (churn is noise)."""
        return self.batches_per_s + RECORDS_PER_POD * self.arrivals_per_s
