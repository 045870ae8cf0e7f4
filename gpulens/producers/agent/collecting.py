"""What the agent loop asks of a collector, whichever library or file tree stands behind it.

Every collector is built cheaply and does nothing until :meth:`BaseCollector.start`, which
raises :class:`~gpulens.producers.agent.exceptions.CollectorUnavailable` when the node lacks what the
collector needs (a library, a driver, a socket, a sysfs tree): the agent then switches that
collector off with one log line and carries on with the others.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from gpulens.schemas.model.models import (
    ContainerRuntimeState,
    DeviceAssignment,
    GpuDevice,
    GpuSample,
    RdmaDevice,
)

ContainerKey = tuple[str, str, str]
"""(pod namespace, pod name, container name)."""


@runtime_checkable
class BaseCollector(Protocol):
    """Started once, closed once; ``name`` labels its log lines and metrics."""

    name: str

    def start(self) -> None:
        """Load the library / open the socket; :class:`CollectorUnavailable` if this node has none."""

    def close(self) -> None:
        """Release what :meth:`start` took (library handles, channels)."""


@runtime_checkable
class BaseGpuCollector(BaseCollector, Protocol):
    """GPUs of one vendor: their static inventory and one sample of each per round."""

    def gpus(self) -> list[GpuDevice]:
        """Every GPU (and MIG device / partition) as the library sees it now."""

    def samples(self) -> list[GpuSample]:
        """One sample of every GPU, read now; unsupported readings are null."""


@dataclass(frozen=True, slots=True)
class HealthReading:
    """One GPU's health as its library reports it in one round."""

    device_id: str
    index: int
    vendor: str
    conditions: tuple[str, ...] = ()
    """Critical conditions the counters show now (ecc-uncorrectable, row-remap-pending, ...)."""
    counters: Mapping[str, int] = field(default_factory=dict)
    """Error counters, named as the library names them."""
    xids: tuple[int, ...] = ()
    """XIDs that arrived since the last round, in order (NVIDIA only)."""


@runtime_checkable
class BaseHealthCollector(BaseCollector, Protocol):
    """GPUs whose library reports errors: XID events, ECC and RAS counters, retired memory."""

    def health(self) -> list[HealthReading]:
        """Every whole GPU's health now (after :meth:`BaseGpuCollector.gpus` enumerated them)."""


@runtime_checkable
class BaseRdmaCollector(BaseCollector, Protocol):
    """RDMA / InfiniBand ports of the node."""

    def ports(self) -> list[RdmaDevice]:
        """Every port as the kernel reports it now."""


@runtime_checkable
class BaseAssignmentCollector(BaseCollector, Protocol):
    """Which container holds which device (the kubelet's view)."""

    def assignments(self) -> Mapping[ContainerKey, tuple[DeviceAssignment, ...]]:
        """Devices held by each container now; containers without devices are left out."""


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a container is in Kubernetes, from its CRI labels."""

    key: ContainerKey
    pod_uid: str | None
    created_at: datetime
    """When containerd created it: of two instances of one pod's container, the later is current."""


@dataclass(frozen=True, slots=True)
class RuntimeChange:
    """One lifecycle event of one container instance, as containerd reported it."""

    container_id: str
    identity: Identity
    at: datetime
    """The envelope's timestamp: when containerd published it."""
    state: ContainerRuntimeState | None
    """The state it entered; None for an OOM kill, which leaves the state as it was."""
    exit_code: int | None = None
    exited_at: datetime | None = None
    oom_killed: bool = False


@runtime_checkable
class BaseLifecycleCollector(BaseCollector, Protocol):
    """Containers created, started, OOM-killed, exited and deleted (the container runtime's view)."""

    connected: bool
    """Whether the runtime's event stream is followed now (it is retried while it is not)."""

    def changes(self) -> list[RuntimeChange]:
        """The lifecycle changes since the last call, in the runtime's order."""


def optional(errors: tuple[type[BaseException], ...], call: Callable[..., Any], *args: Any) -> Any:
    """``call(*args)``, or None when the library raises one of ``errors`` (reading not supported).

    GPU libraries answer "not supported" per reading and per model (an MI300X has no edge
    sensor, a MIG device no utilization): one missing reading must not cost the whole sample.
    """
    try:
        return call(*args)
    except errors:
        return None


def number(value: Any) -> float | None:
    """A reading as a float; None for the libraries' "N/A" strings, other non-numbers, NaN and
    infinities (which the event model refuses: one such reading must not cost the whole batch)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return float(value)


def integer(value: Any) -> int | None:
    """A count or size reading as an int; None where :func:`number` gives None."""
    value = number(value)
    return None if value is None else int(value)


def text(value: Any) -> str | None:
    """A string reading, None when empty or "N/A"."""
    if not isinstance(value, str):
        return None
    value = value.strip()
    return None if value in ("", "N/A") else value
