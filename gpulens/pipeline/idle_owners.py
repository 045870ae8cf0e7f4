"""Idle GPU-hours by owner, split by kind: per window, GPU and owner, how each GPU's hours went.

Every GPU an agent reports (DeviceInventory) is a *slot* with a total of one GPU (a MIG
instance: its share of the parent by compute slices, ``3g.40gb`` = 3, the parent itself 0).
Pods holding GPUs (DESIGN.md) claim the GPUs their containers hold (ContainerEvent), each
``gpu_amount / number of its GPUs``; a pod whose devices are unknown claims its node's *pool*
(device ``""``), which has no total. Claims on one GPU add up to at most its total: more
(time-slicing, an overcommitted share) are scaled down to it, and what is left is unallocated.
So, per GPU and window, the rows add up to its total times the time it was known.

A GPU's hours held are split by its latest sample, which describes it from its time until
the next one, for at most ``sample_valid_ms``: *active* (utilization at or above the idle
threshold), *memory-idle* (utilization under ``compute_idle_below`` with at least
``memory_floor_bytes`` of VRAM used), *idle* (the rest under the threshold), or *unmeasured*
(no valid sample; a pool's hours always are). Time is integrated lazily, per slot, up to
each change: a change at instant t counts from t on, so events of one instant are applied
together, as DESIGN.md asks. Event time, windows and state keys follow the aggregators'
skeleton (:mod:`gpulens.pipeline.aggregating`).

State keys besides ``["cluster", c]`` (window, instant): ``["slot", c, node, device]`` (total,
claiming pods, sample kind, until when, integrated up to, listed by the inventory, in the node's
latest batch), ``["sampled", c, node]`` (the instant of its latest batch: the until of its GPUs in
it, which a steady sample moves, is checkpointed once per node, not per GPU),
``["pod", c, uid]``, ``["container", c, node, namespace, pod, container]`` (pod uid, GPUs),
``["names", c, node]`` (its GPUs' names: :mod:`gpulens.pipeline.device_names`; older
checkpoints' ``["alias", c, name]`` are read and replaced) and ``["acc", c, node, device, owner
uid]`` (the window's hours so far).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

from gpulens.pipeline.aggregating import BaseWindowedAggregator, NodeGroupedSnapshot
from gpulens.pipeline.checkpointing import StateKey
from gpulens.pipeline.device_names import DeviceNames
from gpulens.pipeline.holders import SharedHolders
from gpulens.pipeline.state_tables import workload_chain
from gpulens.pipeline.windows import TumblingWindows, from_ms
from gpulens.schemas.model.ids import event_id
from gpulens.schemas.model.models import (
    ChangeType,
    ContainerEvent,
    DeviceInventory,
    DeviceKind,
    Event,
    GpuDevice,
    GpuSampleBatch,
    IdleGpuHours,
    PodEvent,
    Watermark,
)
from gpulens.schemas.wire.sample_columns import SampleColumns

ACTIVE, IDLE, MEMORY_IDLE, UNMEASURED, UNALLOCATED = range(5)
_HOUR_MS = 3_600_000
_MIG_SLICES = re.compile(r"(\d+)g\.")


@dataclass(frozen=True, slots=True)
class IdleRules:
    """What makes a GPU's time active, idle or memory-idle, and which labels name owners."""

    idle_below: float
    """Utilization (percent) under which a held GPU is idle."""
    compute_idle_below: float
    """Utilization (percent) under which a GPU whose VRAM is held is memory-idle."""
    memory_floor_bytes: int
    """VRAM used from which a GPU's memory counts as held."""
    sample_valid_ms: int
    """How long a sample describes its GPU when no newer one comes."""
    owner_labels: tuple[str, ...] = ()
    """Pod labels copied onto the rows."""

    def kind(self, utilization: float | None, memory_used: int | None) -> int:
        """The kind of time a sample starts."""
        if utilization is None:
            return UNMEASURED
        if utilization >= self.idle_below:
            return ACTIVE
        if utilization < self.compute_idle_below and (memory_used or 0) >= max(self.memory_floor_bytes, 1):
            return MEMORY_IDLE
        return IDLE


@dataclass(frozen=True, slots=True)
class _Owner:
    uid: str
    kind: str
    name: str
    namespace: str
    labels: tuple[tuple[str, str], ...]


