"""Where the worker is in its inputs: the checkpointed part that says where a restart reads from.

Records of several clusters share partitions, and each cluster's merge releases them at its
own pace, so a partition's records are not processed in offset order overall. A restart
therefore reads each partition from the first offset some cluster has not processed yet
(``["offset", topic, partition]``), and skips the records behind that a cluster had already
processed (``["done", cluster, topic, partition]``: the last offset it processed there).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gpulens.pipeline.checkpointing import StateKey

Partition = tuple[str, int]


class InputPositions:
    """Restart offsets per partition and what each cluster processed past them."""

    def __init__(self) -> None:
        self.restart: dict[Partition, int] = {}
        """Offset a restart reads each partition from (as of the last checkpoint)."""
        self._done: dict[tuple[str, str, int], int] = {}
        self._changed: set[StateKey] = set()

    def processed(self, cluster: str, topic: str, partition: int, offset: int) -> None:
        """``cluster`` applied the record at ``offset``."""
        self._done[(cluster, topic, partition)] = offset
        self._changed.add(("done", cluster, topic, partition))

    def seen(self, cluster: str, topic: str, partition: int, offset: int) -> bool:
        """Whether ``cluster`` processed this record before the restart."""
        return offset <= self._done.get((cluster, topic, partition), -1)

    def rewound(self, topic: str, partition: int, offset: int) -> None:
        """The broker's log of ``partition`` now ends at ``offset``, before records processed
        (it lost what it had acknowledged): records written there anew are new, not seen."""
        for key in [k for k, o in self._done.items() if k[1:] == (topic, partition) and o >= offset]:
            self._done[key] = offset - 1
            self._changed.add(("done", *key))

    def advance(self, restart: dict[Partition, int]) -> dict[Partition, int]:
        """Take the new restart offsets; those that moved. Forget what lies behind them."""
        moved = {p: o for p, o in restart.items() if self.restart.get(p) != o}
        self.restart.update(moved)
        if moved:
            for key in [k for k, o in self._done.items() if o < self.restart.get(k[1:], 0)]:
                del self._done[key]
                self._changed.add(("done", *key))
            self._changed.update(("offset", *p) for p in moved)
        return moved

    # --- checkpoint (gpulens.pipeline.checkpointing.Stateful) -------------------------------------------

    def changed(self) -> set[StateKey]:
        changed, self._changed = self._changed, set()
        return changed

    def live(self) -> Iterator[StateKey]:
        yield from (("offset", *p) for p in self.restart)
        yield from (("done", *k) for k in self._done)

    def dump(self, key: StateKey) -> Any:
        if key[0] == "offset":
            return self.restart.get((key[1], key[2]))
        return self._done.get((key[1], key[2], key[3]))

    def load(self, key: StateKey, value: Any) -> None:
        if key[0] == "offset":
            self.restart[(key[1], key[2])] = value
        else:
            self._done[(key[1], key[2], key[3])] = value
