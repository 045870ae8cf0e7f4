"""What a GPU reports each interval, from who holds it and what that pod is doing.

A running pod alternates busy and idle stretches (exponential lengths, means from its
profile); busy GPUs sit near the pod's own level with some noise, idle and free ones near 0.
Power follows utilization, temperature follows power with a lag of about a minute, energy
accumulates, memory is what the pod's process allocated. One random stream of its own, so
sampling never shifts the cluster's arrivals and churn.
"""

from __future__ import annotations

import math
import random

from producers.simulate.specs import GpuModel
from producers.simulate.state import SimGpu, SimPod
from schemas.models import GpuSample

AMBIENT_C = 30.0
_HEAT_C = 45.0
"""Degrees above ambient at full power."""
_THERMAL_S = 40.0
_DRIVER_RESERVED = 0.005
"""Share of VRAM a GPU shows used with no process on it."""


class GpuTelemetry:
    """Samples GPUs of one model, one interval apart."""

    def __init__(self, model: GpuModel, interval_s: float, rng: random.Random) -> None:
        self._model = model
        self._interval_s = interval_s
        self._rng = rng
        self._cooling = 1.0 - math.exp(-interval_s / _THERMAL_S)

    def idle_temperature(self) -> float:
        """Where a GPU nobody uses settles."""
        return AMBIENT_C + _HEAT_C * self._model.idle_watts / self._model.max_watts

    def begin(self, pod: SimPod, at_ms: int) -> None:
        """A pod starts running: busy first, for a stretch of its profile's mean length."""
        pod.busy = True
        pod.stretch_until_ms = at_ms + max(1, round(self._rng.expovariate(1 / pod.profile.busy_s) * 1000))

    def utilization(self, pod: SimPod, at_ms: int) -> float:
        """The activity of a running pod at ``at_ms``, advancing its busy/idle stretches."""
        rng, profile = self._rng, pod.profile
        while at_ms >= pod.stretch_until_ms:
            pod.busy = not pod.busy
            mean_s = profile.busy_s if pod.busy else profile.idle_s
            pod.stretch_until_ms += max(1, round(rng.expovariate(1 / mean_s) * 1000))
        return pod.busy_pct if pod.busy else 0.0

    def sample(self, gpu: SimGpu, at_ms: int) -> GpuSample:
        """One GPU's sample now; updates its temperature and energy counter."""
        rng, model = self._rng, self._model
        pod = gpu.holder
        running = pod is not None and pod.phase == "Running"
        level = self.utilization(pod, at_ms) if running and pod is not None else 0.0
        if level > 0:
            utilization = min(100.0, max(1.0, round(level + rng.gauss(0.0, 4.0))))
        else:
            utilization = 1.0 if running and rng.random() < 0.2 else 0.0
        share = utilization / 100
        span = model.max_watts - model.idle_watts
        watts = model.idle_watts + span * share**0.8 + rng.gauss(0.0, 0.01 * span)
        watts = max(model.idle_watts * 0.9, watts)
        target = AMBIENT_C + _HEAT_C * watts / model.max_watts
        gpu.temperature_c += (target - gpu.temperature_c) * self._cooling
        gpu.energy_j += watts * self._interval_s
        if rng.random() < 1e-5:  # a rare corrected bit flip, as long-running fleets see
            gpu.ecc_correctable += 1
        vram = model.vram_bytes
        used = pod.memory_fraction if running and pod is not None else _DRIVER_RESERVED
        edge = round(gpu.temperature_c, 1)
        all_temperatures = model.reports_all_temperatures
        return GpuSample(
            device_id=gpu.device_id,
            index=gpu.index,
            utilization_pct=utilization,
            memory_used_bytes=int(vram * used),
            memory_total_bytes=vram,
            temperature_edge_c=edge,
            temperature_junction_c=round(edge + 4 + 12 * share, 1) if all_temperatures else None,
            temperature_memory_c=round(edge + 6 + 4 * share, 1) if all_temperatures else None,
            power_watts=round(watts, 1),
            energy_joules=round(gpu.energy_j, 1),
            sm_clock_mhz=model.max_clock_mhz if utilization > 5 else model.idle_clock_mhz,
            memory_clock_mhz=model.memory_clock_mhz,
            pcie_bandwidth_mbps=round(share * rng.uniform(500.0, 8000.0), 1),
            ecc_correctable=gpu.ecc_correctable,
            ecc_uncorrectable=0,
        )
