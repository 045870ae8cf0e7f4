"""The device changelog: what changed between two inventories of one node.

A node reporting the same inventory again yields nothing; a GPU or RDMA port that appears,
disappears or changes (serial, firmware, BDF, VRAM, ...) yields one DeviceChange each.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator

from gpulens.pipeline.checkpointing import JsonText
from gpulens.schemas.model.ids import event_ids_after
from gpulens.schemas.model.models import (
    ChangeType,
    DeviceChange,
    DeviceInventory,
    DeviceKind,
    GpuDevice,
    RdmaDevice,
)

SOURCE = "gpulens-worker"

_Devices = dict[tuple[DeviceKind, str], dict[str, str]]


def pack(inventory: DeviceInventory) -> bytes:
    """``inventory`` as zlib-compressed JSON, to keep: about 900 B for a node of 8 GPUs, against
    20-30 KB as a model (12,500 nodes' inventories took 389 MB of the worker as models)."""
    return zlib.compress(inventory.model_dump_json().encode(), 1)


def unpack(packed: bytes) -> DeviceInventory:
    """The inventory :func:`pack` kept."""
    return DeviceInventory.model_validate_json(zlib.decompress(packed))


def packed_json(packed: bytes) -> JsonText:
    """The inventory :func:`pack` kept, as the JSON text of ``model_dump(mode="json")``: a
    checkpoint writes it as it is (parsed and written again, 12,500 nodes' inventories took
    a quarter of the worker's commits over a cluster's start)."""
    return JsonText(zlib.decompress(packed))


def _keys(inventory: DeviceInventory) -> list[tuple[DeviceKind, str]]:
    return [(DeviceKind.GPU, gpu.device_id) for gpu in inventory.gpus] + [
        (DeviceKind.RDMA, f"{port.name}/{port.port}") for port in inventory.rdma_devices
    ]


def _devices(inventory: DeviceInventory) -> _Devices:
    devices: list[GpuDevice | RdmaDevice] = [*inventory.gpus, *inventory.rdma_devices]
    return {key: _fields(device) for key, device in zip(_keys(inventory), devices, strict=True)}


def _fields(device: GpuDevice | RdmaDevice) -> dict[str, str]:
    # Link state flaps are not changes of the device itself.
    volatile = {"state", "physical_state", "rate"}
    return {
        name: str(value)
        for name, value in device.model_dump().items()
        if value is not None and name not in volatile
    }


def diff(before: DeviceInventory | None, after: DeviceInventory) -> Iterator[DeviceChange]:
    """The changes from ``before`` (None: nothing known yet) to ``after``, in a stable order."""
    ids = event_ids_after(after.cluster, after.node)
    if before is None:  # a node first seen, as every node at a cluster's start: nothing to compare
        for kind, device in sorted(dict.fromkeys(_keys(after))):
            yield _change(ids, after, kind, device, ChangeType.ADDED)
        return
    old, new = _devices(before), _devices(after)
    for key in sorted(old.keys() | new.keys()):
        kind, device = key
        was, now = old.get(key), new.get(key)
        if was == now:
            continue
        if was is None:
            yield _change(ids, after, kind, device, ChangeType.ADDED)
        elif now is None:
            yield _change(ids, after, kind, device, ChangeType.DELETED)
        else:
            changed = sorted(name for name in was.keys() | now.keys() if was.get(name) != now.get(name))
            yield _change(ids, after, kind, device, ChangeType.MODIFIED, changed, was, now)


def _change(
    ids: Callable[..., str],
    after: DeviceInventory,
    kind: DeviceKind,
    device: str,
    change: ChangeType,
    changed: list[str] | None = None,
    was: dict[str, str] | None = None,
    now: dict[str, str] | None = None,
) -> DeviceChange:
    """The DeviceChange of ``device`` in ``after``; ``changed``: the fields ``was`` and ``now``
    differ in; ``ids``: the event ids of ``after``'s cluster and node."""
    changed = changed or []
    return DeviceChange(
        event_id=ids(kind.value, device, change.value, after.event_id),
        cluster=after.cluster,
        event_time=after.event_time,
        source=SOURCE,
        node=after.node,
        change=change,
        device_kind=kind,
        device_id=device,
        changed=changed,
        before={name: (was or {}).get(name, "") for name in changed},
        after={name: (now or {}).get(name, "") for name in changed},
    )
