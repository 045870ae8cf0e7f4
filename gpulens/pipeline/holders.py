"""Which pod holds which GPU, from container events, whatever name the device plugin uses.

Device plugins name GPUs by UUID, BDF or serial; samples carry the inventory's device_id. The
names are resolved by :class:`~gpulens.pipeline.device_names.DeviceNames`, so both sides meet.

A container's event makes its pod the holder of each of its GPUs, until the container changes
or goes: then its GPUs have no holder, even one another container claimed meanwhile (two
containers claim one GPU under time-slicing or a shared device plugin; the latest event wins).

Checkpointed by each operator sharing it (:class:`SharedHolders`) under keys ``(kind, *name)``,
one entry per node and per container, not per GPU (a cluster's start holds every GPU at once:
80,000 holder entries at 100,000 GPUs in each operator that keeps holders): ``("names", node)``
-> its GPUs' names, ``("container", node, namespace, pod, container)`` -> ``{"uid": pod uid,
"gpus": [...], "held": [...]}``, where ``held`` (left out when it is every GPU) lists those this
container's event made its pod hold. A container whose GPU another one takes is written again
without it, so no two entries hold one GPU and a restore in any order gives the same holders.
Checkpoints written before hold ``("alias", name)`` -> device_id, ``("container", ...)`` -> its
GPUs and ``("gpu", id)`` -> holding pod: read, and replaced by the next checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import InitVar, dataclass, field
from typing import Any

from gpulens.pipeline.device_names import DeviceNames
from gpulens.schemas.model.models import ChangeType, ContainerEvent, DeviceInventory, DeviceKind

ContainerKey = tuple[str, str, str, str]
"""(node, namespace, pod, container)."""


@dataclass(frozen=True, slots=True)
class PodRef:
    """The pod holding a GPU."""

    uid: str | None
    namespace: str
    name: str


@dataclass
class GpuHolders:
    """GPU id -> holding pod, for one cluster."""

    _holders: dict[str, PodRef] = field(default_factory=dict)
    _containers: dict[ContainerKey, tuple[str, ...]] = field(default_factory=dict)
    """Each container's GPUs, sorted: a tuple (104 bytes for 8 GPUs) where a set took 728, for
    25,000 containers at 100,000 GPUs in each of two operators."""
    _held_by: dict[str, ContainerKey] = field(default_factory=dict)
    """GPU -> the container whose event made its holder (the module docstring)."""
    _unplaced: set[str] = field(default_factory=set)
    """GPUs whose holder an older checkpoint restored without its container (placed at the
    next :meth:`take_changed`)."""
    readers: InitVar[int] = 1
    """Readers of the changes (:meth:`take_changed`): one per operator sharing the table
    (:class:`SharedHolders`)."""
    names: DeviceNames = field(init=False)
    _changed: list[set[tuple[str, ...]]] = field(init=False)
    """Per reader, the keys changed since it last took them (besides the names' nodes)."""

    def __post_init__(self, readers: int) -> None:
        self.names = DeviceNames(readers=readers)
        self._changed = [set() for _ in range(readers)]

    def gpu(self, name: str) -> str:
        """The device_id of a GPU known by ``name`` (UUID, BDF, serial or device_id)."""
        return self.names.device_id(name)

    def holder(self, gpu: str) -> PodRef | None:
        """The pod holding ``gpu`` now."""
        return self._holders.get(self.gpu(gpu))

    def gpus(self, names: Sequence[str], node: str | None = None) -> list[str]:
        """:meth:`gpu` of each of ``names``, in order (one call per sample batch; ``node``: the
        batch's, see :meth:`DeviceNames.device_ids`)."""
        return self.names.device_ids(names, node)

    def holders(self, gpus: Sequence[str], node: str | None = None) -> list[PodRef | None]:
        """:meth:`holder` of each of ``gpus``, in order: one call per sample batch, not per GPU
        (a third of the lookups' cost at 10,000 GPUs was the calls); ``node`` as in :meth:`gpus`."""
        return list(map(self._holders.get, self.names.device_ids(gpus, node)))

    def inventory(self, inventory: DeviceInventory) -> None:
        """Learn the names of a node's GPUs."""
        self.names.learn(inventory)

    def container(self, event: ContainerEvent) -> None:
        """A container's devices now (none once it is DELETED)."""
        key = (event.node, event.pod_namespace, event.pod_name, event.container_name)
        self._note(("container", *key))
        for gpu in self._containers.pop(key, ()):
            if self._holders.pop(gpu, None) is not None:
                self._lose(gpu, key)
        if event.type == ChangeType.DELETED:
            return
        gpus = tuple(sorted({self.gpu(d.device_id) for d in event.devices if d.kind == DeviceKind.GPU}))
        self._containers[key] = gpus
        holder = PodRef(event.pod_uid, event.pod_namespace, event.pod_name)
        for gpu in gpus:
            self._lose(gpu, key)
            self._holders[gpu] = holder
            self._held_by[gpu] = key

    def _lose(self, gpu: str, key: ContainerKey) -> None:
        """``gpu``'s holder changes at ``key``'s event: the container that made it, if another,
        is written again without it."""
        before = self._held_by.pop(gpu, None)
        if before is not None and before != key:
            self._note(("container", *before))

    def _note(self, key: tuple[str, ...]) -> None:
        for changed in self._changed:
            changed.add(key)

    def take_changed(self, cluster: str, reader: int = 0) -> Iterator[tuple[str, ...]]:
        """``reader``'s state keys (``("holders", cluster, ...)``) changed since its last call."""
        if self._unplaced:
            self._place()
        changed, self._changed[reader] = self._changed[reader], set()
        changed.update(("names", node) for node in self.names.take_changed(reader))
        return (("holders", cluster, *key) for key in changed)

    def _place(self) -> None:
        """Find the container of each holder an older checkpoint restored per GPU: one of the
        holding pod's containers that lists the GPU (none: the holder is dropped, as no container
        event could have left it)."""
        by_pod: dict[tuple[str, str], list[ContainerKey]] = {}
        for key in self._containers:
            by_pod.setdefault((key[1], key[2]), []).append(key)
        for gpu in self._unplaced:
            holder = self._holders.get(gpu)
            if holder is None or gpu in self._held_by:  # a container event came first
                continue
            keys = by_pod.get((holder.namespace, holder.name), [])
            found = next((key for key in keys if gpu in self._containers[key]), None)
            if found is None:
                del self._holders[gpu]
            else:
                self._held_by[gpu] = found
                self._note(("container", *found))
        self._unplaced = set()

    def live(self) -> Iterator[tuple[str, ...]]:
        """Every key with a value."""
        yield from (("names", node) for node in self.names.nodes())
        yield from (("container", *key) for key in self._containers)

    def dump(self, key: tuple[str, ...]) -> Any:
        """The JSON-able value of ``key``, None when it has none."""
        if key[0] == "names":
            return self.names.dump(key[1])
        if key[0] == "alias":
            return None  # an older checkpoint's per-name entry: its name lives under "names" now
        if key[0] == "container":
            return self._dump_container(key[1:])  # type: ignore[arg-type]
        return None  # an older checkpoint's per-GPU holder: it lives in its container's entry now

    def _dump_container(self, key: ContainerKey) -> dict[str, Any] | None:
        gpus = self._containers.get(key)
        if gpus is None:
            return None
        listed, held_by = list(gpus), self._held_by
        held = [gpu for gpu in listed if held_by.get(gpu) == key]
        entry: dict[str, Any] = {"uid": self._holders[held[0]].uid if held else None, "gpus": listed}
        if len(held) < len(gpus):
            entry["held"] = held
        return entry

    def load(self, key: tuple[str, ...], value: Any) -> None:
        """Take a dumped value back."""
        if key[0] == "names":
            self.names.load(key[1], value)
        elif key[0] == "alias":
            self.names.load_name(key[1], value)
            self._note(key)  # deleted by the next checkpoint
        elif key[0] == "container":
            container: ContainerKey = key[1:]  # type: ignore[assignment]
            if isinstance(value, list):  # an older checkpoint's: its GPUs alone
                self._containers[container] = tuple(sorted(set(value)))
                self._note(key)  # written again in this form
                return
            self._containers[container] = tuple(sorted(set(value["gpus"])))
            holder = PodRef(value["uid"], container[1], container[2])
            for gpu in value.get("held", value["gpus"]):
                self._holders[gpu] = holder
                self._held_by[gpu] = container
        else:  # an older checkpoint's per-GPU holder
            self._holders[key[1]] = PodRef(*value)
            self._unplaced.add(key[1])
            self._note(key)  # deleted by the next checkpoint


class SharedHolders:
    """One :class:`GpuHolders` per cluster for every operator of a worker that keeps GPU holders
    or names (workload usage, alerts, the idle split): each kept its own, 240 bytes a GPU in
    workload usage and in alerts (the names 144 of them, which the idle split kept too;
    ``python -m bench.worker_memory``), and resolved a batch's names in a cache of its own.

    Each operator still applies the container and inventory events it is given (applying one
    again changes nothing: the operators sharing a table are given the same events, in one
    order, each applied by all before the next), and checkpoints the table in its own state as
    before, reading the changes as one :meth:`add_reader` of them; a restore loads every
    operator's entries into the one table (each entry gives the same facts, so a second load
    changes nothing). Readers join before the first table: none misses a change.
    """

    def __init__(self) -> None:
        self._readers = 0
        self._tables: dict[str, GpuHolders] = {}

    @staticmethod
    def joined(shared: SharedHolders | None) -> tuple[SharedHolders, int]:
        """``shared`` (tables of its own where None) and a new reader of it, for an operator
        being built."""
        tables = shared if shared is not None else SharedHolders()
        return tables, tables.add_reader()

    def add_reader(self) -> int:
        """A reader of every cluster's changes, for an operator built before any event."""
        if self._tables:
            raise RuntimeError("an operator joined shared GPU holders after their first table")
        self._readers += 1
        return self._readers - 1

    def of(self, cluster: str) -> GpuHolders:
        """``cluster``'s table, made on first use."""
        table = self._tables.get(cluster)
        if table is None:
            table = self._tables[cluster] = GpuHolders(readers=self._readers)
        return table
