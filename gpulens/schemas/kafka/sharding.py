"""Static shards: N processes split a load, sinks by partition and workers by cluster.

The embedded broker never expires a SIGKILLed group member, so a subscribed successor would
wait for a rebalance forever (see :func:`gpulens.consumers.clickhouse.sinking.run_sink`); processes
are therefore assigned their partitions. Shard ``I/N`` owns partition ``p`` of every topic
where ``p % N == I``: the shards of a group own every partition exactly once, each commits
the offsets of its own, and a restarted shard resumes where it committed.

Stream workers cannot split a cluster (its windows need every pod of it): shard ``I/N`` of
a worker reads every partition and keeps the clusters whose name hashes (CRC-32) to ``I``,
telling them by the record key (``cluster/entity``) before decoding anything.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Shard:
    """Shard ``index`` of ``count``; the default, 0/1, owns every partition."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ValueError(f"shard {self.index}/{self.count}: want I/N with N >= 1 and 0 <= I < N")

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``"I/N"``, e.g. ``"1/3"``: the second of three."""
        index, slash, count = text.partition("/")
        if not slash or not index.strip().isdigit() or not count.strip().isdigit():
            raise ValueError(f"shard {text!r}: want I/N, e.g. 0/2 and 1/2 for two processes")
        return cls(int(index), int(count))

    def owns(self, partition: int) -> bool:
        """Whether ``partition`` (of any topic) is this shard's."""
        return partition % self.count == self.index

    def owns_cluster(self, cluster: bytes) -> bool:
        """Whether the cluster named ``cluster`` (UTF-8) is this shard's."""
        return zlib.crc32(cluster) % self.count == self.index

    def owns_key(self, key: bytes | None) -> bool:
        """Whether a record keyed ``key`` (``cluster/entity`` or ``cluster``) is this shard's."""
        return self.owns_cluster((key or b"").partition(b"/")[0])

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


UNSHARDED = Shard()
"""The only shard of one process: every partition (a sink), every cluster (a worker)."""
