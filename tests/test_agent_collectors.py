"""Collectors on fixtures of the real libraries' API; degradation with the real libraries missing."""

from __future__ import annotations

import logging

import pytest

from gpulens.producers.agent import AgentMetrics, AgentSettings, build_agent, collectors_for
from gpulens.producers.agent.amd import AmdCollector
from gpulens.producers.agent.exceptions import CollectorUnavailable
from gpulens.producers.agent.nvidia import NvidiaCollector
from gpulens.producers.agent.rdma import RdmaCollector
from gpulens.testing.fake_amdsmi import GIB, STATUS_DRIVER_NOT_LOADED, FakeAmdSmi, mi250x, mi300x
from gpulens.testing.fake_nvml import MIB, FakeNvml, a100_mig, h100
from gpulens.testing.fake_sysfs import build_sysfs


def test_amd_collector_on_mi300x_and_mi250x():
    collector = AmdCollector(FakeAmdSmi([mi300x(0), mi250x(1)]))
    collector.start()
    try:
        gpus, samples = collector.gpus(), collector.samples()
    finally:
        collector.close()

    mi300, mi250 = gpus
    assert mi300.model == "AMD Instinct MI300X"
    assert (mi300.vendor, mi300.pci_vendor_id, mi300.pci_device_id) == ("AMD", "0x1002", "0x74a1")
    assert mi300.device_id == mi300.uuid == "6fff74a1-0000-1000-80cd-009a3b2c1d00"
    assert mi300.serial == "6923140000"
    assert mi300.bdf == "0000:0c:00.0"
    assert mi300.numa_node == 0
    assert mi300.vram_total_bytes == 196592 * 1024 * 1024
    assert mi300.vbios_version == "022.040.003.043.000001"
    assert mi300.driver_version == "6.8.5"
    assert mi300.partition == "SPX"
    assert (mi250.model, mi250.pci_device_id, mi250.bdf) == ("AMD Instinct MI250X", "0x740c", "0000:1c:00.0")
    assert mi250.serial == "0xD1CC3F2A5E6B7C01"  # no board serial: the ASIC serial
    assert mi250.partition is None and mi250.driver_version == "6.3.6"

    s300, s250 = samples
    assert (s300.device_id, s300.index, s250.index) == (mi300.device_id, 0, 1)
    assert s300.utilization_pct == 87
    assert s300.memory_used_bytes == 42 * GIB + 512 * 1024 * 1024
    assert s300.memory_total_bytes == 196592 * 1024 * 1024
    assert s300.temperature_edge_c is None  # MI300X has no edge sensor: NOT_SUPPORTED
    assert (s300.temperature_junction_c, s300.temperature_memory_c) == (62, 48)
    assert s300.power_watts == 615
    assert s300.energy_joules == pytest.approx(1234567890 * 15.259 / 1e6)
    assert s300.pcie_bandwidth_mbps == 16000  # 128000 Mb/s
    assert (s300.sm_clock_mhz, s300.memory_clock_mhz) == (2100, 1300)
    assert (s300.ecc_correctable, s300.ecc_uncorrectable) == (3, 0)
    assert (s250.temperature_edge_c, s250.temperature_junction_c, s250.temperature_memory_c) == (38, 41, 45)
    assert s250.power_watts == 234  # MI250X: the average socket power only
    assert s250.pcie_bandwidth_mbps is None
    assert s250.memory_total_bytes == 64 * GIB


def test_amd_driver_not_loaded_switches_the_collector_off():
    collector = AmdCollector(FakeAmdSmi([mi300x(0)], init_error=STATUS_DRIVER_NOT_LOADED))
    with pytest.raises(CollectorUnavailable, match="amdgpu driver not loaded"):
        collector.start()


