"""What the fleet's GPUs report each interval, from who holds them and what those pods are doing.

A running pod alternates busy and idle stretches (exponential lengths, means from its
profile); busy GPUs sit near the pod's own level with some noise, idle and free ones near 0.
Power follows utilization, temperature follows power with a lag of about a minute, energy
accumulates, memory is what the pod's process allocated. Random streams of its own, so
sampling never shifts the cluster's arrivals and churn.

Every GPU of the fleet is sampled at once, by column (numpy): one interval of 100,000 GPUs
costs milliseconds, where a Python loop building a record per GPU cost over a core at that
size. Only the pods are visited in Python (their busy/idle stretches, and which GPUs they
hold, followed from one round to the next: only those that started or ended, or whose stretch
ended, cost anything). Each GPU has a *slot*, ``node index x GPUs per node + GPU index``,
where its temperature, energy counter, ECC count and pod's activity live between intervals.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Iterable
from operator import attrgetter

import numpy as np

from gpulens.producers.simulate.records import RecordBuilder
from gpulens.producers.simulate.rounds import SampleRound
from gpulens.producers.simulate.specs import SOURCE, GpuModel
from gpulens.producers.simulate.state import SimGpu, SimNode, SimPod

AMBIENT_C = 30.0
_HEAT_C = 45.0
"""Degrees above ambient at full power."""
_THERMAL_S = 40.0
_DRIVER_RESERVED = 0.005
"""Share of VRAM a GPU shows used with no process on it."""
_ECC_FLIP = 1e-5
"""Chance of a rare corrected bit flip per sample, as long-running fleets see."""
_PRESENT = attrgetter("present")


class GpuTelemetry:
    """Samples the GPUs of one model, one interval apart."""

    def __init__(self, model: GpuModel, interval_s: float, gpus_per_node: int, rng: random.Random) -> None:
        self._model = model
        self._interval_s = interval_s
        self._per_node = gpus_per_node
        self._rng = rng
        """Pods' busy/idle stretches."""
        self._noise = np.random.default_rng(rng.getrandbits(128))
        """The samples' noise."""
        self._cooling = 1.0 - math.exp(-interval_s / _THERMAL_S)
        self._temperature = np.zeros(0)
        self._energy = np.zeros(0)
        self._ecc = np.zeros(0, np.int64)
        self._present = np.zeros(0, bool)
        """Whether the driver saw each GPU at the previous round (a returning one starts cool)."""
        self._index = np.zeros(0, np.int64)
        self._device_ids: list[str] = []
        self._gpus: list[SimGpu] = []
        """Every GPU of the fleet, by slot."""
        self._held: dict[SimPod, list[int]] = {}
        """The slots of each running pod's GPUs (they stay the same while it runs)."""
        self._level = np.zeros(0)
        self._running = np.zeros(0, bool)
        self._used = np.zeros(0)
        """Per slot: its pod's activity, whether a pod runs on it, the share of VRAM in use."""
        self._stretches: list[tuple[int, int, SimPod]] = []
        """(end, order, pod): when each running pod's busy or idle stretch ends."""
        self._order = itertools.count()

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

    def sample(
        self, nodes: list[SimNode], pods: Iterable[SimPod], at_ms: int, records: RecordBuilder
    ) -> SampleRound:
        """Every present GPU of every Ready node now (a NotReady node's agent cannot reach the
        broker); updates the GPUs' temperatures and counters."""
        self._grow(nodes)
        model, per_node = self._model, self._per_node
        present = np.fromiter(map(_PRESENT, self._gpus), bool, len(self._gpus))
        returned = present & ~self._present
        self._temperature[returned] = self.idle_temperature()
        self._present = present
        reporting = [node for node in nodes if node.present and node.ready]
        sampled = np.zeros(len(nodes), bool)
        sampled[[node.index for node in reporting]] = True
        slots = np.flatnonzero(present & np.repeat(sampled, per_node))
        starts = np.searchsorted(slots, [node.index * per_node for node in reporting] + [len(present)])

        self._follow_pods(pods, at_ms)
        level, running, used = self._level[slots], self._running[slots], self._used[slots]

        noise, n = self._noise, len(slots)
        busy = np.minimum(100.0, np.maximum(1.0, np.rint(level + noise.normal(0.0, 4.0, n))))
        waiting = np.where(running & (noise.random(n) < 0.2), 1.0, 0.0)
        utilization = np.where(level > 0, busy, waiting)
        share = utilization / 100
        span = model.max_watts - model.idle_watts
        watts = model.idle_watts + span * share**0.8 + noise.normal(0.0, 0.01 * span, n)
        watts = np.maximum(model.idle_watts * 0.9, watts)
        target = AMBIENT_C + _HEAT_C * watts / model.max_watts
        temperature = self._temperature[slots]
        temperature += (target - temperature) * self._cooling
        self._temperature[slots] = temperature
        energy = self._energy[slots] + watts * self._interval_s
        self._energy[slots] = energy
        self._ecc[slots] += noise.random(n) < _ECC_FLIP
        edge = np.round(temperature, 1)
        everything = model.reports_all_temperatures
        return SampleRound(
            cluster=records.cluster,
            source=SOURCE,
            at_ms=at_ms,
            nodes=[node.name for node in reporting],
            event_ids=records.samples_ids(reporting, at_ms),
            starts=starts.astype(np.int64),
            slots=slots.astype(np.int64),
            device_ids=self._device_ids,
            index=self._index[slots],
            ints={
                "memory_used_bytes": (model.vram_bytes * used).astype(np.int64),
                "memory_total_bytes": np.full(n, model.vram_bytes, np.int64),
                "ecc_correctable": self._ecc[slots],
                "ecc_uncorrectable": np.zeros(n, np.int64),
            },
            floats={
                "utilization_pct": utilization,
                "temperature_edge_c": edge,
                "temperature_junction_c": np.round(edge + 4 + 12 * share, 1) if everything else None,
                "temperature_memory_c": np.round(edge + 6 + 4 * share, 1) if everything else None,
                "power_watts": np.round(watts, 1),
                "energy_joules": np.round(energy, 1),
                "sm_clock_mhz": np.where(utilization > 5, model.max_clock_mhz, model.idle_clock_mhz) * 1.0,
                "memory_clock_mhz": np.full(n, float(model.memory_clock_mhz)),
                "pcie_bandwidth_mbps": np.round(share * noise.uniform(500.0, 8000.0, n), 1),
            },
        )

    def _follow_pods(self, pods: Iterable[SimPod], at_ms: int) -> None:
        """Bring each slot's pod, activity and memory up to ``at_ms``: pods that ended free their
        slots, pods that started take theirs, stretches that ended flip (the rest stay as they
        were: a running pod's GPUs do not change)."""
        held, level, running, used = self._held, self._level, self._running, self._used
        for pod in [pod for pod in held if pod.phase != "Running" or not pod.devices]:
            ended = held.pop(pod)
            level[ended], running[ended], used[ended] = 0.0, False, _DRIVER_RESERVED
        for pod in pods:
            if pod.phase == "Running" and pod.devices and pod not in held and pod.node is not None:
                base = pod.node.index * self._per_node
                taken = held[pod] = [base + gpu.index for gpu in pod.devices]
                running[taken], used[taken] = True, pod.memory_fraction
                level[taken] = self.utilization(pod, at_ms)
                heapq.heappush(self._stretches, (pod.stretch_until_ms, next(self._order), pod))
        stretches = self._stretches
        while stretches and stretches[0][0] <= at_ms:
            _, _, pod = heapq.heappop(stretches)
            if pod in held:
                level[held[pod]] = self.utilization(pod, at_ms)
                heapq.heappush(stretches, (pod.stretch_until_ms, next(self._order), pod))

    def _grow(self, nodes: list[SimNode]) -> None:
        """Slots for nodes added since the previous round (their GPUs start idle, all present)."""
        known = len(self._present) // self._per_node
        if known == len(nodes):
            return
        new = nodes[known:]
        extra = len(new) * self._per_node
        self._temperature = np.concatenate([self._temperature, np.full(extra, self.idle_temperature())])
        self._energy = np.concatenate([self._energy, np.zeros(extra)])
        self._ecc = np.concatenate([self._ecc, np.zeros(extra, np.int64)])
        self._present = np.concatenate([self._present, np.ones(extra, bool)])
        self._level = np.concatenate([self._level, np.zeros(extra)])
        self._running = np.concatenate([self._running, np.zeros(extra, bool)])
        self._used = np.concatenate([self._used, np.full(extra, _DRIVER_RESERVED)])
        self._index = np.concatenate([self._index, np.tile(np.arange(self._per_node), len(new))])
        for node in new:
            assert len(node.gpus) == self._per_node and node.index * self._per_node == len(self._device_ids)
            self._device_ids.extend(gpu.device_id for gpu in node.gpus)
            self._gpus.extend(node.gpus)
