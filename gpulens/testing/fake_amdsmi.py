"""amdsmi as it behaves on an MI300X or MI250X node: the library boundary, and nothing of ours.

Same function names, arguments, enums, exception class and return shapes as amdsmi 7.0.2's
``amdsmi_interface`` (dicts with "N/A" strings where the hardware has no value, hex strings
for PCI ids, NOT_SUPPORTED raised per reading). Values are those amd-smi reports on the
real boards (market names, device ids, VRAM sizes, power and temperatures under load).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any, TypeAlias, TypedDict, TypeVar

STATUS_NOT_SUPPORTED = 2
STATUS_DRIVER_NOT_LOADED = 34
_INFO = {
    STATUS_NOT_SUPPORTED: "AMDSMI_STATUS_NOT_SUPPORTED - Feature not supported",
    STATUS_DRIVER_NOT_LOADED: "AMDSMI_STATUS_DRIVER_NOT_LOADED - Driver not loaded",
}


class AmdSmiException(Exception):
    """Base smi exception class"""


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, err_code: int) -> None:
        super().__init__(abs(err_code))
        self.err_code = abs(err_code)
        self.err_info = _INFO.get(self.err_code, "AMDSMI_STATUS_UNKNOWN_ERROR - An unknown error occurred")

    def __str__(self) -> str:
        return f"Error code:\n\t{self.err_code} | {self.err_info}"

    def get_error_info(self, detailed: bool = True) -> str:
        return self.err_info if detailed else self.err_info.split(" - ")[0]

    def get_error_code(self) -> int:
        return self.err_code


class AmdSmiInitFlags(IntEnum):
    INIT_ALL_PROCESSORS = 0xFFFFFFFF
    INIT_AMD_CPUS = 1
    INIT_AMD_GPUS = 2


class AmdSmiMemoryType(IntEnum):
    VRAM = 0
    VIS_VRAM = 1
    GTT = 2


class AmdSmiTemperatureType(IntEnum):
    EDGE = 0
    HOTSPOT = 1
    JUNCTION = 1
    VRAM = 2


class AmdSmiTemperatureMetric(IntEnum):
    CURRENT = 0


class AmdSmiClkType(IntEnum):
    GFX = 0
    SYS = 0
    DF = 1
    DCEF = 2
    SOC = 3
    MEM = 4


class AmdSmiGpuBlock(IntEnum):
    """RAS blocks: bits of amdsmi_get_gpu_ecc_enabled's mask (amdsmi_wrapper's values)."""

    INVALID = 0
    UMC = 1
    SDMA = 2
    GFX = 4
    MMHUB = 8
    ATHUB = 16
    PCIE_BIF = 32
    HDP = 64
    XGMI_WAFL = 128
    DF = 256
    SMN = 512
    SEM = 1024
    MP0 = 2048
    MP1 = 4096
    FUSE = 8192
    MCA = 16384
    VCN = 32768
    JPEG = 65536
    IH = 131072
    MPIO = 262144
    RESERVED = 9223372036854775808


MI300X_RAS_BLOCKS = ("UMC", "SDMA", "GFX", "MMHUB", "PCIE_BIF", "HDP", "XGMI_WAFL")
"""The blocks whose RAS an MI300X enables (those ``amd-smi metric --ecc-blocks`` lists on one)."""


def ras_counts(correctable: int = 0, uncorrectable: int = 0, deferred: int = 0) -> dict[str, int]:
    """One block's (or the total) error counts as amdsmi_get_gpu_ecc_count returns them."""
    return {
        "correctable_count": correctable,
        "uncorrectable_count": uncorrectable,
        "deferred_count": deferred,
    }


MI300X_UMC_UNCORRECTABLE = {
    "total": ras_counts(correctable=12, uncorrectable=1, deferred=1),
    "UMC": ras_counts(correctable=12, uncorrectable=1, deferred=1),
}
"""An MI300X's RAS counts after an uncorrectable HBM (UMC) error, as amdsmi returns them
(amdsmi_get_gpu_total_ecc_count, amdsmi_get_gpu_ecc_count per block; ``amd-smi metric
--ecc-blocks`` prints the same as UMC: CORRECTABLE_COUNT 12, UNCORRECTABLE_COUNT 1,
DEFERRED_COUNT 1); the other blocks stay at 0."""


@dataclass(frozen=True)
class ProcessorHandle:
    """Stands for amdsmi_wrapper.amdsmi_processor_handle (an opaque pointer)."""

    slot: int


GIB = 1024**3


class AmdGpu(TypedDict):
    """One board's readings; None where the board raises NOT_SUPPORTED, "N/A" where amdsmi says so."""

    uuid: str
    bdf: str
    asic: dict[str, Any]
    board: dict[str, Any]
    vbios: dict[str, Any]
    driver: dict[str, Any]
    numa: int
    partition: str | None
    vram_total: int
    vram_used: int
    activity: dict[str, Any]
    temperature: dict[str, int | None]
    power: dict[str, Any]
    energy: dict[str, Any]
    pcie_bandwidth: int | str
    ecc: dict[str, Any]
    ras: dict[str, dict[str, int]]
    """RAS-enabled block name -> its error counts (amdsmi_get_gpu_ecc_count)."""
    clocks: dict[str, int]


