"""AMD GPUs through amdsmi (ROCm's ctypes binding of libamd_smi.so).

The library is passed in (``library=``), defaulting to the real ``amdsmi`` module imported at
:meth:`AmdCollector.start`: tests hand in an object with amdsmi's functions, enums and
exceptions, which is the only seam. Without ``libamd_smi.so`` the import prints two lines to
stdout and raises ``KeyError('libamd_smi.so')``; the prints are swallowed here so that they
never reach a stdout someone may be parsing.

Health (:meth:`AmdCollector.health`) is the RAS error counts: the total
(``amdsmi_get_gpu_total_ecc_count``) and those of every block whose RAS is enabled
(``amdsmi_get_gpu_ecc_enabled``'s mask, ``amdsmi_get_gpu_ecc_count`` per block), counted since
the driver loaded: a driver reload or GPU reset zeroes them, which is when the condition clears.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
from types import ModuleType
from typing import Any

from gpulens.producers.agent.collecting import HealthReading, integer, number, optional, text
from gpulens.producers.agent.exceptions import CollectionError, CollectorUnavailable
from gpulens.schemas.model.models import GpuDevice, GpuSample

log = logging.getLogger(__name__)

DRIVER_NOT_LOADED = 34
"""AMDSMI_STATUS_DRIVER_NOT_LOADED: the library is there, the amdgpu driver is not."""
RAS_COUNTS = ("correctable_count", "uncorrectable_count", "deferred_count")
"""The keys of amdsmi's error counts, total and per block."""


