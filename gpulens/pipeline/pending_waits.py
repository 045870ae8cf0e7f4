"""Why each GPU pod waits, judged at every window's end in event time: pending_gpu_pods rows.

The worker keeps, per cluster, the nodes (allocatable GPUs, Ready and schedulable, model), the
GPUs each running pod holds on its node, and the GPU pods waiting unbound (DESIGN.md: not
deleted, no node, phase Pending, GPU amount above zero), with the scheduler's words from their
newest event; and the Kueue Workloads its queue has not admitted (their Jobs are suspended:
no pod exists yet), each one waiting entry with its GPU request and the queue's message. At
each window's end, after every event before it, each waiting pod is judged on
the cluster's free GPUs by node (:mod:`gpulens.pipeline.waiting_reasons`: reason class and
consolidation what-if), and a :class:`~gpulens.schemas.model.models.PendingGpuPod` row is
written when its verdict differs from the one last written for it. A pod's verdict at an instant
is therefore its newest row by then; a pod bound or deleted within one window gets none (its
wait, ``scheduled_time - creation_time``, is in the pods table).

Each wait that ends (the pod bound, deleted unbound, or out of Pending otherwise; a Kueue
Workload admitted) is also observed, as it is processed, into the Prometheus histogram
``gpulens_gpu_pod_wait_seconds`` by cluster, namespace and outcome, on the worker's
``/metrics``: kube-scheduler's pod scheduling histogram for GPU pods, in event time. A
restarted worker counts from zero again (a counter reset, which ``rate`` and ``increase`` take
in their stride); the changes between its last commit and the crash are counted by both.

Time, windows and checkpoints follow the aggregators' skeleton (:mod:`gpulens.pipeline.aggregating`).
A window in which no pod or node changed judges nothing (the verdicts could not differ).
State is checkpointed key by key: ``["cluster", c]`` (window start, instant, whether anything
changed since the last judgement), ``["node", c, name]`` (allocatable milli-GPUs, available,
model, exists), ``["holding", c, uid]`` (node, milli-GPUs) and ``["pending", c, uid]`` (the
waiting pod and the verdict last written).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import astuple, dataclass, field
from datetime import datetime
from typing import Any

from prometheus_client import Histogram

from gpulens.pipeline.aggregating import BaseWindowedAggregator
from gpulens.pipeline.checkpointing import StateKey
from gpulens.pipeline.waiting_reasons import NOT_ADMITTED, ClusterRoom, NodeRoom, Waiting
from gpulens.pipeline.windows import MILLI, TumblingWindows, from_ms, milli, to_ms
from gpulens.schemas.model.ids import event_id
from gpulens.schemas.model.models import (
    ChangeType,
    Event,
    NodeEvent,
    PendingGpuPod,
    PodEvent,
    Watermark,
    WorkloadEvent,
    WorkloadStatus,
)
from gpulens.schemas.wire.sample_columns import SampleColumns

SOURCE = "gpulens-worker"
WAIT_BUCKETS_S = (
    10,
    30,
    60,
    300,
    600,
    1_800,
    3_600,
    3 * 3_600,
    6 * 3_600,
    12 * 3_600,
    86_400,
    3 * 86_400,
    7 * 86_400,
)
POD_WAITS = Histogram(
    "gpulens_gpu_pod_wait_seconds",
    "How long GPU pods waited unbound, from creation to binding (outcome bound), to deletion "
    "(deleted) or to leaving Pending otherwise (ended), in event time.",
    ("cluster", "namespace", "outcome"),
    buckets=WAIT_BUCKETS_S,
)


@dataclass(slots=True)
class _Node:
    allocatable: int = 0
    """milli-GPUs."""
    available: bool = False
    """Ready and schedulable."""
    model: str | None = None
    exists: bool = False


@dataclass(slots=True)
class _Waiting:
    created: int
    namespace: str
    name: str
    request: int
    """milli-GPUs."""
    models: list[str]
    reason: str | None
    """The scheduler's reason (its PodScheduled condition's, while False)."""
    message: str | None
    said: list[Any] | None = None
    """The verdict last written: [class, fits after consolidation, reason, message]."""


@dataclass
class _Cluster:
    name: str
    window_start: int
    instant: int
    nodes: dict[str, _Node] = field(default_factory=dict)
    holding: dict[str, tuple[str, int]] = field(default_factory=dict)
    """pod uid -> (node, milli-GPUs) of pods holding GPUs."""
    on_node: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(dict))
    """node -> pod uid -> milli-GPUs: ``holding`` by node (rebuilt from it on restore)."""
    waiting: dict[str, _Waiting] = field(default_factory=dict)
    changed: bool = False
    """A pod or node changed since the last judgement: otherwise every verdict would be the same."""


def _pod_outcome(event: PodEvent) -> tuple[str, datetime]:
    """How a pod's wait ended with ``event``, and when."""
    if event.node is not None:
        return "bound", event.scheduled_time or event.event_time
    if event.type == ChangeType.DELETED:
        return "deleted", event.deletion_time or event.event_time
    return "ended", event.event_time


