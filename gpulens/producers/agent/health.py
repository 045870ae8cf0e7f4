"""GPU health as events: what the collectors' health readings become, and the gauges that clear.

Each round every GPU collector that reports health (:class:`BaseHealthCollector`) gives one
:class:`HealthReading` per whole GPU. The tracker keeps each GPU's last state and publishes a
:class:`GpuHealthEvent` when it changes: one per XID that arrived (``cause`` xid), one when
the counters or the conditions they show moved (``counters``), one when a critical XID's hold
ran out and nothing else changed (``cleared``). The first round publishes every GPU's state,
so a GPU's history starts where the agent started.

Critical conditions:

- an XID not in :attr:`HealthRules.ignored_xids` (NVIDIA's device plugin ignores the same
  application errors: 13, 31, 43, 45, 68, 109) holds for :attr:`HealthRules.xid_hold_s` after
  its last arrival: an XID is an instant, and NVML says nothing when the GPU is fine again (the
  hold lives in the agent's memory: an agent restarted within it starts from the counters);
- the counters' own conditions (uncorrectable ECC or RAS errors since the driver loaded,
  pages or rows waiting for a reset, a failed row remap) hold while the library reports them:
  a GPU reset or driver reload zeroes the volatile counters and clears the flags, and with
  them the condition.

:class:`HealthGauges` serves the newest state per GPU: ``gpu_unhealthy`` and
``gpu_xid_critical`` go back to 0 when the condition clears (dcgm-exporter's XID gauge keeps
the last XID until the exporter restarts).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gpulens.producers.agent.collecting import HealthReading
from gpulens.producers.agent.events import NodeIdentity
from gpulens.schemas.model.gpu_metrics import GPU_LABELS, GaugeDef, gauge_families
from gpulens.schemas.model.ids import event_id
from gpulens.schemas.model.models import GpuHealthEvent


@dataclass(frozen=True, slots=True)
class HealthRules:
    """Which XIDs count and how long one holds (the agent's settings ``xid_hold_s`` and
    ``ignored_xids``)."""

    xid_hold_s: float = 600.0
    ignored_xids: tuple[int, ...] = (13, 31, 43, 45, 68, 109)
    """XIDs an application causes (illegal instruction, MMU fault of its own, channel reset, ...):
    the GPU is fine. NVIDIA's k8s-device-plugin skips the same list when it marks GPUs unhealthy."""


@dataclass(slots=True)
class _Gpu:
    conditions: tuple[str, ...]
    counters: dict[str, int]
    xids: dict[int, datetime] = field(default_factory=dict)
    """Critical XID -> when it last arrived."""


@dataclass
class HealthTracker:
    """Each GPU's last health state; says what to publish of a new round (module docstring)."""

    who: NodeIdentity
    rules: HealthRules = field(default_factory=HealthRules)
    gpus: dict[str, _Gpu] = field(default_factory=dict)
    latest: dict[str, GpuHealthEvent] = field(default_factory=dict)
    """GPU id -> its newest event (its health now)."""

    def changes(self, readings: Sequence[HealthReading], at: datetime) -> list[GpuHealthEvent]:
        """The events of this round's ``readings`` (which then become the state)."""
        hold = timedelta(seconds=self.rules.xid_hold_s)
        events = []
        for reading in readings:
            gpu = self.gpus.get(reading.device_id)
            first = gpu is None
            if gpu is None:
                gpu = self.gpus[reading.device_id] = _Gpu((), {})
            held = set(gpu.xids)
            gpu.xids = {xid: when for xid, when in gpu.xids.items() if at - when < hold}
            counters = dict(reading.counters)
            moved = first or counters != gpu.counters or reading.conditions != gpu.conditions
            gpu.counters, gpu.conditions = counters, reading.conditions
            gpu.xids |= {xid: at for xid in reading.xids if xid not in self.rules.ignored_xids}
            # Every event of the round carries the state after the whole round: whichever of one
            # instant's events a reader takes as the newest, it reads the GPU's health then.
            events += [self._event(reading, gpu, at, "xid", xid, n) for n, xid in enumerate(reading.xids)]
            if reading.xids:
                continue  # the XID events carry the counters too
            if moved:
                events.append(self._event(reading, gpu, at, "counters"))
            elif held != set(gpu.xids):
                events.append(self._event(reading, gpu, at, "cleared"))
        self.latest |= {event.device_id: event for event in events}
        return events

    def _event(
        self, reading: HealthReading, gpu: _Gpu, at: datetime, cause: str, xid: int | None = None, n: int = 0
    ) -> GpuHealthEvent:
        who = self.who
        conditions = [*(f"xid-{x}" for x in sorted(gpu.xids)), *gpu.conditions]
        return GpuHealthEvent(
            event_id=event_id(
                who.cluster, who.node, "gpu-health", reading.device_id, cause, n, at.isoformat()
            ),
            cluster=who.cluster,
            event_time=at,
            source=who.source,
            node=who.node,
            device_id=reading.device_id,
            index=reading.index,
            vendor=reading.vendor,
            healthy=not conditions,
            conditions=conditions,
            cause=cause,
            xid=xid,
            counters=gpu.counters,
            message=_message(reading.device_id, cause, xid, conditions, self.rules),
        )


def _message(gpu: str, cause: str, xid: int | None, conditions: list[str], rules: HealthRules) -> str:
    state = f"unhealthy: {', '.join(conditions)}" if conditions else "healthy"
    if cause == "xid":
        kind = "application error" if xid in rules.ignored_xids else "critical"
        return f"XID {xid} ({kind}) on GPU {gpu}; {state}"
    if cause == "cleared":
        return f"GPU {gpu}: critical XID older than {rules.xid_hold_s:g} s; {state}"
    return f"GPU {gpu} error counters; {state}"


def _critical_xid(event: GpuHealthEvent) -> float:
    xids = [int(c.removeprefix("xid-")) for c in event.conditions if c.startswith("xid-")]
    return float(max(xids, default=0))


HEALTH_GAUGES: tuple[GaugeDef[GpuHealthEvent], ...] = (
    GaugeDef(
        "gpu_unhealthy",
        "1 while a critical condition holds on the GPU (XID, uncorrectable ECC/RAS, pending retirement "
        "or remap), 0 once it clears.",
        lambda e: 0.0 if e.healthy else 1.0,
    ),
    GaugeDef(
        "gpu_xid_critical",
        "The highest critical XID holding on the GPU, 0 once none holds (not the last XID forever).",
        _critical_xid,
    ),
)


class HealthGauges(Collector):
    """The health of the GPUs read in the newest round as :data:`HEALTH_GAUGES`: as with the
    samples' gauges, a GPU gone (or its collector failing) drops out instead of freezing."""

    def __init__(self) -> None:
        self._rows: tuple[tuple[tuple[str, ...], GpuHealthEvent], ...] = ()

    def update(self, states: Sequence[GpuHealthEvent]) -> None:
        """Show ``states`` (each GPU's newest health event) from now on."""
        self._rows = tuple(
            ((e.cluster, e.node, str(e.index), e.device_id), e) for e in sorted(states, key=lambda e: e.index)
        )

    def collect(self) -> Iterator[Metric]:
        return gauge_families(HEALTH_GAUGES, GPU_LABELS, self._rows)