def import_amdsmi() -> ModuleType:
    """The real amdsmi module; :class:`CollectorUnavailable` when libamd_smi.so cannot be loaded."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            return importlib.import_module("amdsmi")
    except (KeyError, ImportError, OSError) as err:
        raise CollectorUnavailable("libamd_smi.so not found (install ROCm or run on a GPU node)") from err
    finally:
        if printed.getvalue():
            log.debug("amdsmi printed at import: %s", printed.getvalue().strip())


class AmdCollector:
    """Inventory and samples of every AMD GPU (or compute partition) the library enumerates."""

    name = "amd"

    def __init__(self, library: Any | None = None) -> None:
        self._library = library
        self._lib: Any = None
        self._handles: list[Any] = []
        self._ids: list[str] = []

    def start(self) -> None:
        lib = self._library if self._library is not None else import_amdsmi()
        try:
            lib.amdsmi_init(lib.AmdSmiInitFlags.INIT_AMD_GPUS)
        except lib.AmdSmiLibraryException as err:
            if err.get_error_code() == DRIVER_NOT_LOADED:
                raise CollectorUnavailable("amdgpu driver not loaded (libamd_smi.so is there)") from err
            raise CollectorUnavailable(f"amdsmi_init failed: {err.get_error_info()}") from err
        try:
            handles = list(lib.amdsmi_get_processor_handles())
        except lib.AmdSmiException as err:
            lib.amdsmi_shut_down()
            raise CollectorUnavailable(f"amdsmi cannot enumerate GPUs: {err}") from err
        if not handles:
            lib.amdsmi_shut_down()
            raise CollectorUnavailable("no AMD GPU on this node")
        self._lib, self._handles = lib, handles
        self._ids = [self._device_id(h) for h in handles]

    def close(self) -> None:
        if self._lib is not None:
            with contextlib.suppress(self._lib.AmdSmiException):
                self._lib.amdsmi_shut_down()
            self._lib = None

    def _read(self, call: str, *args: Any) -> Any:
        return optional((self._lib.AmdSmiException,), getattr(self._lib, call), *args)

    def _device_id(self, handle: Any) -> str:
        # The UUID survives reboots and reslotting; the BDF is the last resort.
        uuid = text(self._read("amdsmi_get_gpu_device_uuid", handle))
        bdf = text(self._read("amdsmi_get_gpu_device_bdf", handle))
        if uuid or bdf:
            return uuid or str(bdf)
        raise CollectionError("amdsmi reports neither a UUID nor a BDF for a GPU")

    def gpus(self) -> list[GpuDevice]:
        lib = self._lib
        vram = lib.AmdSmiMemoryType.VRAM
        devices = []
        for index, (handle, device_id) in enumerate(zip(self._handles, self._ids, strict=True)):
            asic = self._read("amdsmi_get_gpu_asic_info", handle) or {}
            board = self._read("amdsmi_get_gpu_board_info", handle) or {}
            vbios = self._read("amdsmi_get_gpu_vbios_info", handle) or {}
            driver = self._read("amdsmi_get_gpu_driver_info", handle) or {}
            devices.append(
                GpuDevice(
                    device_id=device_id,
                    index=index,
                    vendor="AMD",
                    model=text(asic.get("market_name")) or text(board.get("product_name")) or "AMD GPU",
                    uuid=text(self._read("amdsmi_get_gpu_device_uuid", handle)),
                    serial=text(board.get("product_serial")) or text(asic.get("asic_serial")),
                    pci_vendor_id=text(asic.get("vendor_id")),
                    pci_device_id=text(asic.get("device_id")),
                    bdf=text(self._read("amdsmi_get_gpu_device_bdf", handle)),
                    numa_node=integer(self._read("amdsmi_topo_get_numa_node_number", handle)),
                    vram_total_bytes=integer(self._read("amdsmi_get_gpu_memory_total", handle, vram)),
                    vbios_version=text(vbios.get("version")),
                    driver_version=text(driver.get("driver_version")),
                    partition=text(self._read("amdsmi_get_gpu_compute_partition", handle)),
                )
            )
        return devices

    def _temperature(self, handle: Any, sensor: Any) -> float | None:
        current = self._lib.AmdSmiTemperatureMetric.CURRENT
        return number(self._read("amdsmi_get_temp_metric", handle, sensor, current))

    def samples(self) -> list[GpuSample]:
        lib = self._lib
        vram = lib.AmdSmiMemoryType.VRAM
        temps = lib.AmdSmiTemperatureType
        samples = []
        for index, (handle, device_id) in enumerate(zip(self._handles, self._ids, strict=True)):
            activity = self._read("amdsmi_get_gpu_activity", handle) or {}
            power = self._read("amdsmi_get_power_info", handle) or {}
            energy = self._read("amdsmi_get_energy_count", handle) or {}
            pcie = (self._read("amdsmi_get_pcie_info", handle) or {}).get("pcie_metric", {})
            ecc = self._read("amdsmi_get_gpu_total_ecc_count", handle) or {}
            gfx_clock = self._read("amdsmi_get_clock_info", handle, lib.AmdSmiClkType.GFX) or {}
            mem_clock = self._read("amdsmi_get_clock_info", handle, lib.AmdSmiClkType.MEM) or {}
            # MI300 reports the instantaneous socket power, MI200 only the average.
            watts = number(power.get("current_socket_power"))
            if watts is None:
                watts = number(power.get("average_socket_power"))
            accumulated, resolution = (
                number(energy.get("energy_accumulator")),
                number(energy.get("counter_resolution")),
            )
            bandwidth = number(pcie.get("pcie_bandwidth"))  # Mb/s
            samples.append(
                GpuSample(
                    device_id=device_id,
                    index=index,
                    utilization_pct=number(activity.get("gfx_activity")),
                    memory_used_bytes=integer(self._read("amdsmi_get_gpu_memory_usage", handle, vram)),
                    memory_total_bytes=integer(self._read("amdsmi_get_gpu_memory_total", handle, vram)),
                    temperature_edge_c=self._temperature(handle, temps.EDGE),
                    temperature_junction_c=self._temperature(handle, temps.HOTSPOT),
                    temperature_memory_c=self._temperature(handle, temps.VRAM),
                    power_watts=watts,
                    # The accumulator counts units of counter_resolution microjoules.
                    energy_joules=None
                    if accumulated is None or resolution is None
                    else accumulated * resolution / 1e6,
                    sm_clock_mhz=number(gfx_clock.get("clk")),
                    memory_clock_mhz=number(mem_clock.get("clk")),
                    pcie_bandwidth_mbps=None if bandwidth is None else bandwidth / 8,
                    ecc_correctable=integer(ecc.get("correctable_count")),
                    ecc_uncorrectable=integer(ecc.get("uncorrectable_count")),
                )
            )
        return samples

    def health(self) -> list[HealthReading]:
        readings = []
        for index, (handle, device_id) in enumerate(zip(self._handles, self._ids, strict=True)):
            counters = _counts("", self._read("amdsmi_get_gpu_total_ecc_count", handle))
            enabled = integer(self._read("amdsmi_get_gpu_ecc_enabled", handle)) or 0
            failing = []
            for block in self._lib.AmdSmiGpuBlock:
                if block.value & enabled and block.name not in ("INVALID", "RESERVED"):
                    name = block.name.lower()
                    counts = _counts(f"{name}.", self._read("amdsmi_get_gpu_ecc_count", handle, block))
                    counters |= counts
                    if counts.get(f"{name}.uncorrectable_count", 0) > 0:
                        failing.append(f"ras-uncorrectable.{name}")
            if not failing and counters.get("uncorrectable_count", 0) > 0:
                failing.append("ras-uncorrectable")
            readings.append(HealthReading(device_id, index, "AMD", tuple(failing), counters))
        return readings


def _counts(prefix: str, answer: dict[str, object] | None) -> dict[str, int]:
    """amdsmi's error counts (absent or "N/A" ones left out), each key after ``prefix``."""
    found = {key: integer((answer or {}).get(key)) for key in RAS_COUNTS}
    return {f"{prefix}{key}": value for key, value in found.items() if value is not None}