class PendingWaits(BaseWindowedAggregator[_Cluster, PendingGpuPod]):
    """pending_gpu_pods rows from pod and node events (module docstring)."""

    def __init__(self, windows: TumblingWindows, *, waits: Histogram = POD_WAITS) -> None:
        super().__init__(windows)
        self._waits = waits
        """Where ended waits are observed (a histogram with the labels of :data:`POD_WAITS`)."""

    def process(self, event: Event | SampleColumns) -> list[PendingGpuPod]:
        """Apply a pod or node event, or close every window on a final watermark; the rows of
        the windows its time closed (the worker takes them from :meth:`advance` first)."""
        if isinstance(event, Watermark):
            if not event.final:
                return []
            return self._closed_by(event) + self.finish(event.cluster, to_ms(event.event_time))
        if not isinstance(event, PodEvent | NodeEvent | WorkloadEvent):
            return []
        rows = self._closed_by(event)
        cluster = self._enter(event)
        if isinstance(event, WorkloadEvent) and event.admitted is None:
            return rows  # not a queued workload: it never waits here, and changes no verdict
        cluster.changed = True
        if isinstance(event, PodEvent):
            self._pod(cluster, event)
        elif isinstance(event, WorkloadEvent):
            self._queued(cluster, event)
        else:
            self._node(cluster, event)
        return rows

    def _closes_windows(self, event: Event | SampleColumns) -> bool:
        return isinstance(event, PodEvent | NodeEvent | WorkloadEvent) or (
            isinstance(event, Watermark) and event.final
        )

    def _open(self, name: str, at: int) -> _Cluster:
        return _Cluster(name, self.windows.start_of(at), at)

    # --- state changes ----------------------------------------------------------------------

    def _pod(self, cluster: _Cluster, event: PodEvent) -> None:
        uid, changed = event.uid, self._changed
        before = cluster.holding.pop(uid, None)
        if before is not None:
            cluster.on_node[before[0]].pop(uid, None)
            changed.add(("holding", cluster.name, uid))
        if event.holds_gpus and event.node is not None:
            cluster.holding[uid] = (event.node, milli(event.gpu_amount))
            cluster.on_node[event.node][uid] = milli(event.gpu_amount)
            changed.add(("holding", cluster.name, uid))
        waiting = (
            event.type != ChangeType.DELETED
            and event.node is None
            and event.phase == "Pending"
            and event.gpu_amount > 0
        )
        if not waiting:
            self._end(cluster, uid, *_pod_outcome(event))
            return
        old = cluster.waiting.get(uid)
        cluster.waiting[uid] = _Waiting(
            created=to_ms(event.creation_time),
            namespace=event.namespace,
            name=event.name,
            request=milli(event.gpu_amount),
            models=list(event.gpu_models),
            reason=event.unschedulable_reason,
            message=event.unschedulable_message,
            said=old.said if old else None,
        )
        changed.add(("pending", cluster.name, uid))

    def _queued(self, cluster: _Cluster, event: WorkloadEvent) -> None:
        """A Kueue Workload waits while its queue has not admitted it."""
        uid = event.uid
        waiting = (
            not event.admitted
            and event.type != ChangeType.DELETED
            and event.status == WorkloadStatus.RUNNING
            and event.gpu_request > 0
        )
        if not waiting:
            if event.type == ChangeType.DELETED:
                outcome = "deleted"
            else:
                outcome = "admitted" if event.admitted else "ended"
            self._end(cluster, uid, outcome, event.event_time)
            return
        old = cluster.waiting.get(uid)
        cluster.waiting[uid] = _Waiting(
            created=to_ms(event.creation_time or event.event_time),
            namespace=event.namespace,
            name=event.name,
            request=milli(event.gpu_request),
            models=[],
            reason=NOT_ADMITTED,
            message=event.admission_message,
            said=old.said if old else None,
        )
        self._changed.add(("pending", cluster.name, uid))

    def _end(self, cluster: _Cluster, uid: str, outcome: str, at: datetime) -> None:
        """The wait of ``uid``, if it waits, ended at ``at``: observed by ``outcome``."""
        ended = cluster.waiting.pop(uid, None)
        if ended is None:
            return
        self._changed.add(("pending", cluster.name, uid))
        waited_s = max(to_ms(at) - ended.created, 0) / 1000
        self._waits.labels(cluster.name, ended.namespace, outcome).observe(waited_s)

    def _node(self, cluster: _Cluster, event: NodeEvent) -> None:
        node = cluster.nodes.setdefault(event.node, _Node())
        deleted = event.type == ChangeType.DELETED
        node.allocatable = 0 if deleted else milli(event.gpus_allocatable)
        node.available = not deleted and event.ready and event.schedulable
        node.model = event.gpu_model or node.model
        node.exists = not deleted
        self._changed.add(("node", cluster.name, event.node))

    # --- windows ----------------------------------------------------------------------------

    def _window_rows(self, cluster: _Cluster, start: int, end: int) -> list[PendingGpuPod]:
        if not cluster.waiting or not cluster.changed:
            return []
        cluster.changed = False
        names = {name for name, node in cluster.nodes.items() if node.exists} | {
            name for name, pods in cluster.on_node.items() if pods
        }
        room = ClusterRoom(self._room(cluster, name) for name in sorted(names))
        rows = []
        for uid, pod in sorted(cluster.waiting.items(), key=lambda item: (item[1].created, item[0])):
            verdict = room.judge(Waiting(pod.request, tuple(pod.models), pod.reason, pod.message))
            said = [verdict.reason.value, verdict.fits_after_consolidation, pod.reason, pod.message]
            if said == pod.said:
                continue
            pod.said = said
            self._changed.add(("pending", cluster.name, uid))
            rows.append(
                PendingGpuPod(
                    event_id=event_id(cluster.name, "pending_gpu_pod", uid, end),
                    cluster=cluster.name,
                    event_time=from_ms(end),
                    source=SOURCE,
                    uid=uid,
                    namespace=pod.namespace,
                    name=pod.name,
                    created=from_ms(pod.created),
                    waited_s=max(end - pod.created, 0) / 1000,
                    gpus_requested=pod.request / MILLI,
                    reason_class=verdict.reason.value,
                    scheduler_reason=pod.reason,
                    scheduler_message=pod.message,
                    gpus_free=verdict.free / MILLI,
                    max_free_on_one_node=verdict.max_free_on_one_node / MILLI,
                    fits_after_consolidation=verdict.fits_after_consolidation,
                )
            )
        return rows

    @staticmethod
    def _room(cluster: _Cluster, name: str) -> NodeRoom:
        node = cluster.nodes.get(name) or _Node()
        held = list(cluster.on_node.get(name, {}).values())
        return NodeRoom(name, node.model, node.allocatable if node.exists else 0, held, node.available)

    # --- checkpoint: ["node", c, name], ["holding", c, uid], ["pending", c, uid] ----------------

    def _keys(self, cluster: _Cluster) -> Iterator[StateKey]:
        for kind, entries in self._entries(cluster).items():
            yield from ((kind, cluster.name, entity) for entity in entries)

    @staticmethod
    def _entries(cluster: _Cluster) -> dict[str, dict[str, Any]]:
        return {"node": cluster.nodes, "holding": cluster.holding, "pending": cluster.waiting}

    def _dump(self, cluster: _Cluster, key: StateKey) -> Any:
        kind = key[0]
        if kind == "cluster":
            return [cluster.window_start, cluster.instant, cluster.changed]
        entry = self._entries(cluster)[kind].get(key[2])
        if entry is None:
            return None
        return list(entry) if kind == "holding" else list(astuple(entry))

    def _load(self, cluster: _Cluster, key: StateKey, value: Any) -> None:
        kind = key[0]
        if kind == "cluster":
            cluster.window_start, cluster.instant, cluster.changed = value
        elif kind == "node":
            cluster.nodes[key[2]] = _Node(*value)
        elif kind == "holding":
            node, amount = value
            cluster.holding[key[2]] = (node, amount)
            cluster.on_node[node][key[2]] = amount
        else:
            cluster.waiting[key[2]] = _Waiting(*value)
