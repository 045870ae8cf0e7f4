"""Which pod holds which GPU, from container events, whatever name the device plugin uses.

Device plugins name GPUs by UUID, BDF or serial; samples carry the inventory's device_id.
The inventory's aliases map every name to the device_id, so both sides meet.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from schemas.models import ChangeType, ContainerEvent, DeviceInventory, DeviceKind


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
    _aliases: dict[str, str] = field(default_factory=dict)

    def gpu(self, name: str) -> str:
        """The device_id of a GPU known by ``name`` (UUID, BDF, serial or device_id)."""
        return self._aliases.get(name, name)

    def holder(self, gpu: str) -> PodRef | None:
        """The pod holding ``gpu`` now."""
        return self._holders.get(self.gpu(gpu))

    def inventory(self, inventory: DeviceInventory) -> None:
        """Learn the names of a node's GPUs."""
        for device in inventory.gpus:
            for alias in (device.uuid, device.bdf, device.serial):
                if alias:
                    self._aliases[alias] = device.device_id

    def container(self, event: ContainerEvent) -> None:
        """A container's devices now (none once it is DELETED)."""
        key = (event.node, event.pod_namespace, event.pod_name, event.container_name)
        for gpu in self._containers.pop(key, set()):
            self._holders.pop(gpu, None)
        if event.type == ChangeType.DELETED:
            return
        gpus = {self.gpu(d.device_id) for d in event.devices if d.kind == DeviceKind.GPU}
        self._containers[key] = gpus
        holder = PodRef(event.pod_uid, event.pod_namespace, event.pod_name)
        for gpu in gpus:
            self._holders[gpu] = holder
