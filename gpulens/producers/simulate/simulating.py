"""The simulated cluster as a discrete-event simulation: a clock, a queue of what happens next.

At the start every node joins (NodeEvent, DeviceInventory) and the cluster is warmed up with
running pods, so its allocation is near the offered load from the first window. Then, in
event time: GPU pods arrive (Poisson), are scheduled after a short latency onto the node
that fits them best, or wait as Unschedulable until GPUs free up (and give up after a while);
they start, run an exponential time, succeed (or fail) and are deleted. Every interval each
Ready node reports one GpuSampleBatch. With churn, nodes go NotReady and come back, are
removed and replaced, and GPUs fall off the bus (their pod fails) and return.

Everything at one instant happens in a fixed order, releases before acquisitions before
samples, so a GPU is never held twice and samples see the instant's final state. The samples
of one instant come as one :class:`SampleRound` (columns for the whole fleet): :meth:`stream`
yields it as it is, for a publisher that writes its bytes directly, :meth:`events` as the
GpuSampleBatch records it stands for. All
randomness comes from two streams seeded by the spec (cluster dynamics, GPU telemetry): the
same spec gives the same records, and the sampling interval never shifts the pods.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from gpulens.producers.simulate.exceptions import SimulationError
from gpulens.producers.simulate.records import RecordBuilder, gpu_devices, rdma_devices, stable_uuid
from gpulens.producers.simulate.rounds import SampleRound
from gpulens.producers.simulate.sampling import GpuTelemetry
from gpulens.producers.simulate.scheduling import BestFit
from gpulens.producers.simulate.specs import SimulationSpec, gpus_of
from gpulens.producers.simulate.state import SimGpu, SimNode, SimPod, SimWorkload
from gpulens.schemas.model.models import ChangeType, Event, Watermark, WorkloadStatus
from gpulens.schemas.model.topics import (
    CONTAINERS,
    DEVICE_INVENTORY,
    GPU_SAMPLES,
    NODES,
    PODS,
    WATERMARKS,
    WORKLOADS,
    TopicSpec,
)

Action = Callable[[Any], None]
Item = Event | SampleRound
"""What :meth:`ClusterSimulation.stream` yields: a record, or one instant's GPU samples."""

# Order of what happens at one instant.
_RELEASE, _ACQUIRE, _SAMPLE = 0, 1, 2

_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"
"""The alphabet Kubernetes draws generated name suffixes from."""
_SCHEDULING_S = (0.2, 2.0)
_STARTUP_S = (2.0, 15.0)
"""Image pull and container start."""
_CLEANUP_S = (1.0, 10.0)
"""From finished to deleted (TTL controller, Deployment scale-down)."""
_PATIENCE_S = (600.0, 3600.0)
"""How long an unschedulable pod waits before its owner deletes it."""
_WARM_MAX_LOAD = 0.9


@dataclass(frozen=True, slots=True)
class Census:
    """How the cluster stands now."""

    nodes: int
    ready: int
    gpus: int
    """Allocatable GPUs on Ready nodes."""
    held: int
    """GPUs held by pods bound to a node."""
    running: int
    pending: int


