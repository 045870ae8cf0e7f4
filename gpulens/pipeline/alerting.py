"""Alerts as a stream, in event time: GpuIdle, GpuPodPending, GpuPendingPileUp, NodeNotReady,
GpuLost, GpuUnhealthy, GpuTelemetryStale.

Each alert is a pair of records, OPENED then RESOLVED, keyed by what it is about.

- **GpuIdle**: a GPU held by a pod whose utilization stays under ``idle_below_pct`` for
  ``idle_for_s``. Samples in time order; a sample is idle when below the threshold; a run of
  idle samples starts at its first sample; the alert opens at the first sample of the run
  whose time minus the run's start is at least the duration, and resolves at the next sample
  that is not idle (or whose GPU no pod holds any more).
- **GpuPodPending**: a GPU pod still unbound ``pending_for_s`` after its creation; it carries
  the scheduler's reason and the cluster's free GPUs by model at that moment, and the most
  free on any one node (fragmentation: free GPUs exist but no node has enough). Resolves when
  the pod is bound or deleted.
- **GpuPendingPileUp** (the Focus-Server incident: hundreds of GPU jobs waiting while idle jobs
  kept their GPUs): one per cluster. Opens when the GPU pods pending past ``pending_for_s``
  (their GpuPodPending open) grow to ``pile_up_pods`` while at least ``pile_up_idle_gpus`` GPUs are
  held but idle (their GpuIdle open); resolves when either falls below. Both counts change only
  as those alerts open or resolve; the cluster is judged after the last event of such an
  instant, when time moves past it (DESIGN.md: events of one instant are applied together), and
  the alert carries that instant.
- **NodeNotReady**: opens when a node's Ready condition goes false, resolves when it is back
  or the node is deleted.
- **GpuLost**: a GPU vanished from its node's inventory; resolves if it comes back. Its message
  and labels carry the GPU's last health event (what the agent last said of it), if any.
- **GpuUnhealthy**: a GPU's health event says it is not healthy (a critical XID, uncorrectable
  ECC or RAS errors, pages or rows waiting for a reset: :mod:`gpulens.producers.agent.health`);
  opens at that event, resolves at the first one that says it is healthy again.
- **GpuTelemetryStale**: a node that sent GPU samples, holds GPU pods, and sent no sample for
  more than ``stale_after_s``: opens at its last sample's time plus ``stale_after_s`` (or, for a
  node that was silent that long already, when a pod starts holding GPUs there), resolves at its
  next sample or when no pod holds GPUs there any more. Nodes that never sent samples (clusters
  replayed from traces without them) never count.

State is checkpointed key by key under ``[kind, cluster, ...]``: ``cluster`` (instant), ``run``
(idle runs per GPU), ``pending`` (unbound GPU pods), ``holding`` (pods holding GPUs), ``node``,
``gpus`` (each node's last inventory), ``health`` (each GPU's last health event), ``sampled``
(each node's last sample time), ``pileup`` (when the open pile-up began, and whether the
instant is to be judged) and ``holders`` (see :mod:`gpulens.pipeline.holders`).
Each cluster's instant and keys follow the aggregators' skeleton (:mod:`gpulens.pipeline.aggregating`).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from types import MappingProxyType
from typing import Any

from gpulens.pipeline.aggregating import BaseAggregator, NodeGroupedSnapshot
from gpulens.pipeline.checkpointing import StateKey
from gpulens.pipeline.holders import GpuHolders, PodRef, SharedHolders
from gpulens.pipeline.windows import from_ms, to_ms
from gpulens.schemas.model.ids import event_id
from gpulens.schemas.model.models import (
    Alert,
    AlertState,
    ChangeType,
    ContainerEvent,
    DeviceInventory,
    Event,
    GpuHealthEvent,
    GpuSampleBatch,
    NodeEvent,
    PodEvent,
)
from gpulens.schemas.wire.sample_columns import SampleColumns, columns

SOURCE = "gpulens-worker"
_NEVER = 2**62
"""A time no event reaches (epoch ms)."""


@dataclass(frozen=True, slots=True)
class AlertRules:
    """Thresholds of the alert rules."""

    idle_below_pct: float = 5.0
    idle_for_s: float = 600.0
    pending_for_s: float = 300.0
    stale_after_s: float = 300.0
    pile_up_pods: int = 5
    pile_up_idle_gpus: int = 1


@dataclass(slots=True)
class _Run:
    start: int
    opened: bool = False


@dataclass(slots=True)
class _Pending:
    created: int
    event: PodEvent
    alerted: bool = False


@dataclass(slots=True)
class _Health:
    """A GPU's last health event, as GpuLost and GpuUnhealthy need it."""

    at: int
    conditions: list[str]
    message: str
    unhealthy_since: int | None = None
    """When its open GpuUnhealthy began; None when none is open."""


