"""A sysfs tree of RDMA devices, shaped as the mlx5 driver writes /sys/class/infiniband."""

from __future__ import annotations

from pathlib import Path


def build_sysfs(root: Path) -> Path:
    """/sys/class/infiniband with two ConnectX-7 ports, as the mlx5 driver writes them."""
    for index, netdev in ((0, "ibp12s0"), (1, "ibp140s0")):
        device = root / "class" / "infiniband" / f"mlx5_{index}"
        port = device / "ports" / "1"
        port.mkdir(parents=True)
        (device / "node_guid").write_text(f"946d:ae03:00f4:{index:04x}\n")
        (device / "fw_ver").write_text("28.39.1002\n")
        (device / "device" / "net" / netdev).mkdir(parents=True)
        (port / "state").write_text("4: ACTIVE\n")
        (port / "phys_state").write_text("5: LinkUp\n")
        (port / "link_layer").write_text("InfiniBand\n")
        (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
    return root