class ClusterSimulation:
    """One simulated cluster; :meth:`events` yields its records in non-decreasing event time."""

    def __init__(self, spec: SimulationSpec) -> None:
        self.spec = spec
        self.now_ms = spec.start_ms
        self.nodes: list[SimNode] = []
        self.pods: dict[str, SimPod] = {}
        """Pods not deleted yet, by uid."""
        self._rng = random.Random(f"{spec.seed}/cluster")
        self._telemetry = GpuTelemetry(
            spec.model, spec.interval_s, spec.gpus_per_node, random.Random(f"{spec.seed}/samples")
        )
        self._records = RecordBuilder(spec.cluster, spec.model, spec.gpus_per_node)
        self._fit = BestFit(spec.gpus_per_node)
        self._rdma = rdma_devices(spec.gpus_per_node)
        self._queue: list[tuple[int, int, int, Action, Any]] = []
        self._sequence = itertools.count()
        self._out: list[tuple[TopicSpec, Item]] = []
        self._waiting: dict[str, SimPod] = {}
        """Unschedulable pods, first come first served."""
        self._retry_at: int | None = None
        self._pod_numbers = itertools.count(1)
        # Objects of one run get uids of their own: two runs of one cluster never share a pod.
        self._run = f"{spec.cluster}/{spec.seed}/{spec.start_ms}"
        self._started = False

    # --- driving -----------------------------------------------------------------------------

    def events(self) -> Generator[tuple[TopicSpec, Event], None, None]:
        """Every record in non-decreasing event time; with a duration, the final watermark last."""
        for topic, item in self.stream():
            if isinstance(item, SampleRound):
                for batch in item.batches():
                    yield topic, batch
            else:
                yield topic, item

    def stream(self) -> Generator[tuple[TopicSpec, Item], None, None]:
        """:meth:`events`, with each instant's GpuSampleBatches as one :class:`SampleRound`."""
        if self._started:
            raise SimulationError("a simulation runs once; make a new one from the same spec")
        self._started = True
        self._begin()
        yield from self._drain()
        end, queue = self.spec.end_ms, self._queue
        while queue and (end is None or queue[0][0] < end):
            at, _, _, action, arg = heapq.heappop(queue)
            self.now_ms = at
            action(arg)
            if self._out:
                yield from self._drain()
        if end is not None:
            self.now_ms = end
            yield WATERMARKS, self.final_watermark()

    def final_watermark(self) -> Watermark:
        """The watermark that ends the run now: nothing earlier than the current instant follows."""
        return self._records.watermark(self.now_ms)

    def census(self) -> Census:
        """Nodes, GPUs and pods now (for progress reports)."""
        present = [n for n in self.nodes if n.present]
        ready = [n for n in present if n.ready]
        running = sum(1 for p in self.pods.values() if p.phase == "Running")
        pending = sum(1 for p in self.pods.values() if p.phase == "Pending" and p.node is None)
        return Census(
            nodes=len(present),
            ready=len(ready),
            gpus=sum(n.allocatable for n in ready),
            held=sum(sum(p.gpus for p in n.pods.values()) for n in present),
            running=running,
            pending=pending,
        )

    def _drain(self) -> list[tuple[TopicSpec, Item]]:
        out, self._out = self._out, []
        return out

    def _at(self, at_ms: int, order: int, action: Action, arg: Any = None) -> None:
        heapq.heappush(self._queue, (at_ms, order, next(self._sequence), action, arg))

    def _after(self, seconds: float, order: int, action: Action, arg: Any = None) -> None:
        self._at(self.now_ms + max(1, round(seconds * 1000)), order, action, arg)

    def _uniform(self, bounds: tuple[float, float]) -> float:
        return self._rng.uniform(*bounds)

    # --- the start ---------------------------------------------------------------------------

    def _begin(self) -> None:
        spec, rates = self.spec, self.spec.churn_rates
        for index in range(spec.nodes):
            self._add_node(index)
        self._warm_up()
        self._at(self.now_ms, _SAMPLE, self._sample)
        self._next_arrival()
        for per_node_hour, action in (
            (rates.not_ready, self._node_not_ready),
            (rates.removed, self._node_removed),
            (rates.gpu_lost, self._gpu_lost),
        ):
            self._next_churn(per_node_hour, action)

    def _add_node(self, index: int) -> None:
        spec, name = self.spec, f"gpu-node-{index:05d}"
        devices = gpu_devices(spec.cluster, name, spec.model, spec.gpus_per_node)
        node = SimNode(
            index=index,
            name=name,
            uid=stable_uuid(self._run, "node", name),
            gpus=[SimGpu(device) for device in devices],
            rdma=self._rdma,
        )
        self.nodes.append(node)
        self._fit.update(node)
        self._out.append((NODES, self._records.node(node, ChangeType.ADDED, self.now_ms)))
        self._out.append((DEVICE_INVENTORY, self._records.inventory(node, self.now_ms)))

    def _warm_up(self) -> None:
        """Pods already running when the simulation starts, as a watcher's first list shows them."""
        spec, rng, now = self.spec, self._rng, self.now_ms
        offered = spec.arrivals_per_s * spec.mean_gpus_per_pod * spec.pod_duration_s
        target = min(offered, _WARM_MAX_LOAD * spec.nodes * spec.gpus_per_node)
        held, misses = 0, 0
        while held < target and misses < 20:
            # Exponential durations are memoryless: the age and the time left (the pod's
            # duration here) of a pod running at a random instant are both exponential.
            age_ms = round(rng.expovariate(1 / spec.pod_duration_s) * 1000)
            pod = self._new_pod(now - age_ms - 10_000)
            index = self._fit.place(pod.gpus)
            if index is None:
                misses += 1
                continue
            held += pod.gpus
            self._take(pod, self.nodes[index], scheduled_ms=pod.created_ms + 2_000)
            pod.phase, pod.started_ms = "Running", pod.created_ms + 10_000
            self._telemetry.begin(pod, now)
            self.pods[pod.uid] = pod
            for workload in reversed(pod.owners):
                self._out.append((WORKLOADS, self._records.workload(workload, ChangeType.ADDED, now)))
            self._out.append((PODS, self._records.pod(pod, ChangeType.ADDED, now)))
            self._out.append((CONTAINERS, self._records.container(pod, ChangeType.ADDED, now)))
            self._at(now + pod.duration_ms, _RELEASE, self._finish, pod)

    # --- pods --------------------------------------------------------------------------------

    def _new_pod(self, created_ms: int) -> SimPod:
        spec, rng = self.spec, self._rng
        profile = rng.choices(spec.profiles, [p.share for p in spec.profiles])[0]
        size = rng.choices([s for s, _ in profile.sizes], [w for _, w in profile.sizes])[0]
        gpus = gpus_of(size, spec.gpus_per_node)
        number = next(self._pod_numbers)
        name = f"{profile.name}-{number:06d}"
        top = SimWorkload(
            uid=stable_uuid(self._run, profile.kind, number),
            name=name,
            namespace=profile.namespace,
            kind=profile.kind,
            group=profile.group,
            version=profile.version,
            gpus=gpus,
            created_ms=created_ms,
        )
        owners = [top]
        suffix = "".join(rng.choices(_NAME_CHARS, k=5))
        if profile.kind == "Deployment":
            replica_set = SimWorkload(
                uid=stable_uuid(self._run, "ReplicaSet", number),
                name=f"{name}-{''.join(rng.choices(_NAME_CHARS, k=10))}",
                namespace=profile.namespace,
                kind="ReplicaSet",
                group="apps",
                version="v1",
                gpus=gpus,
                created_ms=created_ms,
                parent=top,
            )
            owners.insert(0, replica_set)
            pod_name = f"{replica_set.name}-{suffix}"
        elif profile.kind == "StatefulSet":
            pod_name = f"{name}-0"
        else:
            pod_name = f"{name}-{suffix}"
        return SimPod(
            number=number,
            uid=stable_uuid(self._run, "pod", number),
            name=pod_name,
            profile=profile,
            gpus=gpus,
            owners=owners,
            created_ms=created_ms,
            duration_ms=max(1, round(rng.expovariate(1 / spec.pod_duration_s) * 1000)),
            busy_pct=rng.uniform(*profile.busy_pct),
            memory_fraction=rng.uniform(*profile.memory_fraction),
        )

    def _next_arrival(self) -> None:
        rate = self.spec.arrivals_per_s
        if rate > 0:
            self._after(self._rng.expovariate(rate), _ACQUIRE, self._arrive)

    def _arrive(self, _: None) -> None:
        self._next_arrival()
        now = self.now_ms
        pod = self._new_pod(now)
        self.pods[pod.uid] = pod
        for workload in reversed(pod.owners):
            self._out.append((WORKLOADS, self._records.workload(workload, ChangeType.ADDED, now)))
        self._out.append((PODS, self._records.pod(pod, ChangeType.ADDED, now)))
        self._after(self._uniform(_SCHEDULING_S), _ACQUIRE, self._schedule, pod)

    def _schedule(self, pod: SimPod) -> None:
        if pod.deleted or pod.node is not None:
            return
        index = self._fit.place(pod.gpus)
        if index is not None:
            self._bind(pod, self.nodes[index])
            return
        self._waiting[pod.uid] = pod
        if pod.unschedulable is None:
            pod.unschedulable = self._scheduler_message()
            self._out.append((PODS, self._records.pod(pod, ChangeType.MODIFIED, self.now_ms)))
            self._after(self._uniform(_PATIENCE_S), _RELEASE, self._give_up, pod)

    def _scheduler_message(self) -> str:
        present = [n for n in self.nodes if n.present]
        not_ready = sum(1 for n in present if not n.ready)
        resource = self.spec.model.resource
        message = f"0/{len(present)} nodes are available: {len(present) - not_ready} Insufficient {resource}"
        if not_ready:
            message += f", {not_ready} node(s) had untolerated taint {{node.kubernetes.io/unreachable: }}"
        return message + "."

    def _take(self, pod: SimPod, node: SimNode, *, scheduled_ms: int) -> None:
        pod.devices = [g for g in node.gpus if g.present and g.holder is None][: pod.gpus]
        for gpu in pod.devices:
            gpu.holder = pod
        pod.node, pod.scheduled_ms, pod.unschedulable = node, scheduled_ms, None
        node.pods[pod.uid] = pod
        self._fit.update(node)

    def _bind(self, pod: SimPod, node: SimNode) -> None:
        self._waiting.pop(pod.uid, None)
        self._take(pod, node, scheduled_ms=self.now_ms)
        self._out.append((PODS, self._records.pod(pod, ChangeType.MODIFIED, self.now_ms)))
        self._after(self._uniform(_STARTUP_S), _ACQUIRE, self._start, pod)

    def _start(self, pod: SimPod) -> None:
        if pod.finished_ms is not None or pod.deleted:
            return  # its node went away while the image was pulling
        now = self.now_ms
        pod.phase, pod.started_ms = "Running", now
        self._telemetry.begin(pod, now)
        self._out.append((PODS, self._records.pod(pod, ChangeType.MODIFIED, now)))
        self._out.append((CONTAINERS, self._records.container(pod, ChangeType.ADDED, now)))
        self._at(now + pod.duration_ms, _RELEASE, self._finish, pod)

    def _finish(self, pod: SimPod) -> None:
        if pod.phase != "Running":
            return
        if self._rng.random() < pod.profile.failure_rate:
            self._terminate(pod, "Failed", reason="Error", exit_code=1)
        else:
            self._terminate(pod, "Succeeded", reason="Completed", exit_code=0)
        self._after(self._uniform(_CLEANUP_S), _RELEASE, self._delete, pod)

    def _terminate(self, pod: SimPod, phase: str, *, reason: str, exit_code: int | None) -> None:
        """The pod ends: its container goes (first: the GPUs are free before the pod says so)."""
        now, node = self.now_ms, pod.node
        if node is not None:
            if pod.phase == "Running":
                self._out.append((CONTAINERS, self._records.container(pod, ChangeType.DELETED, now)))
            for gpu in pod.devices:
                gpu.holder = None
            pod.devices = []
            node.pods.pop(pod.uid, None)
            self._fit.update(node)
        pod.phase, pod.reason, pod.exit_code, pod.finished_ms = phase, reason, exit_code, now
        self._out.append((PODS, self._records.pod(pod, ChangeType.MODIFIED, now)))
        top = pod.owners[-1]
        if top.kind == "Job":
            top.status = WorkloadStatus.DONE if phase == "Succeeded" else WorkloadStatus.FAILED
            self._out.append((WORKLOADS, self._records.workload(top, ChangeType.MODIFIED, now)))
        self._retry_soon()

    def _delete(self, pod: SimPod) -> None:
        if pod.deleted:
            return
        now = self.now_ms
        pod.deleted_ms = now
        self._waiting.pop(pod.uid, None)
        self.pods.pop(pod.uid, None)
        self._out.append((PODS, self._records.pod(pod, ChangeType.DELETED, now)))
        for workload in pod.owners:
            workload.status = WorkloadStatus.DELETED
            self._out.append((WORKLOADS, self._records.workload(workload, ChangeType.DELETED, now)))

    def _give_up(self, pod: SimPod) -> None:
        if pod.node is None:
            self._delete(pod)

    def _retry_soon(self) -> None:
        """Try the waiting pods once this instant's releases are all done."""
        if self._waiting and self._retry_at != self.now_ms:
            self._retry_at = self.now_ms
            self._at(self.now_ms, _ACQUIRE, self._retry)

    def _retry(self, _: None) -> None:
        self._retry_at = None
        for pod in list(self._waiting.values()):
            most = self._fit.most_free
            if most == 0:
                break
            if pod.gpus <= most:
                index = self._fit.place(pod.gpus)
                if index is not None:
                    self._bind(pod, self.nodes[index])

    # --- GPU samples -------------------------------------------------------------------------

    def _sample(self, _: None) -> None:
        now = self.now_ms
        self._at(now + self.spec.interval_ms, _SAMPLE, self._sample)
        samples = self._telemetry.sample(self.nodes, self.pods.values(), now, self._records)
        self._out.append((GPU_SAMPLES, samples))

    # --- churn -------------------------------------------------------------------------------

    def _next_churn(self, per_node_hour: float, action: Action) -> None:
        rate = self.spec.churn * per_node_hour * self.spec.nodes / 3600
        if rate > 0:
            self._after(self._rng.expovariate(rate), _RELEASE, action)

    def _node_changed(self, node: SimNode, change: ChangeType = ChangeType.MODIFIED) -> None:
        self._fit.update(node)
        self._out.append((NODES, self._records.node(node, change, self.now_ms)))

    def _node_not_ready(self, _: None) -> None:
        self._next_churn(self.spec.churn_rates.not_ready, self._node_not_ready)
        candidates = [n for n in self.nodes if n.present and n.ready]
        if candidates:
            node = self._rng.choice(candidates)
            node.ready = False
            self._node_changed(node)
            self._after(self._uniform(self.spec.churn_rates.not_ready_s), _ACQUIRE, self._node_ready, node)

    def _node_ready(self, node: SimNode) -> None:
        if node.present and not node.ready:
            node.ready = True
            self._node_changed(node)
            self._retry_soon()

    def _node_removed(self, _: None) -> None:
        self._next_churn(self.spec.churn_rates.removed, self._node_removed)
        candidates = [n for n in self.nodes if n.present]
        if not candidates:
            return
        node = self._rng.choice(candidates)
        for pod in list(node.pods.values()):  # the pod garbage collector deletes what ran there
            self._terminate(pod, "Failed", reason="NodeLost", exit_code=None)
            self._delete(pod)
        node.present = False
        self._node_changed(node, ChangeType.DELETED)
        self._after(self._uniform(self.spec.churn_rates.replaced_after_s), _ACQUIRE, self._node_replaced)

    def _node_replaced(self, _: None) -> None:
        self._add_node(len(self.nodes))
        self._retry_soon()

    def _gpu_lost(self, _: None) -> None:
        self._next_churn(self.spec.churn_rates.gpu_lost, self._gpu_lost)
        candidates = [n for n in self.nodes if n.present and n.allocatable > 0]
        if not candidates:
            return
        node = self._rng.choice(candidates)
        gpu = self._rng.choice([g for g in node.gpus if g.present])
        if gpu.holder is not None:  # the job's process dies with its GPU (Xid 79)
            holder = gpu.holder
            self._terminate(holder, "Failed", reason="Error", exit_code=1)
            self._after(self._uniform(_CLEANUP_S), _RELEASE, self._delete, holder)
        gpu.present = False
        self._node_changed(node)
        self._out.append((DEVICE_INVENTORY, self._records.inventory(node, self.now_ms)))
        back_s = self._uniform(self.spec.churn_rates.gpu_back_after_s)
        self._after(back_s, _ACQUIRE, self._gpu_back, (node, gpu))

    def _gpu_back(self, lost: tuple[SimNode, SimGpu]) -> None:
        node, gpu = lost
        if not node.present or gpu.present:
            return
        gpu.present = True  # it starts cool again: the telemetry sees it return
        self._node_changed(node)
        self._out.append((DEVICE_INVENTORY, self._records.inventory(node, self.now_ms)))
        self._retry_soon()