@dataclass(slots=True)
class _Sampled:
    """A node's last GPU sample time, and whether a GpuTelemetryStale is open for it (since then)."""

    last: int
    stale: bool = False


@dataclass(slots=True)
class _NodeState:
    allocatable: float = 0.0
    available: bool = False
    model: str | None = None
    held: float = 0.0
    not_ready_since: int | None = None


@dataclass
class _Cluster:
    name: str
    instant: int
    holders: GpuHolders
    """Shared with the worker's other operators that keep holders (:class:`SharedHolders`)."""
    gpus: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """node -> GPU ids in its last inventory, sorted (a tuple: a set of a node's 8 took 728 bytes)."""
    runs: dict[str, _Run] = field(default_factory=dict)
    pending: dict[str, _Pending] = field(default_factory=dict)
    first_waiting: int | None = None
    """Earliest creation time of the pending pods not alerted yet (None: to be found again, after
    ``pending`` changed): most events find no pod due without looking at each."""
    holding: dict[str, tuple[str, float]] = field(default_factory=dict)
    """pod uid -> (node, GPUs) of pods holding GPUs."""
    nodes: dict[str, _NodeState] = field(default_factory=lambda: defaultdict(_NodeState))
    health: dict[str, _Health] = field(default_factory=dict)
    """GPU id -> its last health event."""
    sampled: dict[str, _Sampled] = field(default_factory=dict)
    """node -> its last sample."""
    silences: list[tuple[int, str]] = field(default_factory=list)
    """Heap of (a sample's time + stale_after, node), at most one per node: an entry whose node
    sampled since goes back in at the newer deadline when it comes up (one per sample batch was
    1.9 M entries at 100,000 GPUs). Rebuilt from ``sampled`` on restore."""
    watched: set[str] = field(default_factory=set)
    """Nodes with an entry in ``silences``."""
    pile_up_since: int | None = None
    pile_up_stale: bool = False
    """GpuIdle or GpuPodPending alerts changed at the instant: judge the pile-up when time moves on."""


