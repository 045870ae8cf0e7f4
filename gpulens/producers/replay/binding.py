"""Deterministic best-fit binding of trace pods to trace nodes.

The Alibaba trace says when a pod was scheduled but not where. The replayer picks a node:
among nodes of an allowed GPU model, the one left with the fewest free GPUs after the pod
fits (ties: node name). Whole-GPU pods need that many idle GPUs; a shared pod (a fraction of
one GPU) needs one GPU with that much share left. When nothing fits, because the real
scheduler's choices differed from ours, the pod goes to the allowed node with the most free
capacity and the overcommit is counted: cluster-level figures never depend on the binding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

MILLI = 1000


@dataclass(slots=True)
class _Node:
    name: str
    model: str
    free: list[int]
    """Free share of each GPU, in thousandths."""
    free_total: int = 0
    idle: int = 0
    """GPUs with nothing on them."""
    best_share: int = 0
    """The largest free share of one GPU."""

    def refresh(self) -> None:
        self.free_total = sum(self.free)
        self.idle = self.free.count(MILLI)
        self.best_share = max(self.free, default=0)

    def fits(self, gpus: int, milli: int) -> bool:
        if gpus == 1 and milli < MILLI:
            return self.best_share >= milli
        return self.idle >= gpus


@dataclass
class BestFitBinder:
    """Places pods on nodes and releases them; deterministic for a given input order."""

    nodes: dict[str, _Node] = field(default_factory=dict)
    placements: dict[str, tuple[str, list[tuple[int, int]]]] = field(default_factory=dict)
    overcommitted: int = 0

    def add_node(self, name: str, model: str, gpus: int) -> None:
        """A node with ``gpus`` idle GPUs of ``model``."""
        node = self.nodes[name] = _Node(name, model, [MILLI] * gpus)
        node.refresh()

    def bind(self, pod: str, gpus: int, milli: int, models: Sequence[str]) -> str:
        """The node ``pod`` goes to; takes its GPUs (``milli`` per GPU) there."""
        allowed = [n for n in self.nodes.values() if not models or n.model in models] or list(
            self.nodes.values()
        )
        node: _Node | None = None
        for candidate in allowed:  # the hot loop of a replay: plain comparisons only
            if candidate.fits(gpus, milli) and (
                node is None
                or candidate.free_total < node.free_total
                or (candidate.free_total == node.free_total and candidate.name < node.name)
            ):
                node = candidate
        if node is None:
            self.overcommitted += 1
            node = max(allowed, key=lambda n: (n.free_total, n.name))
        self.placements[pod] = (node.name, self._take(node, gpus, milli))
        return node.name

    def release(self, pod: str) -> None:
        """Give back what ``pod`` took (nothing if it was never bound)."""
        placed = self.placements.pop(pod, None)
        if placed is None:
            return
        node = self.nodes[placed[0]]
        for index, amount in placed[1]:
            node.free[index] += amount
        node.refresh()

    @staticmethod
    def _take(node: _Node, gpus: int, milli: int) -> list[tuple[int, int]]:
        taken = BestFitBinder._claim(node, gpus, milli)
        node.refresh()
        return taken

    @staticmethod
    def _claim(node: _Node, gpus: int, milli: int) -> list[tuple[int, int]]:
        taken: list[tuple[int, int]] = []
        if gpus == 1 and milli < MILLI:
            # Best fit inside the node too: the GPU with the least share left that still fits.
            candidates = [i for i, f in enumerate(node.free) if f >= milli]
            index = min(candidates, key=lambda i: (node.free[i], i)) if candidates else 0
            amount = min(milli, node.free[index])
            node.free[index] -= amount
            return [(index, amount)]
        for index, free in enumerate(node.free):
            if len(taken) == gpus:
                break
            if free == MILLI:
                node.free[index] = 0
                taken.append((index, MILLI))
        return taken
