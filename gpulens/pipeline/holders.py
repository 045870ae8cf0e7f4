"""Which pod holds which GPU, from container events, whatever name the device plugin uses.

Device plugins name GPUs by UUID, BDF or serial; samples carry the inventory's device_id. The
names are resolved by :class:`~gpulens.pipeline.device_names.DeviceNames`, so both sides meet.

Checkpointed by its owner under keys ``(kind, *name)``: ``("names", node)`` -> its GPUs' names,
``("container", node, namespace, pod, container)`` -> its GPUs, ``("gpu", id)`` -> holding pod.
Checkpoints written before names were kept per node hold ``("alias", name)`` -> device_id: read,
and replaced by the next checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpulens.pipeline.device_names import DeviceNames
from gpulens.schemas.model.models import ChangeType, ContainerEvent, DeviceInventory, DeviceKind


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
    _containers: dict[tuple[str, str, str, str], set[str]] = field(default_factory=dict)
    names: DeviceNames = field(default_factory=DeviceNames)
    changed: set[tuple[str, ...]] = field(default_factory=set)
    """Keys changed since the owner last took them (besides the names' nodes)."""

    def gpu(self, name: str) -> str:
        """The device_id of a GPU known by ``name`` (UUID, BDF, serial or device_id)."""
        return self.names.device_id(name)

    def holder(self, gpu: str) -> PodRef | None:
        """The pod holding ``gpu`` now."""
        return self._holders.get(self.gpu(gpu))

    def gpus(self, names: Sequence[str]) -> list[str]:
        """:meth:`gpu` of each of ``names``, in order (one call per sample batch)."""
        return self.names.device_ids(names)

    def holders(self, gpus: Sequence[str]) -> list[PodRef | None]:
        """:meth:`holder` of each of ``gpus``, in order: one call per sample batch, not per GPU
        (a third of the lookups' cost at 10,000 GPUs was the calls)."""
        return list(map(self._holders.get, self.names.device_ids(gpus)))

    def inventory(self, inventory: DeviceInventory) -> None:
        """Learn the names of a node's GPUs."""
        self.names.learn(inventory)

    def container(self, event: ContainerEvent) -> None:
        """A container's devices now (none once it is DELETED)."""
        key = (event.node, event.pod_namespace, event.pod_name, event.container_name)
        self.changed.add(("container", *key))
        for gpu in self._containers.pop(key, set()):
            self._holders.pop(gpu, None)
            self.changed.add(("gpu", gpu))
        if event.type == ChangeType.DELETED:
            return
        gpus = {self.gpu(d.device_id) for d in event.devices if d.kind == DeviceKind.GPU}
        self._containers[key] = gpus
        holder = PodRef(event.pod_uid, event.pod_namespace, event.pod_name)
        for gpu in gpus:
            self._holders[gpu] = holder
            self.changed.add(("gpu", gpu))

    def take_changed(self, cluster: str) -> Iterator[tuple[str, ...]]:
        """The owner's state keys (``("holders", cluster, ...)``) changed since the last call."""
        changed, self.changed = self.changed, set()
        changed.update(("names", node) for node in self.names.take_changed())
        return (("holders", cluster, *key) for key in changed)

    def live(self) -> Iterator[tuple[str, ...]]:
        """Every key with a value."""
        yield from (("names", node) for node in self.names.nodes())
        yield from (("container", *key) for key in self._containers)
        yield from (("gpu", gpu) for gpu in self._holders)

    def dump(self, key: tuple[str, ...]) -> Any:
        """The JSON-able value of ``key``, None when it has none."""
        if key[0] == "names":
            return self.names.dump(key[1])
        if key[0] == "alias":
            return None  # an older checkpoint's per-name entry: its name lives under "names" now
        if key[0] == "container":
            gpus = self._containers.get(key[1:])  # type: ignore[arg-type]
            return None if gpus is None else sorted(gpus)
        holder = self._holders.get(key[1])
        return None if holder is None else [holder.uid, holder.namespace, holder.name]

    def load(self, key: tuple[str, ...], value: Any) -> None:
        """Take a dumped value back."""
        if key[0] == "names":
            self.names.load(key[1], value)
        elif key[0] == "alias":
            self.names.load_name(key[1], value)
            self.changed.add(key)  # deleted by the next checkpoint
        elif key[0] == "container":
            self._containers[key[1:]] = set(value)  # type: ignore[index]
        else:
            self._holders[key[1]] = PodRef(*value)
