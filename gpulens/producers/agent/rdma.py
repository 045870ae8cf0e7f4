"""RDMA / InfiniBand ports from sysfs (``<root>/class/infiniband``).

The root is configurable so that a test (or a container with the host's /sys mounted
elsewhere) can point it at any tree of the same shape.
"""

from __future__ import annotations

from pathlib import Path

from gpulens.producers.agent.collecting import text
from gpulens.producers.agent.exceptions import CollectorUnavailable
from gpulens.schemas.model.models import RdmaDevice


def _read(path: Path) -> str | None:
    try:
        return text(path.read_text())
    except OSError:
        return None


def _without_code(value: str | None) -> str | None:
    # sysfs writes states with their numeric code: "4: ACTIVE", "5: LinkUp".
    return None if value is None else value.partition(": ")[2] or value


class RdmaCollector:
    """Every port of every RDMA device, read fresh each round (states change, devices rarely)."""

    name = "rdma"

    def __init__(self, sysfs_root: Path) -> None:
        self._class_dir = sysfs_root / "class" / "infiniband"

    def start(self) -> None:
        if not self._class_dir.is_dir():
            raise CollectorUnavailable(f"no {self._class_dir} (no RDMA device, or /sys is not mounted)")

    def close(self) -> None:
        """Nothing is held between rounds."""

    def ports(self) -> list[RdmaDevice]:
        found = []
        for device in sorted(self._class_dir.iterdir()):
            netdevs = sorted(p.name for p in (device / "device" / "net").glob("*"))
            ports_dir = device / "ports"
            ports = sorted(ports_dir.iterdir(), key=lambda p: int(p.name)) if ports_dir.is_dir() else []
            for port in ports:
                found.append(
                    RdmaDevice(
                        name=device.name,
                        port=int(port.name),
                        state=_without_code(_read(port / "state")),
                        physical_state=_without_code(_read(port / "phys_state")),
                        link_layer=_read(port / "link_layer"),
                        rate=_read(port / "rate"),
                        node_guid=_read(device / "node_guid"),
                        firmware_version=_read(device / "fw_ver"),
                        netdev=netdevs[0] if netdevs else None,
                    )
                )
        return found
