"""The agent loop: every interval one GpuSampleBatch, inventory when it changed, container changes
(devices from the kubelet, lifecycle from containerd), GPU health changes
(:mod:`gpulens.producers.agent.health`), and the round's samples on the agent's own /metrics
(:class:`~gpulens.producers.agent.gauges.GpuGauges`), and every ``watermark_interval_s`` (the first
before the second round, the last when it stops) a Watermark of its own source at the newest
event time it sent, once the broker acknowledged everything sent (nothing in flight, nothing
spooled): while the broker is away it vouches for nothing (it tries again each round), and the
worker moves the cluster's time on without it once it counts as silent.

One thread does everything (collection, delivery callbacks, spooling; containerd's stream is
read on a thread of its own and handed over each round), so nothing here
needs a lock. A collector that cannot work on this node is switched off once, at start, with
one log line and ``gpulens_agent_collector_enabled{collector} 0``; a collector that fails one
round is logged when it starts failing and when it recovers, and tried again next round.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TypeVar

from gpulens.producers.agent.collecting import (
    BaseAssignmentCollector,
    BaseCollector,
    BaseGpuCollector,
    BaseHealthCollector,
    BaseLifecycleCollector,
    BaseRdmaCollector,
    HealthReading,
)
from gpulens.producers.agent.events import (
    ContainerTracker,
    LifecycleTracker,
    NodeIdentity,
    inventory_event,
    sample_batch,
)
from gpulens.producers.agent.exceptions import CollectorUnavailable
from gpulens.producers.agent.health import HealthRules, HealthTracker
from gpulens.producers.agent.metrics import AgentMetrics
from gpulens.producers.agent.sending import SpoolingSender
from gpulens.producers.watermarking import progress_mark
from gpulens.schemas.model.models import Event, GpuDevice, GpuSample, RdmaDevice
from gpulens.schemas.model.topics import (
    CONTAINERS,
    DEVICE_INVENTORY,
    GPU_HEALTH,
    GPU_SAMPLES,
    WATERMARKS,
    TopicSpec,
)

log = logging.getLogger(__name__)

T = TypeVar("T")


def utcnow() -> datetime:
    return datetime.now(UTC)


def release_free_heap() -> None:
    """Give the heap pages malloc holds free back to the kernel (glibc's ``malloc_trim``).

    Start-up (imports, settings, the first registry calls) frees a few MB that glibc keeps
    mapped; for a process meant to sit at its smallest on every GPU node that is worth one
    call a round (well under a millisecond). Elsewhere than glibc there is nothing to call.
    """
    if _malloc_trim is not None:
        _malloc_trim(0)


try:
    _malloc_trim: Callable[[int], int] | None = ctypes.CDLL(None).malloc_trim
except (OSError, AttributeError):  # not glibc (musl, macOS)
    _malloc_trim = None


class NodeAgent:
    """Runs the collectors of one node and publishes what they see through a :class:`SpoolingSender`."""

    def __init__(
        self,
        who: NodeIdentity,
        collectors: Sequence[BaseCollector],
        sender: SpoolingSender,
        metrics: AgentMetrics,
        *,
        sample_interval_s: float = 5.0,
        inventory_interval_s: float = 600.0,
        watermark_interval_s: float = 10.0,
        health_rules: HealthRules | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.who = who
        self._candidates = list(collectors)
        self._active: list[BaseCollector] = []
        self._sender = sender
        self._metrics = metrics
        self._interval = sample_interval_s
        self._inventory_every = timedelta(seconds=inventory_interval_s)
        self._clock = clock
        self._tracker = ContainerTracker(who)
        self._lifecycle = LifecycleTracker(who, self._tracker)
        self._health = HealthTracker(who, health_rules or HealthRules())
        self._inventory: tuple[list[GpuDevice], list[RdmaDevice]] | None = None
        self._inventory_at: datetime | None = None
        self._failing: set[str] = set()
        self._watermark_every = watermark_interval_s
        self._newest: datetime | None = None
        """The newest event time sent."""
        self._vouched: datetime | None = None
        """The newest watermark sent."""

    @property
    def sender(self) -> SpoolingSender:
        """Where the records go (its backlog: ``in_flight`` and ``spooled``)."""
        return self._sender

    @property
    def active(self) -> list[str]:
        """Names of the collectors that are on."""
        return [c.name for c in self._active]

    def start(self) -> None:
        """Start every collector; the ones this node cannot serve are switched off (one line each)."""
        for collector in self._candidates:
            try:
                collector.start()
            except CollectorUnavailable as err:
                log.warning("%s collector off: %s", collector.name, err)
                self._metrics.collector_enabled.labels(collector.name).set(0)
                continue
            self._active.append(collector)
            self._metrics.collector_enabled.labels(collector.name).set(1)
            log.info("%s collector on", collector.name)

    def tick(self) -> None:
        """One round: collect everything at one instant and publish what is due."""
        at = self._clock()
        gpu_collectors = [c for c in self._active if isinstance(c, BaseGpuCollector)]
        rdma_collectors = [c for c in self._active if isinstance(c, BaseRdmaCollector)]
        gpus: list[GpuDevice] = []
        rdma: list[RdmaDevice] = []
        samples: list[GpuSample] = []
        for gpu in gpu_collectors:
            found = self._collect(gpu, partial(_gpus_and_samples, gpu))
            if found is not None:
                gpus += found[0]
                samples += found[1]
                self._metrics.samples_collected.labels(gpu.name).inc(len(found[1]))
        for ports in rdma_collectors:
            rdma += self._collect(ports, ports.ports) or []
        if gpu_collectors or rdma_collectors:
            self._publish_inventory(at, gpus, rdma)
        if samples:
            self._send(GPU_SAMPLES, sample_batch(self.who, at, samples))
        readings: list[HealthReading] = []
        for health in (c for c in self._active if isinstance(c, BaseHealthCollector)):
            readings += self._collect(health, health.health, f"{health.name}-health") or []
        if readings:
            changes = self._health.changes(readings, at)
            for change in changes:
                self._send(GPU_HEALTH, change)
            self._metrics.health.update([self._health.latest[r.device_id] for r in readings])
        # the runtime's changes first, with the devices as last seen: they happened before this round
        for runtime in (c for c in self._active if isinstance(c, BaseLifecycleCollector)):
            self._metrics.runtime_connected.labels(runtime.name).set(runtime.connected)
            for event in self._lifecycle.changes(runtime.changes()):
                self._send(CONTAINERS, event)
        for mapping in (c for c in self._active if isinstance(c, BaseAssignmentCollector)):
            held = self._collect(mapping, mapping.assignments)
            if held is not None:
                for event in self._tracker.changes(held, at):
                    self._send(CONTAINERS, event)
        # holders as last seen: a kubelet that missed this round does not unlabel the GPUs
        self._metrics.gpus.update(self.who.cluster, self.who.node, samples, gpus, self._tracker.held)
        self._sender.pump()

    def _send(self, topic: TopicSpec, event: Event) -> None:
        self._sender.send(topic, event)
        if self._newest is None or event.event_time > self._newest:
            self._newest = event.event_time

    def vouch(self, *, wait_s: float = 1.0) -> bool:
        """Publish a watermark at the newest event time sent, once the broker acknowledged every
        record sent (nothing in flight after waiting up to ``wait_s``, nothing spooled); True
        when one went out. The agent stamps its records in rounds, each later than the one
        before, so no record it sends later lies below it; only containerd's lifecycle changes
        carry containerd's own time, and one its stream delivers after a watermark past it is
        a late state change for the worker (applied at its cluster's time, never dropped)."""
        at = self._newest
        if at is None or (self._vouched is not None and at <= self._vouched):
            return False
        if not self._sender.acknowledged(wait_s):
            return False
        self._sender.send(WATERMARKS, progress_mark(self.who.cluster, self.who.source, at))
        self._vouched = at
        return True

    def _publish_inventory(self, at: datetime, gpus: list[GpuDevice], rdma: list[RdmaDevice]) -> None:
        due = self._inventory_at is None or at - self._inventory_at >= self._inventory_every
        if due or self._inventory != (gpus, rdma):
            self._send(DEVICE_INVENTORY, inventory_event(self.who, at, gpus, rdma))
            self._inventory, self._inventory_at = (gpus, rdma), at

    def _collect(self, collector: BaseCollector, read: Callable[[], T], name: str | None = None) -> T | None:
        """``read()``, or None when it fails; ``name`` (default: the collector's) labels its metrics."""
        name = name or collector.name
        try:
            value = read()
        except Exception as err:  # one misbehaving library must not stop the node's other collectors
            self._metrics.collection_errors.labels(name).inc()
            if name not in self._failing:
                log.warning("%s collection failing: %s: %s", name, type(err).__name__, err)
                self._failing.add(name)
            return None
        if name in self._failing:
            log.info("%s collection recovered", name)
            self._failing.discard(name)
        self._metrics.last_collection.labels(name).set(time.time())
        return value

    def run(self, stop: threading.Event, *, rounds: int | None = None) -> None:
        """Collect every interval until ``stop`` is set (or after ``rounds``); serve deliveries between."""
        deadline = vouch_at = time.monotonic()
        done = 0
        while not stop.is_set() and (rounds is None or done < rounds):
            # before the round, not after it: the last round's records had the interval to be
            # acknowledged; a watermark not possible now is tried again next round
            if time.monotonic() >= vouch_at and self.vouch(wait_s=min(1.0, self._watermark_every / 4)):
                vouch_at = time.monotonic() + self._watermark_every
            self.tick()
            release_free_heap()
            done += 1
            deadline += self._interval
            if deadline < time.monotonic():  # a round took longer than the interval: skip, never burst
                deadline = time.monotonic() + self._interval
            while not stop.is_set() and (rounds is None or done < rounds):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                stop.wait(min(left, 0.5))
                self._sender.pump()

    def close(self, *, timeout_s: float = 10.0) -> None:
        """Vouch for the last round if the broker takes everything within ``timeout_s``, deliver
        or spool what is in flight, then release every collector."""
        self.vouch(wait_s=timeout_s)
        self._sender.close(timeout_s)
        for collector in self._active:
            collector.close()
        self._active.clear()


def _gpus_and_samples(collector: BaseGpuCollector) -> tuple[list[GpuDevice], list[GpuSample]]:
    """A GPU collector's devices and samples, read together: a failure skips both."""
    return collector.gpus(), collector.samples()