def test_nvidia_collector_on_h100_and_a100_with_mig():
    collector = NvidiaCollector(FakeNvml([h100(0), a100_mig(1)]))
    collector.start()
    try:
        gpus, samples = collector.gpus(), collector.samples()
    finally:
        collector.close()

    h, a, mig0, mig2 = gpus
    assert h.model == "NVIDIA H100 80GB HBM3" and h.vendor == "NVIDIA"
    assert (h.pci_vendor_id, h.pci_device_id) == ("0x10de", "0x2330")
    assert h.bdf == "0000:18:00.0"
    assert h.vram_total_bytes == 81559 * MIB
    assert (h.driver_version, h.vbios_version, h.serial) == ("550.90.07", "96.00.89.00.01", "1652222000000")
    assert h.parent_device_id is None and h.partition is None
    assert a.pci_device_id == "0x20b2" and a.bdf == "0000:08:00.0"
    for mig in (mig0, mig2):
        assert mig.parent_device_id == a.device_id
        assert mig.partition == "3g.40gb"
        assert mig.model == "NVIDIA A100-SXM4-80GB"
        assert mig.device_id.startswith("MIG-") and mig.index == 1
        assert mig.vram_total_bytes == 40192 * MIB
    assert mig0.device_id != mig2.device_id

    sh, sa, smig, _ = samples
    assert sh.device_id == h.device_id
    assert sh.utilization_pct == 93
    assert (sh.memory_used_bytes, sh.memory_total_bytes) == (61440 * MIB, 81559 * MIB)
    assert sh.temperature_edge_c == 41
    assert sh.power_watts == pytest.approx(312.456)
    assert sh.energy_joules == pytest.approx(987654.321)
    assert (sh.sm_clock_mhz, sh.memory_clock_mhz) == (1980, 2619)
    assert sh.pcie_bandwidth_mbps == pytest.approx(12)  # 2048 + 10240 KiB/s
    assert (sa.ecc_correctable, sa.ecc_uncorrectable) == (5, 1)
    assert smig.device_id == mig0.device_id
    assert smig.memory_used_bytes == 11000 * MIB
    assert smig.utilization_pct is None and smig.power_watts is None  # NOT_SUPPORTED on MIG devices


def test_rdma_collector_reads_the_sysfs_tree(tmp_path):
    collector = RdmaCollector(build_sysfs(tmp_path))
    collector.start()
    first, second = collector.ports()
    assert (first.name, first.port, first.state, first.physical_state) == ("mlx5_0", 1, "ACTIVE", "LinkUp")
    assert (first.link_layer, first.rate) == ("InfiniBand", "400 Gb/sec (4X NDR)")
    assert (first.node_guid, first.firmware_version, first.netdev) == (
        "946d:ae03:00f4:0000",
        "28.39.1002",
        "ibp12s0",
    )
    assert (second.name, second.netdev) == ("mlx5_1", "ibp140s0")


def test_missing_libraries_switch_collectors_off_and_rdma_keeps_working(
    platform, codec, tmp_path, caplog, capfd
):
    """The real amdsmi (no libamd_smi.so here) and the real pynvml (no NVML) each cost one log line."""
    settings = AgentSettings(
        node="degraded-node",
        sysfs_root=build_sysfs(tmp_path / "sys"),
        pod_resources_socket=tmp_path / "kubelet.sock",
        spool_dir=tmp_path / "spool",
    )
    metrics = AgentMetrics()
    agent = build_agent(
        settings,
        cluster="degraded",
        kafka=platform.kafka,
        codec=codec,
        collectors=collectors_for(settings),
        metrics=metrics,
    )
    with caplog.at_level(logging.INFO, logger="gpulens.producers.agent"):
        agent.start()
        agent.tick()
        agent.close()

    assert agent.active == [] and not [r for r in caplog.records if r.levelno > logging.WARNING]
    off = [r.getMessage() for r in caplog.records if "collector off" in r.getMessage()]
    assert off == [
        "amd collector off: libamd_smi.so not found (install ROCm or run on a GPU node)",
        "nvidia collector off: NVML (libnvidia-ml.so.1) not found "
        "(install the NVIDIA driver or run on a GPU node)",
        f"pod-resources collector off: no kubelet pod-resources socket at {tmp_path / 'kubelet.sock'} "
        "(mount /var/lib/kubelet/pod-resources)",
    ]
    assert capfd.readouterr().out == ""  # amdsmi's import-time prints never reach our stdout
    value = metrics.registry.get_sample_value
    assert value("gpulens_agent_collector_enabled", {"collector": "amd"}) == 0
    assert value("gpulens_agent_collector_enabled", {"collector": "nvidia"}) == 0
    assert value("gpulens_agent_collector_enabled", {"collector": "pod-resources"}) == 0
    assert value("gpulens_agent_collector_enabled", {"collector": "rdma"}) == 1
    # The RDMA collector alone still makes an inventory, and the broker acknowledged it.
    assert value("gpulens_agent_records_published_total", {"topic": "gpulens.devices.inventory.v1"}) == 1
    assert value("gpulens_agent_last_collection_timestamp_seconds", {"collector": "rdma"}) > 0


def test_a_nan_or_infinite_reading_is_unknown_not_a_refused_batch():
    gpu = mi300x(0)
    gpu["activity"] = {**gpu["activity"], "gfx_activity": float("nan")}
    collector = AmdCollector(FakeAmdSmi([gpu, mi300x(1)]))
    collector.start()
    try:
        nan, fine = collector.samples()
    finally:
        collector.close()
    assert nan.utilization_pct is None
    assert fine.utilization_pct == 87.0