_T = TypeVar("_T")


def mi300x(index: int) -> AmdGpu:
    """One MI300X (OAM, SPX partition) as amdsmi reports it; no edge sensor on this board."""
    bus = 0x0C + 0x10 * index
    return {
        "uuid": f"6fff74a1-0000-1000-80cd-{0x9A3B2C1D00 + index:012x}",
        "bdf": f"0000:{bus:02x}:00.0",
        "asic": {
            "market_name": "AMD Instinct MI300X",
            "vendor_id": "0x1002",
            "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
            "subvendor_id": "0x1002",
            "device_id": "0x74a1",
            "rev_id": "0x00",
            "asic_serial": f"0x{0xD1CC3F2A5E6B7C00 + index:016X}",
            "oam_id": index,
            "num_compute_units": 304,
            "target_graphics_version": "gfx942",
            "subsystem_id": "0x74a1",
        },
        "board": {
            "model_number": "102-G30211-00",
            "product_serial": f"692314000{index}",
            "fru_id": "N/A",
            "product_name": "AMD Instinct MI300X OAM",
            "manufacturer_name": "AMD",
        },
        "vbios": {
            "name": "AMD MI300X_HW_SRIOV_CVS_1VF",
            "build_date": "2024/02/06 15:43",
            "part_number": "113-M3000100-102",
            "version": "022.040.003.043.000001",
        },
        "driver": {"driver_name": "amdgpu", "driver_version": "6.8.5", "driver_date": "2015/01/01 00:00"},
        "numa": 0 if index < 4 else 1,
        "partition": "SPX",
        "vram_total": 196592 * 1024 * 1024,
        "vram_used": 42 * GIB + 512 * 1024 * 1024,
        "activity": {"gfx_activity": 87, "umc_activity": 41, "mm_activity": "N/A"},
        "temperature": {"EDGE": None, "HOTSPOT": 62, "VRAM": 48},
        "power": {
            "socket_power": 615,
            "current_socket_power": 615,
            "average_socket_power": "N/A",
            "gfx_voltage": "N/A",
            "soc_voltage": "N/A",
            "mem_voltage": "N/A",
            "power_limit": 750000000,
        },
        "energy": {"energy_accumulator": 1234567890, "counter_resolution": 15.259, "timestamp": 1730000000},
        "pcie_bandwidth": 128000,
        "ecc": ras_counts(correctable=3),
        "ras": {block: ras_counts(correctable=3 if block == "UMC" else 0) for block in MI300X_RAS_BLOCKS},
        "clocks": {"GFX": 2100, "MEM": 1300},
    }


def mi250x(index: int) -> AmdGpu:
    """One MI250X GCD: edge sensor present, only the average socket power, older driver."""
    gpu = mi300x(index)
    gpu["asic"] = {**gpu["asic"], "market_name": "AMD Instinct MI250X", "device_id": "0x740c"}
    gpu["asic"]["target_graphics_version"] = "gfx90a"
    gpu["board"] = {**gpu["board"], "product_name": "AMD Instinct MI250X", "product_serial": "N/A"}
    gpu["vbios"] = {**gpu["vbios"], "part_number": "113-D65201-042", "version": "113-D65201-042"}
    gpu["driver"] = {**gpu["driver"], "driver_version": "6.3.6"}
    gpu["partition"] = None
    gpu["vram_total"] = 64 * GIB
    gpu["vram_used"] = 17 * GIB
    gpu["temperature"] = {"EDGE": 38, "HOTSPOT": 41, "VRAM": 45}
    gpu["power"] = {**gpu["power"], "current_socket_power": "N/A", "average_socket_power": 234}
    gpu["clocks"] = {"GFX": 1700, "MEM": 1600}
    gpu["pcie_bandwidth"] = "N/A"
    return gpu