class AlertDetector(NodeGroupedSnapshot, BaseAggregator[_Cluster]):
    """Turns the event streams of clusters into Alert records."""

    hot_kinds = frozenset({"sampled"})
    """Kinds checkpointed in a state log of their own (every node's last sample time changes at every cycle;
    :class:`~gpulens.pipeline.checkpointing.SplitsHotState`)."""
    node_at = MappingProxyType({"holders": 3, "gpus": 2, "node": 2})

    def __init__(self, rules: AlertRules, shared: SharedHolders | None = None) -> None:
        super().__init__()
        self.rules = rules
        self._shared, self._reader = SharedHolders.joined(shared)
        self._settled: list[Alert] = []
        """Pile-up alerts of the instant time just left (:meth:`_settle`), for the event moving it."""

    def _open(self, name: str, at: int) -> _Cluster:
        return _Cluster(name, at, self._shared.of(name))

    def process(self, event: Event | SampleColumns) -> list[Alert]:
        """The alerts ``event`` opens or resolves (and pending timers that expired before it)."""
        cluster = self._enter(event)
        alerts = self._due(cluster)
        if isinstance(event, GpuSampleBatch | SampleColumns):
            alerts += self._batch(cluster, event)
        elif isinstance(event, ContainerEvent):
            cluster.holders.container(event)
        elif isinstance(event, DeviceInventory):
            alerts += self._inventory(cluster, event)
        elif isinstance(event, NodeEvent):
            alerts += self._node(cluster, event)
        elif isinstance(event, PodEvent):
            alerts += self._pod(cluster, event)
        elif isinstance(event, GpuHealthEvent):
            alerts += self._health(cluster, event)
        self._note_pile_up(cluster, alerts)
        return alerts

    def process_samples(self, run: Sequence[SampleColumns]) -> list[Alert] | None:
        """A run of one cluster's sample batches, in event-time order: the alerts of each batch as
        :meth:`process` gives them, in order (None, nothing applied, where it cannot:
        :meth:`_run_cluster`)."""
        cluster = self._run_cluster(run)
        if cluster is None:
            return None
        alerts: list[Alert] = []
        for batch in run:
            self._move(cluster, batch.event_ms)
            caused = self._due(cluster) + self._batch(cluster, batch)
            self._note_pile_up(cluster, caused)
            alerts += caused
        return alerts

    def _due(self, cluster: _Cluster) -> list[Alert]:
        """What falls due as time reaches the cluster's instant, before its event applies: the
        pile-up of the instant left, pending pods and silent nodes past their rules."""
        at = cluster.instant
        alerts, self._settled = self._settled, []
        alerts += self._expire_pending(cluster, at)
        alerts += self._expire_silences(cluster, at)
        return alerts

    def _batch(self, cluster: _Cluster, batch: GpuSampleBatch | SampleColumns) -> list[Alert]:
        return self._samples(cluster, batch) + self._sampled(cluster, batch.node)

    def _note_pile_up(self, cluster: _Cluster, alerts: list[Alert]) -> None:
        """GpuIdle or GpuPodPending alerts at the instant: judge the pile-up when time moves on."""
        pile_up = ("GpuIdle", "GpuPodPending")
        if alerts and not cluster.pile_up_stale and any(a.alert in pile_up for a in alerts):
            cluster.pile_up_stale = True
            self._changed.add(("pileup", cluster.name))

    def _settle(self, cluster: _Cluster) -> None:
        if cluster.pile_up_stale:
            cluster.pile_up_stale = False
            self._changed.add(("pileup", cluster.name))
            self._settled += self._pile_up(cluster, cluster.instant)

    # --- GpuIdle ------------------------------------------------------------------------------

    def _samples(self, cluster: _Cluster, batch: GpuSampleBatch | SampleColumns) -> list[Alert]:
        alerts: list[Alert] = []
        at = cluster.instant  # the batch's time, once entered
        threshold_ms, below = self.rules.idle_for_s * 1000, self.rules.idle_below_pct
        names, utilizations = columns(batch)
        runs = cluster.runs
        gpus = cluster.holders.gpus(names, batch.node)
        if runs.keys().isdisjoint(gpus) and not any(u is not None and u < below for u in utilizations):
            return alerts  # no GPU idle, none ending a run: most batches, told apart in C
        for gpu, utilization in zip(gpus, utilizations, strict=True):
            run = runs.get(gpu)
            if run is None and (utilization is None or not utilization < below):
                continue  # not idle, whoever holds it, and no run to end: most samples
            holder = cluster.holders.holder(gpu)
            idle = holder is not None and utilization is not None and utilization < below
            if not idle:
                if run is not None:
                    if run.opened:
                        alerts.append(self._gpu_idle(batch, gpu, holder, run, AlertState.RESOLVED, at))
                    del cluster.runs[gpu]
                    self._changed.add(("run", batch.cluster, gpu))
                continue
            if run is None:
                run = cluster.runs[gpu] = _Run(start=at)
                self._changed.add(("run", batch.cluster, gpu))
            if not run.opened and at - run.start >= threshold_ms:
                run.opened = True
                self._changed.add(("run", batch.cluster, gpu))
                alerts.append(self._gpu_idle(batch, gpu, holder, run, AlertState.OPENED, at))
        return alerts

    def _gpu_idle(
        self,
        batch: GpuSampleBatch | SampleColumns,
        gpu: str,
        holder: PodRef | None,
        run: _Run,
        state: AlertState,
        at: int,
    ) -> Alert:
        minutes = (at - run.start) / 60_000
        return Alert(
            event_id=event_id(batch.cluster, "GpuIdle", gpu, run.start, state.value),
            cluster=batch.cluster,
            event_time=from_ms(at),
            source=SOURCE,
            alert="GpuIdle",
            state=state,
            entity=gpu,
            node=batch.node,
            gpu_id=gpu,
            pod_uid=holder.uid if holder else None,
            pod_namespace=holder.namespace if holder else None,
            pod_name=holder.name if holder else None,
            since=from_ms(run.start),
            message=(
                f"GPU {gpu} on {batch.node} under {self.rules.idle_below_pct:g}% for {minutes:.0f} min"
                if state is AlertState.OPENED
                else f"GPU {gpu} on {batch.node} busy again after {minutes:.0f} min idle"
            ),
            labels={
                "threshold_pct": f"{self.rules.idle_below_pct:g}",
                "duration_s": f"{self.rules.idle_for_s:g}",
            },
        )

    # --- GpuLost ------------------------------------------------------------------------------

    def _inventory(self, cluster: _Cluster, inventory: DeviceInventory) -> list[Alert]:
        cluster.holders.inventory(inventory)
        listed = {gpu.device_id for gpu in inventory.gpus}
        now = tuple(sorted(listed))
        before = cluster.gpus.get(inventory.node)
        cluster.gpus[inventory.node] = now
        if before != now:
            self._changed.add(("gpus", inventory.cluster, inventory.node))
        if before is None or before == now:
            return []
        gone, back = [gpu for gpu in before if gpu not in listed], sorted(listed.difference(before))
        return [
            *(self._gpu_lost(cluster, inventory, gpu, AlertState.OPENED) for gpu in gone),
            *(self._gpu_lost(cluster, inventory, gpu, AlertState.RESOLVED) for gpu in back),
        ]

    def _gpu_lost(self, cluster: _Cluster, inventory: DeviceInventory, gpu: str, state: AlertState) -> Alert:
        message = (
            f"GPU {gpu} vanished from the inventory of {inventory.node}"
            if state is AlertState.OPENED
            else f"GPU {gpu} is back in the inventory of {inventory.node}"
        )
        labels = {}
        health = cluster.health.get(gpu)
        if health is not None and state is AlertState.OPENED:
            message += f"; last health event at {from_ms(health.at).isoformat()}: {health.message}"
            labels = {
                "last_health_time": from_ms(health.at).isoformat(),
                "last_health_conditions": ",".join(health.conditions),
            }
        return Alert(
            event_id=event_id(inventory.cluster, "GpuLost", gpu, inventory.event_id, state.value),
            cluster=inventory.cluster,
            event_time=inventory.event_time,
            source=SOURCE,
            alert="GpuLost",
            state=state,
            entity=gpu,
            node=inventory.node,
            gpu_id=gpu,
            since=inventory.event_time,
            message=message,
            labels=labels,
        )

    # --- GpuUnhealthy -------------------------------------------------------------------------

    def _health(self, cluster: _Cluster, event: GpuHealthEvent) -> list[Alert]:
        at, gpu = cluster.instant, event.device_id
        before = cluster.health.get(gpu)
        since = before.unhealthy_since if before is not None else None
        health = cluster.health[gpu] = _Health(at, list(event.conditions), event.message, since)
        self._changed.add(("health", event.cluster, gpu))
        if not event.healthy and since is None:
            health.unhealthy_since = at
            return [self._unhealthy(cluster, event, at, AlertState.OPENED)]
        if event.healthy and since is not None:
            health.unhealthy_since = None
            return [self._unhealthy(cluster, event, since, AlertState.RESOLVED)]
        return []

    def _unhealthy(self, cluster: _Cluster, event: GpuHealthEvent, since: int, state: AlertState) -> Alert:
        gpu = event.device_id
        holder = cluster.holders.holder(cluster.holders.gpu(gpu))
        labels = {"cause": event.cause, "vendor": event.vendor}
        if event.conditions:
            labels["conditions"] = ",".join(event.conditions)
        if event.xid is not None:
            labels["xid"] = str(event.xid)
        return Alert(
            event_id=event_id(event.cluster, "GpuUnhealthy", gpu, since, state.value),
            cluster=event.cluster,
            event_time=event.event_time,
            source=SOURCE,
            alert="GpuUnhealthy",
            state=state,
            entity=gpu,
            node=event.node,
            gpu_id=gpu,
            pod_uid=holder.uid if holder else None,
            pod_namespace=holder.namespace if holder else None,
            pod_name=holder.name if holder else None,
            since=from_ms(since),
            message=event.message,
            labels=labels,
        )

    # --- GpuTelemetryStale --------------------------------------------------------------------

    def _sampled(self, cluster: _Cluster, node: str) -> list[Alert]:
        at = cluster.instant
        sampled = cluster.sampled.get(node)
        cluster.sampled[node] = _Sampled(at)
        if node not in cluster.watched:
            self._watch(cluster, at + self._stale_ms, node)
        self._changed.add(("sampled", cluster.name, node))
        if sampled is None or not sampled.stale:
            return []
        return [self._stale_alert(cluster, node, sampled.last, at, AlertState.RESOLVED, "samples are back")]

    @staticmethod
    def _watch(cluster: _Cluster, deadline: int, node: str) -> None:
        heapq.heappush(cluster.silences, (deadline, node))
        cluster.watched.add(node)

    @property
    def _stale_ms(self) -> int:
        return round(self.rules.stale_after_s * 1000)

    def _expire_silences(self, cluster: _Cluster, at: int) -> list[Alert]:
        """GpuTelemetryStale for nodes whose silence grew longer than the rule before ``at``."""
        alerts = []
        silences = cluster.silences
        while silences and silences[0][0] < at:
            deadline, node = heapq.heappop(silences)
            cluster.watched.discard(node)
            sampled = cluster.sampled.get(node)
            if sampled is None:
                continue
            if sampled.last + self._stale_ms != deadline:  # it sampled since: watch its newest
                self._watch(cluster, sampled.last + self._stale_ms, node)
                continue
            if not sampled.stale and _holds_gpus(cluster, node):
                sampled.stale = True
                self._changed.add(("sampled", cluster.name, node))
                alerts.append(self._stale_alert(cluster, node, sampled.last, deadline, AlertState.OPENED, ""))
        return alerts

    def _holding(self, cluster: _Cluster, node: str) -> list[Alert]:
        """GpuTelemetryStale of ``node`` after the GPUs its pods hold changed: it opens on a node
        silent too long already, resolves when no pod holds GPUs there any more."""
        at, sampled = cluster.instant, cluster.sampled.get(node)
        if sampled is None:
            return []
        holds = _holds_gpus(cluster, node)
        if sampled.stale and not holds:
            sampled.stale = False
            self._changed.add(("sampled", cluster.name, node))
            return [
                self._stale_alert(cluster, node, sampled.last, at, AlertState.RESOLVED, "no GPU pods left")
            ]
        if not sampled.stale and holds and at - sampled.last > self._stale_ms:
            sampled.stale = True
            self._changed.add(("sampled", cluster.name, node))
            return [self._stale_alert(cluster, node, sampled.last, at, AlertState.OPENED, "")]
        return []

    def _stale_alert(
        self, cluster: _Cluster, node: str, last: int, at: int, state: AlertState, outcome: str
    ) -> Alert:
        silent = timedelta(milliseconds=at - last)
        return Alert(
            event_id=event_id(cluster.name, "GpuTelemetryStale", node, last, state.value),
            cluster=cluster.name,
            event_time=from_ms(at),
            source=SOURCE,
            alert="GpuTelemetryStale",
            state=state,
            entity=node,
            node=node,
            since=from_ms(last),
            message=(
                f"no GPU samples from {node} for {silent} while its pods hold GPUs"
                if state is AlertState.OPENED
                else f"GPU telemetry of {node} after {silent} silent: {outcome}"
            ),
            labels={"stale_after_s": f"{self.rules.stale_after_s:g}"},
        )

    # --- NodeNotReady -------------------------------------------------------------------------

    def _node(self, cluster: _Cluster, event: NodeEvent) -> list[Alert]:
        node = cluster.nodes[event.node]
        self._changed.add(("node", event.cluster, event.node))
        deleted = event.type == ChangeType.DELETED
        node.allocatable = 0.0 if deleted else event.gpus_allocatable
        node.available = not deleted and event.ready and event.schedulable
        node.model = event.gpu_model or node.model
        at = to_ms(event.event_time)
        if not deleted and not event.ready and node.not_ready_since is None:
            node.not_ready_since = at
            return [self._node_alert(event, at, AlertState.OPENED)]
        if (deleted or event.ready) and node.not_ready_since is not None:
            since, node.not_ready_since = node.not_ready_since, None
            return [self._node_alert(event, since, AlertState.RESOLVED)]
        return []

    def _node_alert(self, event: NodeEvent, since: int, state: AlertState) -> Alert:
        return Alert(
            event_id=event_id(event.cluster, "NodeNotReady", event.node, since, state.value),
            cluster=event.cluster,
            event_time=event.event_time,
            source=SOURCE,
            alert="NodeNotReady",
            state=state,
            entity=event.node,
            node=event.node,
            since=from_ms(since),
            message=f"node {event.node} is {'not ready' if state is AlertState.OPENED else 'ready again'}",
        )

    # --- GpuPodPending ------------------------------------------------------------------------

    def _pod(self, cluster: _Cluster, event: PodEvent) -> list[Alert]:
        previous = cluster.holding.pop(event.uid, None)
        changed = self._changed
        touched = []
        if previous is not None:
            cluster.nodes[previous[0]].held -= previous[1]
            changed.update((("holding", event.cluster, event.uid), ("node", event.cluster, previous[0])))
            touched.append(previous[0])
        if event.holds_gpus and event.node is not None:
            cluster.holding[event.uid] = (event.node, event.gpu_amount)
            cluster.nodes[event.node].held += event.gpu_amount
            changed.update((("holding", event.cluster, event.uid), ("node", event.cluster, event.node)))
            touched.append(event.node)
        alerts = [alert for node in dict.fromkeys(touched) for alert in self._holding(cluster, node)]
        waiting = event.type != ChangeType.DELETED and event.node is None and event.gpu_amount > 0
        pending = cluster.pending.get(event.uid)
        if waiting or pending is not None:
            changed.add(("pending", event.cluster, event.uid))
        if waiting:
            if pending is None:
                cluster.pending[event.uid] = _Pending(to_ms(event.creation_time), event)
                cluster.first_waiting = None
            else:
                pending.event = event  # keep the scheduler's latest reason
            return alerts
        if pending is None:
            return alerts
        del cluster.pending[event.uid]
        cluster.first_waiting = None
        if not pending.alerted:
            return alerts
        outcome = "deleted" if event.type == ChangeType.DELETED else f"bound to {event.node}"
        at = to_ms(event.event_time)
        return [*alerts, self._pending_alert(cluster, pending, at, AlertState.RESOLVED, outcome)]

    def _expire_pending(self, cluster: _Cluster, at: int) -> list[Alert]:
        due_ms = self.rules.pending_for_s * 1000
        first = cluster.first_waiting
        if first is None:
            waiting = [p.created for p in cluster.pending.values() if not p.alerted]
            first = cluster.first_waiting = min(waiting, default=_NEVER)
        if at - first < due_ms:
            return []
        cluster.first_waiting = None  # some fall due now
        alerts = []
        due = [p for p in cluster.pending.values() if not p.alerted and at - p.created >= due_ms]
        for pending in sorted(due, key=lambda p: (p.created, p.event.uid)):  # asked per event: few due
            pending.alerted = True
            self._changed.add(("pending", pending.event.cluster, pending.event.uid))
            alerts.append(
                self._pending_alert(cluster, pending, pending.created + round(due_ms), AlertState.OPENED, "")
            )
        return alerts

    def _pending_alert(
        self, cluster: _Cluster, pending: _Pending, at: int, state: AlertState, outcome: str
    ) -> Alert:
        pod = pending.event
        labels = {"gpus_requested": f"{pod.gpu_amount:g}"}
        if pod.unschedulable_reason:
            labels["reason"] = pod.unschedulable_reason
        if state is AlertState.OPENED:
            free: dict[str, float] = defaultdict(float)
            most: dict[str, float] = defaultdict(float)
            for node in cluster.nodes.values():
                if node.available:
                    spare = max(node.allocatable - node.held, 0.0)
                    free[node.model or "unknown"] += spare
                    most[node.model or "unknown"] = max(most[node.model or "unknown"], spare)
            labels |= {f"free_gpus.{m}": f"{v:g}" for m, v in sorted(free.items())}
            labels |= {f"max_free_on_one_node.{m}": f"{v:g}" for m, v in sorted(most.items())}
        waited = timedelta(milliseconds=at - pending.created)
        message = (
            f"GPU pod {pod.namespace}/{pod.name} pending for {waited}"
            + (f": {pod.unschedulable_message}" if pod.unschedulable_message else "")
            if state is AlertState.OPENED
            else f"GPU pod {pod.namespace}/{pod.name} {outcome} after {waited} pending"
        )
        return Alert(
            event_id=event_id(pod.cluster, "GpuPodPending", pod.uid, state.value),
            cluster=pod.cluster,
            event_time=from_ms(at),
            source=SOURCE,
            alert="GpuPodPending",
            state=state,
            entity=pod.uid,
            pod_uid=pod.uid,
            pod_namespace=pod.namespace,
            pod_name=pod.name,
            since=from_ms(pending.created),
            message=message,
            labels=labels,
        )

    # --- GpuPendingPileUp ----------------------------------------------------------------------

    def _pile_up(self, cluster: _Cluster, at: int) -> list[Alert]:
        pending = sum(1 for p in cluster.pending.values() if p.alerted)
        idle = sum(1 for run in cluster.runs.values() if run.opened)
        piled = pending >= self.rules.pile_up_pods and idle >= self.rules.pile_up_idle_gpus
        if piled == (cluster.pile_up_since is not None):
            return []
        since, cluster.pile_up_since = (at, at) if piled else (cluster.pile_up_since or at, None)
        state = AlertState.OPENED if piled else AlertState.RESOLVED
        message = (
            f"{pending} GPU pods pending while {idle} GPUs are held but idle"
            if piled
            else f"pile-up over: {pending} GPU pods pending long, {idle} GPUs held but idle"
        )
        return [
            Alert(
                event_id=event_id(cluster.name, "GpuPendingPileUp", since, state.value),
                cluster=cluster.name,
                event_time=from_ms(at),
                source=SOURCE,
                alert="GpuPendingPileUp",
                state=state,
                entity=cluster.name,
                since=from_ms(since),
                message=message,
                labels={"pending_pods": str(pending), "idle_gpus": str(idle)},
            )
        ]

    # --- checkpoint: holders, gpus, run, pending, holding, node besides ["cluster", c] ---------

    def _take_changed(self, cluster: _Cluster) -> Iterable[StateKey]:
        return cluster.holders.take_changed(cluster.name, self._reader)

    def _keys(self, cluster: _Cluster) -> Iterator[StateKey]:
        yield from (("holders", cluster.name, *key) for key in cluster.holders.live())
        for kind, entries in (
            ("gpus", cluster.gpus), ("run", cluster.runs), ("pending", cluster.pending),
            ("holding", cluster.holding), ("node", cluster.nodes), ("health", cluster.health),
            ("sampled", cluster.sampled),
        ):  # fmt: skip
            yield from ((kind, cluster.name, entity) for entity in entries)
        if cluster.pile_up_since is not None or cluster.pile_up_stale:
            yield ("pileup", cluster.name)

    def _dump(self, cluster: _Cluster, key: StateKey) -> Any:
        kind, entity = key[0], key[-1]
        if kind == "cluster":
            return cluster.instant
        if kind == "pileup":
            live = cluster.pile_up_since is not None or cluster.pile_up_stale
            return [cluster.pile_up_since, cluster.pile_up_stale] if live else None
        if kind == "holders":
            return cluster.holders.dump(key[2:])
        if kind == "gpus":
            gpus = cluster.gpus.get(entity)
            return None if gpus is None else list(gpus)
        if kind == "run":
            run = cluster.runs.get(entity)
            return None if run is None else [run.start, run.opened]
        if kind == "pending":
            pending = cluster.pending.get(entity)
            if pending is None:
                return None
            return [pending.created, pending.alerted, pending.event.model_dump(mode="json")]
        if kind == "holding":
            holding = cluster.holding.get(entity)
            return None if holding is None else list(holding)
        if kind == "health":
            health = cluster.health.get(entity)
            if health is None:
                return None
            return [health.at, health.conditions, health.message, health.unhealthy_since]
        if kind == "sampled":
            sampled = cluster.sampled.get(entity)
            return None if sampled is None else [sampled.last, sampled.stale]
        node = cluster.nodes.get(entity)
        if node is None:
            return None
        return [node.allocatable, node.available, node.model, node.held, node.not_ready_since]

    def _load(self, cluster: _Cluster, key: StateKey, value: Any) -> None:
        kind, entity = key[0], key[-1]
        if kind == "cluster":
            cluster.instant = value
        elif kind == "pileup":
            cluster.pile_up_since, cluster.pile_up_stale = value
        elif kind == "holders":
            cluster.holders.load(key[2:], value)
        elif kind == "gpus":
            cluster.gpus[entity] = tuple(sorted(value))
        elif kind == "run":
            cluster.runs[entity] = _Run(*value)
        elif kind == "pending":
            created, alerted, event = value
            cluster.pending[entity] = _Pending(created, PodEvent.model_validate(event), alerted)
            cluster.first_waiting = None
        elif kind == "holding":
            cluster.holding[entity] = (value[0], value[1])
        elif kind == "health":
            cluster.health[entity] = _Health(*value)
        elif kind == "sampled":
            cluster.sampled[entity] = _Sampled(*value)
            self._watch(cluster, value[0] + self._stale_ms, entity)
        else:
            cluster.nodes[entity] = _NodeState(*value)


def _holds_gpus(cluster: _Cluster, node: str) -> bool:
    """Pods hold GPUs on ``node`` (a sum of shares back at zero may keep a rounding rest)."""
    state = cluster.nodes.get(node)
    return state is not None and round(state.held, 9) > 0
