"""Placing GPU pods on nodes: best fit over free GPUs, as a bin-packing scheduler would.

Nodes are kept in buckets by free GPUs, so a placement looks at ``G`` buckets rather than at
every node: the simulator asks once per arriving pod and again for each waiting pod whenever
GPUs are freed, at 1,000+ nodes.
"""

from __future__ import annotations

from gpulens.producers.simulate.state import SimNode


class BestFit:
    """Schedulable nodes by free GPUs; picks the node left with the fewest free GPUs (ties: lowest index)."""

    def __init__(self, gpus_per_node: int) -> None:
        self._buckets: list[set[int]] = [set() for _ in range(gpus_per_node + 1)]
        self._bucket_of: dict[int, int] = {}

    def update(self, node: SimNode) -> None:
        """Re-file ``node`` after its free GPUs, readiness or presence changed."""
        old = self._bucket_of.pop(node.index, None)
        if old is not None:
            self._buckets[old].discard(node.index)
        if node.schedulable:
            free = node.free
            self._buckets[free].add(node.index)
            self._bucket_of[node.index] = free

    def place(self, gpus: int) -> int | None:
        """The index of the node a pod asking for ``gpus`` goes to; None when none has room."""
        for free in range(gpus, len(self._buckets)):
            bucket = self._buckets[free]
            if bucket:
                return min(bucket)  # min, not iteration order: deterministic whatever the set's history
        return None

    @property
    def most_free(self) -> int:
        """The most free GPUs on any schedulable node (0 when none has any)."""
        for free in range(len(self._buckets) - 1, 0, -1):
            if self._buckets[free]:
                return free
        return 0

    @property
    def schedulable(self) -> int:
        """Nodes that can take pods now."""
        return len(self._bucket_of)