class FakeAmdSmi:
    """The amdsmi module's surface for a node with ``gpus``; ``init_error`` makes amdsmi_init fail."""

    AmdSmiException = AmdSmiException
    AmdSmiLibraryException = AmdSmiLibraryException
    # Aliases, not variables: the methods' signatures name these enums as amdsmi's do.
    AmdSmiInitFlags: TypeAlias = AmdSmiInitFlags
    AmdSmiMemoryType: TypeAlias = AmdSmiMemoryType
    AmdSmiTemperatureType: TypeAlias = AmdSmiTemperatureType
    AmdSmiTemperatureMetric: TypeAlias = AmdSmiTemperatureMetric
    AmdSmiClkType: TypeAlias = AmdSmiClkType
    AmdSmiGpuBlock: TypeAlias = AmdSmiGpuBlock

    def __init__(self, gpus: list[AmdGpu], *, init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.initialized = False

    def _gpu(self, handle: ProcessorHandle) -> AmdGpu:
        if not self.initialized:
            raise AmdSmiLibraryException(32)  # AMDSMI_STATUS_NOT_INIT
        return self.gpus[handle.slot]

    @staticmethod
    def _supported(value: _T | None) -> _T:
        if value is None:
            raise AmdSmiLibraryException(STATUS_NOT_SUPPORTED)
        return value

    def amdsmi_init(self, flag: AmdSmiInitFlags = AmdSmiInitFlags.INIT_AMD_GPUS) -> None:
        if self.init_error is not None:
            raise AmdSmiLibraryException(self.init_error)
        self.initialized = True

    def amdsmi_shut_down(self) -> None:
        self.initialized = False

    def amdsmi_get_processor_handles(self) -> list[ProcessorHandle]:
        return [ProcessorHandle(slot) for slot in range(len(self.gpus))]

    def amdsmi_get_gpu_device_uuid(self, handle: ProcessorHandle) -> str:
        return self._gpu(handle)["uuid"]

    def amdsmi_get_gpu_device_bdf(self, handle: ProcessorHandle) -> str:
        return self._gpu(handle)["bdf"]

    def amdsmi_get_gpu_asic_info(self, handle: ProcessorHandle) -> dict[str, Any]:
        return dict(self._gpu(handle)["asic"])

    def amdsmi_get_gpu_board_info(self, handle: ProcessorHandle) -> dict[str, Any]:
        return dict(self._gpu(handle)["board"])

    def amdsmi_get_gpu_vbios_info(self, handle: ProcessorHandle) -> dict[str, Any]:
        return dict(self._gpu(handle)["vbios"])

    def amdsmi_get_gpu_driver_info(self, handle: ProcessorHandle) -> dict[str, Any]:
        return dict(self._gpu(handle)["driver"])

    def amdsmi_topo_get_numa_node_number(self, handle: ProcessorHandle) -> int:
        return self._gpu(handle)["numa"]

    def amdsmi_get_gpu_compute_partition(self, handle: ProcessorHandle) -> str:
        return self._supported(self._gpu(handle)["partition"])

    def amdsmi_get_gpu_memory_total(self, handle: ProcessorHandle, mem_type: AmdSmiMemoryType) -> int:
        assert mem_type is AmdSmiMemoryType.VRAM
        return self._gpu(handle)["vram_total"]

    def amdsmi_get_gpu_memory_usage(self, handle: ProcessorHandle, mem_type: AmdSmiMemoryType) -> int:
        assert mem_type is AmdSmiMemoryType.VRAM
        return self._gpu(handle)["vram_used"]

    def amdsmi_get_gpu_activity(self, handle: ProcessorHandle) -> dict[str, Any]:
        return dict(self._gpu(handle)["activity"])

    def amdsmi_get_temp_metric(
        self, handle: ProcessorHandle, sensor: AmdSmiTemperatureType, metric: AmdSmiTemperatureMetric
    ) -> int:
        assert metric is AmdSmiTemperatureMetric.CURRENT
        return self._supported(self._gpu(handle)["temperature"][sensor.name])

    def amdsmi_get_power_info(self, handle: ProcessorHandle) -> dict[str, Any]:
        return dict(self._gpu(handle)["power"])

    def amdsmi_get_energy_count(self, handle: ProcessorHandle) -> dict[str, Any]:
        return dict(self._gpu(handle)["energy"])

    def amdsmi_get_pcie_info(self, handle: ProcessorHandle) -> dict[str, Any]:
        gpu = self._gpu(handle)
        return {
            "pcie_static": {"max_pcie_width": 16, "max_pcie_speed": 32000, "pcie_interface_version": 5},
            "pcie_metric": {"pcie_width": 16, "pcie_speed": 32000, "pcie_bandwidth": gpu["pcie_bandwidth"]},
        }

    def amdsmi_get_gpu_total_ecc_count(self, handle: ProcessorHandle) -> dict[str, Any]:
        return dict(self._gpu(handle)["ecc"])

    def amdsmi_get_clock_info(self, handle: ProcessorHandle, clock_type: AmdSmiClkType) -> dict[str, Any]:
        clk = self._gpu(handle)["clocks"][clock_type.name]
        return {"clk": clk, "min_clk": 500, "max_clk": 2100, "clk_locked": False, "clk_deep_sleep": 0}

    def amdsmi_get_gpu_ecc_enabled(self, handle: ProcessorHandle) -> int:
        mask = 0
        for block in self._gpu(handle)["ras"]:
            mask |= AmdSmiGpuBlock[block].value
        return mask

    def amdsmi_get_gpu_ecc_count(self, handle: ProcessorHandle, block: AmdSmiGpuBlock) -> dict[str, int]:
        assert isinstance(block, AmdSmiGpuBlock)
        return dict(self._supported(self._gpu(handle)["ras"].get(block.name)))
