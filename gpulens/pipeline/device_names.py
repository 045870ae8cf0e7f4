"""The names a cluster's GPUs go by, learned from each node's inventory.

Device plugins name GPUs by UUID, BDF or serial; samples carry the inventory's device_id. Every
name an inventory lists for a GPU maps to its device_id from then on (a name listed again for
another GPU moves to it), so both sides meet.

Checkpointed per node, not per name: a cluster's start lists every GPU's names at once, and an
entry per name was 200,000 state entries at 100,000 GPUs in each operator that resolves names
(``python -m bench.worker_throughput``'s fleet, traced in the README). A node's entry holds the
names that map to its GPUs now, so no two entries list one name and a restore in any order
gives the same map.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import InitVar, dataclass, field

from gpulens.schemas.model.models import DeviceInventory

UNPLACED = ""
"""The node of names restored from per-name entries (written before names were kept per node):
their node is unknown, so they are kept, and written again, under this one."""

_MOST_RESOLVED = 100_000
"""Nodes whose answers :class:`DeviceNames` keeps at most (8 names each on average)."""


@dataclass
class DeviceNames:
    """Name -> device_id for one cluster, kept and checkpointed per node."""

    _ids: dict[str, str] = field(default_factory=dict)
    """name -> device_id, for names other than the device_id itself (which resolves unlisted)."""
    _named: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    """node -> device_id -> every name its inventories listed for it."""
    _node_of: dict[str, str] = field(default_factory=dict)
    """device_id -> the node whose inventory listed it last."""
    readers: InitVar[int] = 1
    """Readers of the changes (:meth:`take_changed`): one per operator sharing the table, each
    checkpointing it in its own state (:class:`~gpulens.pipeline.holders.SharedHolders`)."""
    _changed: list[set[str]] = field(init=False)
    """Per reader, the nodes whose entry changed since its last :meth:`take_changed`."""
    _resolved: dict[str, tuple[Sequence[str], list[str]]] = field(
        default_factory=dict, compare=False, repr=False
    )
    """node -> (the names its last batch gave, their device_ids), while none of them moves: the
    columnar reader hands every batch of a node the same list while its names stay, so a batch
    is one lookup here instead of a probe of :attr:`_ids` per GPU (``_ids`` holds every alias of
    the cluster, and a device_id is not among them: at 50,000 GPUs that probe per GPU was 6 % of
    the worker)."""
    _resolving: set[str] = field(default_factory=set, compare=False, repr=False)
    """The names of :attr:`_resolved`'s lists that are no GPU's device_id (samples name GPUs by
    device_id, so mostly none): a name that moves empties :attr:`_resolved` only if it is a
    device_id or listed here. PCI addresses repeat on every node of a fleet, so each inventory
    (an agent sends its own every 10 minutes: 21 a second at 12,500 nodes) moves them."""

    def __post_init__(self, readers: int) -> None:
        self._changed = [set() for _ in range(readers)]

    def device_id(self, name: str) -> str:
        """The device_id of a GPU known by ``name`` (UUID, BDF, serial or device_id itself)."""
        return self._ids.get(name, name)

    def device_ids(self, names: Sequence[str], node: str | None = None) -> list[str]:
        """:meth:`device_id` of each of ``names``, in order (one call per sample batch). With
        the batch's ``node``, the answer is kept for that node's next batch giving the very same
        ``names`` object (never to be changed by the caller, as the list returned)."""
        if node is None:
            return list(map(self._ids.get, names, names))  # get(name, name): no bytecode per GPU
        kept = self._resolved.get(node)
        if kept is not None and kept[0] is names:
            return kept[1]
        ids = list(map(self._ids.get, names, names))
        if isinstance(names, list) and ids == names:  # the usual: every name its own, one list kept
            ids = names
        if len(self._resolved) >= _MOST_RESOLVED or len(self._resolving) >= 8 * _MOST_RESOLVED:
            self._forget_resolved()  # whatever nodes and names the records make up
        self._resolved[node] = (names, ids)
        node_of = self._node_of
        self._resolving.update(name for name in names if name not in node_of)
        return ids

    def _forget_resolved(self) -> None:
        self._resolved.clear()
        self._resolving.clear()

    def learn(self, inventory: DeviceInventory) -> None:
        """Take in the names of a node's GPUs."""
        node, named = inventory.node, self._named.setdefault(inventory.node, {})
        for device in inventory.gpus:
            device_id = device.device_id
            self._node_of[device_id] = node
            known = named.get(device_id, ())
            for name in device.aliases:
                previous = self._ids.get(name, name)
                if previous == device_id:
                    continue
                self._note(node)
                if previous != name:  # the name moves: its former node's entry loses it
                    self._note(self._node_of.get(previous, UNPLACED))
                if name in self._node_of or name in self._resolving:  # a kept list may name it
                    self._forget_resolved()
                if name == device_id:  # back to naming its own device (often its UUID)
                    del self._ids[name]
                    continue
                self._ids[name] = device_id
                if name not in known:
                    known += (name,)
            named[device_id] = known

    def _note(self, node: str) -> None:
        for changed in self._changed:
            changed.add(node)

    def take_changed(self, reader: int = 0) -> set[str]:
        """The nodes whose entry changed since ``reader``'s last call."""
        changed, self._changed[reader] = self._changed[reader], set()
        return changed

    def nodes(self) -> Iterator[str]:
        """Every node with an entry."""
        return iter(self._named)

    def dump(self, node: str) -> dict[str, list[str]] | None:
        """The JSON-able entry of ``node``: device_id -> the names mapping to it now."""
        named = self._named.get(node)
        if named is None:
            return None
        ids, entry = self._ids, {}
        for device, names in named.items():
            if mapped := [name for name in names if ids.get(name) == device]:
                entry[device] = mapped
        return entry

    def load(self, node: str, entry: dict[str, Iterable[str]]) -> None:
        """Take a dumped entry back."""
        named = self._named.setdefault(node, {})
        for device, names in entry.items():
            known = named.get(device, ())  # each sharing operator's checkpoint gives it again
            named[device] = (*known, *(name for name in names if name not in known))
            if node != UNPLACED:
                self._node_of[device] = node
            self._ids.update((name, device) for name in names if name != device)
        self._forget_resolved()

    def load_name(self, name: str, device_id: str) -> None:
        """Take back a per-name entry of an older checkpoint: kept under :data:`UNPLACED`,
        which the next checkpoint writes."""
        self.load(UNPLACED, {device_id: [name]})
        self._note(UNPLACED)