_NOBODY = _Owner("", "", "", "", ())
_ContainerKey = tuple[str, str, str, str]
"""(node, namespace, pod, container)."""
_T = TypeVar("_T", str, _ContainerKey)


@dataclass(slots=True)
class _Pod:
    owner: _Owner
    name: str
    node: str | None
    amount: float
    """GPUs held now (0 when it holds none)."""


@dataclass(slots=True)
class _Slot:
    total: float | None
    """GPUs it has (None: a node's pool of GPUs held with no device known)."""
    since: int
    """Integrated up to here (epoch ms)."""
    claimants: tuple[str, ...] = ()
    """Uids of the pods claiming it, sorted: a slot has one or none, and a set of one or none
    took 216 bytes per GPU (a tuple of one 48, the empty one shared)."""
    kind: int = UNMEASURED
    until: int = 0
    """The kind holds up to here."""
    listed: bool = False
    """In its node's latest inventory."""
    sampled: bool = False
    """In its node's latest sample batch: its ``until`` is then that batch's, which the node's
    entry is checkpointed with (:meth:`IdleOwners._samples`)."""


@dataclass
class _Cluster:
    name: str
    window_start: int
    instant: int
    slots: dict[tuple[str, str], _Slot] = field(default_factory=dict)
    pods: dict[str, _Pod] = field(default_factory=dict)
    uid_of: dict[tuple[str, str], str] = field(default_factory=dict)
    """(namespace, name) -> uid of the pods that exist."""
    containers: dict[_ContainerKey, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    """(node, namespace, pod, container) -> (pod uid, its GPUs, sorted)."""
    containers_of: dict[str, tuple[_ContainerKey, ...]] = field(default_factory=dict)
    """pod uid -> its containers, sorted. Tuples, as the slots' claimants: a pod has a container or two."""
    names: DeviceNames = field(default_factory=DeviceNames)
    claims: dict[str, dict[tuple[str, str], float]] = field(default_factory=dict)
    """pod uid -> what it claims (:meth:`IdleOwners._claims`), for the pods that claim any."""
    listed: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """node -> the GPUs its latest inventory listed."""
    acc: dict[tuple[str, str, str], tuple[_Owner, list[float]]] = field(default_factory=dict)
    """(node, device, owner uid) -> (owner, GPU-ms per kind) of the open window."""
    sampled_at: dict[str, int] = field(default_factory=dict)
    """node -> the instant of its latest sample batch."""
    sampled: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """node -> the GPUs (with a slot) of its latest sample batch, in order."""


class IdleOwners(NodeGroupedSnapshot, BaseWindowedAggregator[_Cluster, IdleGpuHours]):
    """idle_gpu_hours rows from inventory, container, pod and sample events."""

    hot_kinds = frozenset({"sampled"})
    """Kinds checkpointed in a state log of their own (every node's last sample time changes at every cycle;
    :class:`~gpulens.pipeline.checkpointing.SplitsHotState`)."""
    node_at = MappingProxyType({"slot": 2, "container": 2, "names": 2, "acc": 2})

    def __init__(
        self, windows: TumblingWindows, rules: IdleRules, shared: SharedHolders | None = None
    ) -> None:
        super().__init__(windows)
        self.rules = rules
        self._shared, self._reader = SharedHolders.joined(shared)
        """Where each cluster's GPU names come from, shared with the worker's other operators."""

    def process(self, event: Event | SampleColumns) -> list[IdleGpuHours]:
        """Apply one event; returns the rows of the windows its time closed."""
        rows = self._closed_by(event)
        cluster = self._enter(event)
        if isinstance(event, PodEvent):
            self._pod(cluster, event)
        elif isinstance(event, GpuSampleBatch | SampleColumns):
            self._samples(cluster, event)
        elif isinstance(event, ContainerEvent):
            self._container(cluster, event)
        elif isinstance(event, DeviceInventory):
            self._inventory(cluster, event)
        elif isinstance(event, Watermark) and event.final and cluster.window_start <= cluster.instant:
            rows += self._close_window(cluster)  # the window holding the final watermark
        return rows

    def _open(self, name: str, at: int) -> _Cluster:
        return _Cluster(name, self.windows.start_of(at), at, names=self._shared.of(name).names)

    # --- claims --------------------------------------------------------------------------------

    def _claims(self, cluster: _Cluster, uid: str) -> dict[tuple[str, str], float]:
        """The slots pod ``uid`` claims now, with how much of each (kept until it changes: every
        sample asks it of the GPU's holders)."""
        found = cluster.claims.get(uid)
        if found is None:
            found = self._claimed(cluster, uid)
            if found:
                cluster.claims[uid] = found
        return found

    def _claimed(self, cluster: _Cluster, uid: str) -> dict[tuple[str, str], float]:
        pod = cluster.pods.get(uid)
        if pod is None or pod.node is None or pod.amount <= 0:
            return {}
        gpus = {gpu for key in cluster.containers_of.get(uid, ()) for gpu in cluster.containers[key][1]}
        if not gpus:
            return {(pod.node, ""): pod.amount}
        return {(pod.node, gpu): pod.amount / len(gpus) for gpu in gpus}

    def _reclaim(self, cluster: _Cluster, uid: str, change: Callable[[], None]) -> None:
        """Apply ``change()`` to what pod ``uid`` claims: its slots are integrated up to now
        first, and claim from now on what it claims after."""
        before = self._claims(cluster, uid)
        for key in before:
            self._slot(cluster, key)
        change()
        cluster.claims.pop(uid, None)
        after = self._claims(cluster, uid)
        for key in before.keys() - after.keys():
            slot = self._slot(cluster, key)
            slot.claimants = _without(slot.claimants, uid)
            self._drop_if_unused(cluster, key, slot)
        for key in after:
            slot = self._slot(cluster, key)
            slot.claimants = _with(slot.claimants, uid)

    def _pod(self, cluster: _Cluster, event: PodEvent) -> None:
        uid = event.uid
        self._changed.add(("pod", cluster.name, uid))

        def change() -> None:
            old = cluster.pods.pop(uid, None)
            if old is not None:
                cluster.uid_of.pop((old.owner.namespace, old.name), None)
            if event.type == ChangeType.DELETED:
                return
            top = workload_chain(event)[-1]
            labels = tuple((k, event.labels[k]) for k in self.rules.owner_labels if k in event.labels)
            owner = _Owner(top.uid, top.kind, top.name, event.namespace, labels)
            amount = event.gpu_amount if event.holds_gpus else 0.0
            cluster.pods[uid] = _Pod(owner, event.name, event.node, amount)
            cluster.uid_of[(event.namespace, event.name)] = uid

        self._reclaim(cluster, uid, change)

    def _container(self, cluster: _Cluster, event: ContainerEvent) -> None:
        key = (event.node, event.pod_namespace, event.pod_name, event.container_name)
        uid = event.pod_uid or cluster.uid_of.get((event.pod_namespace, event.pod_name))
        self._changed.add(("container", cluster.name, *key))

        def remove() -> None:
            held_by = cluster.containers.pop(key)[0]
            others = _without(cluster.containers_of[held_by], key)
            if others:
                cluster.containers_of[held_by] = others
            else:
                del cluster.containers_of[held_by]

        def add(uid: str) -> None:
            gpus = (cluster.names.device_id(d.device_id) for d in event.devices if d.kind == DeviceKind.GPU)
            cluster.containers[key] = (uid, tuple(sorted(set(gpus))))
            cluster.containers_of[uid] = _with(cluster.containers_of.get(uid, ()), key)

        previous = cluster.containers.get(key)
        if previous is not None:
            self._reclaim(cluster, previous[0], remove)
        if event.type != ChangeType.DELETED and uid is not None:
            self._reclaim(cluster, uid, lambda: add(uid))

    def _inventory(self, cluster: _Cluster, inventory: DeviceInventory) -> None:
        node = inventory.node
        totals = _totals(inventory.gpus)
        cluster.names.learn(inventory)
        for gone in (gpu for gpu in cluster.listed.pop(node, ()) if gpu not in totals):
            slot = self._slot(cluster, (node, gone))
            slot.listed = False
            self._drop_if_unused(cluster, (node, gone), slot)
        for device, total in totals.items():
            slot = self._slot(cluster, (node, device))
            slot.total, slot.listed = total, True
        if totals:
            cluster.listed[node] = tuple(totals)

    # --- time ------------------------------------------------------------------------------------

    def _slot(self, cluster: _Cluster, key: tuple[str, str]) -> _Slot:
        """The slot ``key`` integrated up to the cluster's instant (created if new)."""
        self._changed.add(("slot", cluster.name, *key))
        slot = cluster.slots.get(key)
        if slot is None:
            slot = cluster.slots[key] = _Slot(None if key[1] == "" else 1.0, cluster.instant)
        else:
            self._integrate(cluster, key, slot, cluster.instant)
        return slot

    def _drop_if_unused(self, cluster: _Cluster, key: tuple[str, str], slot: _Slot) -> None:
        if not slot.listed and not slot.claimants:
            del cluster.slots[key]

    def _integrate(self, cluster: _Cluster, key: tuple[str, str], slot: _Slot, to: int) -> None:
        """Add the slot's hours from where it was integrated up to ``to``."""
        if to <= slot.since:
            return
        span, valid = to - slot.since, max(0, min(to, slot.until) - slot.since)
        claims = [(cluster.pods[uid].owner, self._claims(cluster, uid)[key]) for uid in slot.claimants]
        claimed = sum(amount for _, amount in claims)
        scale = 1.0 if slot.total is None or claimed <= slot.total else slot.total / claimed
        kind = UNMEASURED if slot.total is None else slot.kind
        for owner, amount in claims:
            hours = self._hours(cluster, key, owner)
            hours[kind] += amount * scale * valid
            hours[UNMEASURED] += amount * scale * (span - valid)
        if slot.total is not None and slot.total > claimed * scale:
            self._hours(cluster, key, _NOBODY)[UNALLOCATED] += (slot.total - claimed * scale) * span
        slot.since = to

    def _hours(self, cluster: _Cluster, key: tuple[str, str], owner: _Owner) -> list[float]:
        self._changed.add(("acc", cluster.name, *key, owner.uid))
        found = cluster.acc.get((*key, owner.uid))
        if found is None or (found[0] is not owner and found[0] != owner):  # its labels and names of late
            found = cluster.acc[(*key, owner.uid)] = (owner, found[1] if found else [0.0] * 5)
        return found[1]

    def _samples(self, cluster: _Cluster, batch: GpuSampleBatch | SampleColumns) -> None:
        """Each GPU's kind from now on. A sample that keeps its GPU's kind while the last one is
        still valid only extends it: integrating from ``since`` later, up to the new ``until``,
        gives the same hours (every other change of a slot integrates it first), and most
        samples of a steady fleet are such (the worker's busiest path)."""
        now = cluster.instant
        until = now + self.rules.sample_valid_ms
        kind_of, slots, node = self.rules.kind, cluster.slots, batch.node
        devices = []
        for device, utilization, memory in self._readings(cluster.names, batch):
            key = (node, device)
            slot = slots.get(key)
            if slot is None:
                continue  # a GPU no inventory listed and nobody claims: nothing to split
            kind = kind_of(utilization, memory)
            if kind != slot.kind or now > slot.until:
                slot = self._slot(cluster, key)
                slot.kind = kind
            slot.until = until
            if not slot.sampled:  # new to the node's batches (or a new slot)
                slot.sampled = True
                self._changed.add(("slot", cluster.name, *key))
            devices.append(key[1])
        self._sampled(cluster, node, tuple(devices))

    def _sampled(self, cluster: _Cluster, node: str, devices: tuple[str, ...]) -> None:
        """Note the node's latest batch. A steady sample only moves its GPU's ``until``, to the
        batch's time plus the validity: checkpointed once per node (its ``sampled_at``), not once
        per GPU (each GPU of the fleet, every 2 s). A GPU that joins or leaves the node's batches
        is checkpointed itself, with the flag saying whether the node's time applies to it (set
        by :meth:`_samples`, cleared here)."""
        cluster.sampled_at[node] = cluster.instant
        self._changed.add(("sampled", cluster.name, node))
        before = cluster.sampled.get(node, ())
        if devices == before:
            return
        cluster.sampled[node] = devices
        for device in set(before).difference(devices):
            slot = cluster.slots.get((node, device))
            if slot is not None:
                slot.sampled = False
                self._changed.add(("slot", cluster.name, node, device))

    @staticmethod
    def _readings(
        names: DeviceNames, batch: GpuSampleBatch | SampleColumns
    ) -> Iterable[tuple[str, float | None, int | None]]:
        """(device_id the inventory knows, utilization, VRAM used) per GPU, however the batch
        was read: the names resolved per batch, as the node's last answer where the names are
        the same (the other operators sharing the names asked it first)."""
        if isinstance(batch, SampleColumns):
            ids = names.device_ids(batch.device_ids, batch.node)
            return zip(ids, batch.utilizations, batch.memories, strict=True)
        samples = batch.samples
        ids = names.device_ids([sample.device_id for sample in samples])
        return (
            (device, sample.utilization_pct, sample.memory_used_bytes)
            for device, sample in zip(ids, samples, strict=True)
        )

    def _window_rows(self, cluster: _Cluster, start: int, end: int) -> list[IdleGpuHours]:
        """Every slot integrated up to ``end``; one row per GPU and owner with hours."""
        for key, slot in cluster.slots.items():
            self._changed.add(("slot", cluster.name, *key))
            self._integrate(cluster, key, slot, end)
        rows = []
        for (node, device, uid), (owner, hours) in sorted(cluster.acc.items()):
            self._changed.add(("acc", cluster.name, node, device, uid))
            if any(hours):
                rows.append(self._row(cluster.name, node, device, owner, hours, start, end))
        cluster.acc.clear()
        return rows

    @staticmethod
    def _row(
        cluster: str, node: str, device: str, owner: _Owner, hours: list[float], start: int, end: int
    ) -> IdleGpuHours:
        return IdleGpuHours(
            event_id=event_id(cluster, node, device, owner.uid, "idle_gpu_hours", start, end),
            cluster=cluster,
            window_start=from_ms(start),
            window_end=from_ms(end),
            node=node,
            device_id=device,
            workload_uid=owner.uid,
            workload_kind=owner.kind,
            workload_name=owner.name,
            namespace=owner.namespace,
            owner_labels=dict(owner.labels),
            active_gpu_hours=hours[ACTIVE] / _HOUR_MS,
            idle_gpu_hours=hours[IDLE] / _HOUR_MS,
            memory_idle_gpu_hours=hours[MEMORY_IDLE] / _HOUR_MS,
            unmeasured_gpu_hours=hours[UNMEASURED] / _HOUR_MS,
            unallocated_gpu_hours=hours[UNALLOCATED] / _HOUR_MS,
        )

    # --- checkpoint ------------------------------------------------------------------------------

    def _take_changed(self, cluster: _Cluster) -> Iterable[StateKey]:
        return (("names", cluster.name, node) for node in cluster.names.take_changed(self._reader))

    def _keys(self, cluster: _Cluster) -> Iterator[StateKey]:
        yield from (("slot", cluster.name, *key) for key in cluster.slots)
        yield from (("pod", cluster.name, uid) for uid in cluster.pods)
        yield from (("container", cluster.name, *key) for key in cluster.containers)
        yield from (("names", cluster.name, node) for node in cluster.names.nodes())
        yield from (("acc", cluster.name, *key) for key in cluster.acc)
        yield from (("sampled", cluster.name, node) for node in cluster.sampled_at)

    def _dump(self, cluster: _Cluster, key: StateKey) -> Any:
        kind, rest = key[0], tuple(key[2:])
        if kind == "cluster":
            return [cluster.window_start, cluster.instant]
        if kind == "slot":
            slot = cluster.slots.get(rest)
            if slot is None:
                return None
            claimants = list(slot.claimants)
            return [slot.total, claimants, slot.kind, slot.until, slot.since, slot.listed, slot.sampled]
        if kind == "pod":
            pod = cluster.pods.get(rest[0])
            return None if pod is None else [_owner_fields(pod.owner), pod.name, pod.node, pod.amount]
        if kind == "container":
            held = cluster.containers.get(rest)
            return None if held is None else [held[0], sorted(held[1])]
        if kind == "names":
            return cluster.names.dump(rest[0])
        if kind == "alias":
            return None  # an older checkpoint's per-name entry: its name lives under "names" now
        if kind == "sampled":
            return cluster.sampled_at.get(rest[0])
        found = cluster.acc.get(rest)
        return None if found is None else [_owner_fields(found[0]), found[1]]

    def _load(self, cluster: _Cluster, key: StateKey, value: Any) -> None:
        kind, rest = key[0], tuple(key[2:])
        if kind == "cluster":
            cluster.window_start, cluster.instant = value
        elif kind == "slot":
            total, claimants, sample_kind, until, since, listed, *sampled = value  # older: no flag
            claimed_by = tuple(sorted(claimants))
            slot = cluster.slots[rest] = _Slot(total, since, claimed_by, sample_kind, until, listed)
            if listed:
                cluster.listed[rest[0]] = (*cluster.listed.get(rest[0], ()), rest[1])
            if sampled and sampled[0]:
                slot.sampled = True
                cluster.sampled[rest[0]] = (*cluster.sampled.get(rest[0], ()), rest[1])
                self._restore_until(cluster, rest[0], (slot,))
        elif kind == "pod":
            owner, name, node, amount = value
            pod = cluster.pods[rest[0]] = _Pod(_owner(owner), name, node, amount)
            cluster.uid_of[(pod.owner.namespace, name)] = rest[0]
        elif kind == "container":
            uid, gpus = value
            cluster.containers[rest] = (uid, tuple(sorted(set(gpus))))
            cluster.containers_of[uid] = _with(cluster.containers_of.get(uid, ()), rest)
        elif kind == "sampled":
            cluster.sampled_at[rest[0]] = value
            slots = (cluster.slots[(rest[0], device)] for device in cluster.sampled.get(rest[0], ()))
            self._restore_until(cluster, rest[0], slots)
        elif kind == "names":
            cluster.names.load(rest[0], value)
        elif kind == "alias":
            cluster.names.load_name(rest[0], value)
            self._changed.add(key)  # deleted by the next checkpoint
        else:
            owner, hours = value
            cluster.acc[rest] = (_owner(owner), list(hours))

    def _restore_until(self, cluster: _Cluster, node: str, slots: Iterable[_Slot]) -> None:
        """The ``until`` of GPUs in the node's latest batch, from the node's entry (whichever of
        the two entries is restored first)."""
        at = cluster.sampled_at.get(node)
        if at is not None:
            for slot in slots:
                slot.until = max(slot.until, at + self.rules.sample_valid_ms)


def _owner_fields(owner: _Owner) -> list[Any]:
    return [owner.uid, owner.kind, owner.name, owner.namespace, [list(pair) for pair in owner.labels]]


def _owner(fields: list[Any]) -> _Owner:
    uid, kind, name, namespace, labels = fields
    return _Owner(uid, kind, name, namespace, tuple((k, v) for k, v in labels))


def _totals(gpus: list[GpuDevice]) -> dict[str, float]:
    """Each listed GPU's total: 1, but a MIG parent's GPU is split among its instances by their
    compute slices (``3g.40gb``: 3; an unknown profile: 1) and the parent itself counts 0."""
    slices = {g.device_id: _slices(g.partition) for g in gpus if g.parent_device_id}
    per_parent: dict[str, int] = {}
    for gpu in gpus:
        if gpu.parent_device_id:
            per_parent[gpu.parent_device_id] = per_parent.get(gpu.parent_device_id, 0) + slices[gpu.device_id]
    totals = {}
    for gpu in gpus:
        if gpu.parent_device_id:
            totals[gpu.device_id] = slices[gpu.device_id] / per_parent[gpu.parent_device_id]
        else:
            totals[gpu.device_id] = 0.0 if gpu.device_id in per_parent else 1.0
    return totals


def _slices(partition: str | None) -> int:
    found = _MIG_SLICES.match(partition or "")
    return int(found.group(1)) if found else 1


def _with(items: tuple[_T, ...], item: _T) -> tuple[_T, ...]:
    """Sorted ``items`` with ``item`` among them (the same tuple if it was)."""
    if item in items:
        return items
    merged = list(items)
    merged.append(item)  # not (*items, item): mypy cannot unpack a constrained type variable
    return tuple(sorted(merged))


def _without(items: tuple[_T, ...], item: _T) -> tuple[_T, ...]:
    """``items`` less ``item``, in order."""
    return tuple(i for i in items if i != item)
