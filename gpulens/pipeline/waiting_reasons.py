"""Why a GPU pod waits: its reason class and a consolidation what-if, from the cluster's free GPUs.

Pure arithmetic on one instant's state (no time, no I/O): :mod:`gpulens.pipeline.pending_waits`
gives it the nodes and pods as they are at a window's end. Amounts are milli-GPUs (integers, as
:func:`gpulens.pipeline.windows.milli` makes them), so that shares add up exactly.

A node's *free* amount is its allocatable GPUs minus those its pods hold, never below zero; the
pod *may use* a node of one of its GPU models (any node when it names none). The class, first
that applies:

1. ``not_admitted``: the PodScheduled condition says ``SchedulingGated``: the pod waits on a
   scheduling gate, as Kueue holds pods whose Workload it has not admitted; or the waiting
   entry is a Kueue Workload its queue has not admitted (``NOT_ADMITTED``: a suspended Job has
   no pods yet); no free GPU helps.
2. ``quota``: the scheduler's message names a quota (capacity-scheduling and queue plugins).
3. When a Ready, schedulable node it may use has room for it now, GPUs are not the reason, and
   the scheduler's message says which is: ``node_unavailable`` (nodes NotReady, unreachable or
   cordoned, and the taints Kubernetes names after those), ``taint_or_affinity`` (another
   untolerated taint, node affinity or selector), or else ``unknown`` (CPU, memory, ports, a
   stale message: the message says).
4. ``fragmentation``: the free GPUs of those nodes add up to enough, but no node has enough.
5. ``node_unavailable``: only counting nodes that are NotReady or cordoned would there be enough.
6. ``taint_or_affinity``: only counting nodes of GPU models it may not use would there be enough.
7. ``insufficient_gpus``: not enough free GPUs in the whole cluster.

*Fits after consolidation* is true when it fits now, or when a plan is found that frees one
node it may use: the pods on that node are moved off smallest first until the node has room,
and each moved pod (largest first) goes to the other node of that node's model with the least
free room that takes it (best fit). Nodes are tried by how little must move; a plan is sought
on :data:`CONSOLIDATION_TARGETS` of them at most, so "false" means no plan was found there, not
that none exists.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum


class WaitReason(StrEnum):
    """The reason class of a pending GPU pod (module docstring gives the rules, in order)."""

    NOT_ADMITTED = "not_admitted"
    QUOTA = "quota"
    TAINT_OR_AFFINITY = "taint_or_affinity"
    NODE_UNAVAILABLE = "node_unavailable"
    UNKNOWN = "unknown"
    FRAGMENTATION = "fragmentation"
    INSUFFICIENT_GPUS = "insufficient_gpus"


GATED = "SchedulingGated"
"""The PodScheduled reason of a pod held by a scheduling gate (Kueue's admission gate)."""
NOT_ADMITTED = "NotAdmitted"
"""The reason given for a Kueue Workload its queue has not admitted."""
CONSOLIDATION_TARGETS = 16
"""Nodes a consolidation plan is sought on, per pod: bounds the work of one verdict."""

_QUOTA = re.compile(r"quota", re.IGNORECASE)
_TAINT_OR_AFFINITY = re.compile(r"taint|affinity|selector|didn't match|did not match", re.IGNORECASE)
_NODE_UNAVAILABLE = re.compile(r"not.?ready|unreachable|unschedulable", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class NodeRoom:
    """One node as the verdict sees it."""

    name: str
    model: str | None
    allocatable: int
    """milli-GPUs."""
    held: Sequence[int]
    """milli-GPUs each pod on it holds."""
    available: bool
    """Ready and schedulable."""

    @property
    def free(self) -> int:
        return max(self.allocatable - sum(self.held), 0)

    def of(self, models: tuple[str, ...]) -> bool:
        """Whether a pod that may use ``models`` (any, when empty) may use this node."""
        return not models or self.model in models


@dataclass(frozen=True, slots=True)
class Waiting:
    """What the verdict needs of the pending pod."""

    request: int
    """milli-GPUs."""
    models: tuple[str, ...]
    """GPU models it may use (none: any)."""
    reason: str | None
    """The scheduler's reason: its PodScheduled condition's (``Unschedulable``, ``SchedulingGated``)."""
    message: str | None
    """The scheduler's message."""


@dataclass(frozen=True, slots=True)
class Verdict:
    reason: WaitReason
    free: int
    """milli-GPUs free on the Ready, schedulable nodes it may use."""
    max_free_on_one_node: int
    fits_after_consolidation: bool


class ClusterRoom:
    """The free GPUs of a cluster at one instant, summed once for every pod judged there."""

    def __init__(self, nodes: Iterable[NodeRoom]) -> None:
        self.nodes = list(nodes)
        self._sums: dict[tuple[tuple[str, ...], bool], tuple[int, int]] = {}
        self._plans: dict[tuple[int, tuple[str, ...]], bool] = {}

    def room(self, models: tuple[str, ...], *, available_only: bool = True) -> tuple[int, int]:
        """Free milli-GPUs in total and on the freest node, over the nodes of ``models`` (all
        when empty), Ready and schedulable only unless ``available_only`` is false."""
        key = (models, available_only)
        if key not in self._sums:
            free = [n.free for n in self.nodes if (n.available or not available_only) and n.of(models)]
            self._sums[key] = (sum(free), max(free, default=0))
        return self._sums[key]

    def judge(self, pod: Waiting) -> Verdict:
        """The pod's verdict (module docstring)."""
        total, most = self.room(pod.models)
        reason = self._reason(pod, total, most)
        fits = most >= pod.request or (total >= pod.request and self._consolidates(pod))
        return Verdict(reason, total, most, fits)

    def _reason(self, pod: Waiting, total: int, most: int) -> WaitReason:
        message = pod.message or ""
        if pod.reason in (GATED, NOT_ADMITTED):
            return WaitReason.NOT_ADMITTED
        if _QUOTA.search(message):
            return WaitReason.QUOTA
        if most >= pod.request:
            if _NODE_UNAVAILABLE.search(message):
                return WaitReason.NODE_UNAVAILABLE
            if _TAINT_OR_AFFINITY.search(message):
                return WaitReason.TAINT_OR_AFFINITY
            return WaitReason.UNKNOWN
        if total >= pod.request:
            return WaitReason.FRAGMENTATION
        if any(v >= pod.request for v in self.room(pod.models, available_only=False)):
            return WaitReason.NODE_UNAVAILABLE
        if pod.models and any(v >= pod.request for v in self.room(())):
            return WaitReason.TAINT_OR_AFFINITY
        return WaitReason.INSUFFICIENT_GPUS

    def _consolidates(self, pod: Waiting) -> bool:
        key = (pod.request, pod.models)
        if key not in self._plans:
            self._plans[key] = self._plan_found(pod)
        return self._plans[key]

    def _plan_found(self, pod: Waiting) -> bool:
        targets = sorted(
            (n for n in self.nodes if n.available and n.allocatable >= pod.request and n.of(pod.models)),
            key=lambda n: (sum(n.held) - n.allocatable, n.name),
        )
        for target in targets[:CONSOLIDATION_TARGETS]:
            peers = [n for n in self.nodes if n.available and n.model == target.model]
            if _frees(target, pod.request, peers):
                return True
        return False


def _frees(target: NodeRoom, request: int, peers: Sequence[NodeRoom]) -> bool:
    """Whether moving pods off ``target`` onto the other ``peers`` leaves it ``request`` free."""
    moved: list[int] = []
    left = sorted(target.held)
    free = target.allocatable - sum(left)
    while free < request and left:
        amount = left.pop(0)
        moved.append(amount)
        free += amount
    if free < request:
        return False
    room = sorted(n.free for n in peers if n.name != target.name)
    for amount in sorted(moved, reverse=True):
        at = bisect.bisect_left(room, amount)
        if at == len(room):
            return False
        rest = room.pop(at) - amount
        bisect.insort(room, rest)
    return True
