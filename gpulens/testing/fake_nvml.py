"""NVML as nvidia-ml-py exposes it on an H100 or A100 (MIG) node: the library boundary only.

Constants, structs and errors are pynvml's own (pynvml imports without NVML); only the
functions that would call libnvidia-ml are replaced, returning what NVML returns on the real
boards (units as NVML gives them: mW, mJ, KiB/s, bytes) and raising NVMLError where it does
(NOT_SUPPORTED for MIG-device readings, NOT_FOUND for empty MIG slots).

Health as NVML reports it: XID events queued by :meth:`FakeNvml.xid` come out of
``nvmlEventSetWait_v2`` in the shape of ``c_nvmlEventData_t`` (then NVML_ERROR_TIMEOUT), for
GPUs registered for ``nvmlEventTypeXidCriticalError``; volatile ECC counts, retired pages
(NOT_SUPPORTED on Ampere and later, as on the real boards) and remapped rows per GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pynvml

MIB = 1024**2


@dataclass
class FakeGpu:
    name: str
    uuid: str
    serial: str
    bus_id: bytes
    pci_device_id: int
    memory_total: int
    memory_used: int
    utilization: int
    temperature: int
    power_mw: int
    energy_mj: int
    sm_clock: int
    mem_clock: int
    pcie_tx_kib: int
    pcie_rx_kib: int
    ecc_corrected: int
    ecc_uncorrected: int
    numa: int = 0
    vbios: str = "96.00.89.00.01"
    migs: list[FakeGpu | None] = field(default_factory=list)
    """MIG slots (None: empty); a non-empty list means MIG mode is on."""
    ecc_volatile_corrected: int = 0
    ecc_volatile_uncorrected: int = 0
    retired_pages: tuple[list[int], list[int], int] | None = None
    """(single-bit addresses, double-bit addresses, pending: NVML_FEATURE_*); None: NOT_SUPPORTED."""
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)
    """nvmlDeviceGetRemappedRows: (correctable, uncorrectable, pending, failure occurred)."""


@dataclass(frozen=True)
class FakeEventData:
    """``c_nvmlEventData_t``'s fields; ``device`` is the handle of the GPU it happened on."""

    device: Any
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF  # not a MIG instance
    computeInstanceId: int = 0xFFFFFFFF


def h100(index: int) -> FakeGpu:
    return FakeGpu(
        name="NVIDIA H100 80GB HBM3",
        uuid=f"GPU-5b6a8c1e-3f2d-4e7a-9c0b-1d2e3f40{index:04d}",
        serial=f"165222200{index:04d}",
        bus_id=f"00000000:{0x18 + 0x10 * index:02X}:00.0".encode(),
        pci_device_id=0x233010DE,
        memory_total=81559 * MIB,
        memory_used=61440 * MIB,
        utilization=93,
        temperature=41,
        power_mw=312456,
        energy_mj=987654321,
        sm_clock=1980,
        mem_clock=2619,
        pcie_tx_kib=2048,
        pcie_rx_kib=10240,
        ecc_corrected=0,
        ecc_uncorrected=0,
        numa=0 if index < 4 else 1,
    )


def a100_mig(index: int) -> FakeGpu:
    """An A100 80GB in MIG mode with two 3g.40gb instances (slot 1 of 7 empty)."""
    parent_uuid = f"GPU-a1b2c3d4-0000-1111-2222-3333444{index:05d}"

    def mig(slot: int) -> FakeGpu:
        return FakeGpu(
            name="NVIDIA A100-SXM4-80GB MIG 3g.40gb",
            uuid=f"MIG-7d1a0e3c-5f44-5b2a-8c3d-00000{index:03d}{slot:04d}",
            serial="",
            bus_id=b"",
            pci_device_id=0,
            memory_total=40192 * MIB,
            memory_used=11000 * MIB,
            utilization=0,
            temperature=0,
            power_mw=0,
            energy_mj=0,
            sm_clock=0,
            mem_clock=0,
            pcie_tx_kib=0,
            pcie_rx_kib=0,
            ecc_corrected=0,
            ecc_uncorrected=0,
        )

    return FakeGpu(
        name="NVIDIA A100-SXM4-80GB",
        uuid=parent_uuid,
        serial=f"132312000{index:04d}",
        bus_id=f"00000000:{0x07 + index:02X}:00.0".encode(),
        pci_device_id=0x20B210DE,
        memory_total=81920 * MIB,
        memory_used=22000 * MIB,
        utilization=55,
        temperature=35,
        power_mw=189000,
        energy_mj=123456789,
        sm_clock=1410,
        mem_clock=1593,
        pcie_tx_kib=100,
        pcie_rx_kib=200,
        ecc_corrected=5,
        ecc_uncorrected=1,
        vbios="92.00.45.00.06",
        migs=[mig(0), None, mig(2)],
    )


XID_INCIDENT: tuple[tuple[str, dict[str, int]], ...] = (
    (
        "NVRM: Xid (PCI:0000:38:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on "
        "(GPC 7, TPC 7, SM 0): Illegal Instruction Parameter",
        {"eventType": 0x8, "eventData": 13, "gpuInstanceId": 0xFFFFFFFF, "computeInstanceId": 0xFFFFFFFF},
    ),
    (
        "NVRM: Xid (PCI:0000:38:00): 94, pid=2254117, name=python3, Contained: SM (0x1). RST: No, D-RST: No",
        {"eventType": 0x8, "eventData": 94, "gpuInstanceId": 0xFFFFFFFF, "computeInstanceId": 0xFFFFFFFF},
    ),
    (
        "NVRM: Xid (PCI:0000:38:00): 63, pid='<unknown>', name=<unknown>, Row Remapper: New row "
        "(0x0000000000c4e2a1) Marked for Remapping, reset gpu to activate.",
        {"eventType": 0x8, "eventData": 63, "gpuInstanceId": 0xFFFFFFFF, "computeInstanceId": 0xFFFFFFFF},
    ),
)
"""An H100's (:func:`h100` 2, PCI 0000:38:00) XIDs as the driver logs them in dmesg, each with the
``c_nvmlEventData_t`` nvmlEventSetWait_v2 returns for it (eventType nvmlEventTypeXidCriticalError,
eventData the XID, instance ids 0xFFFFFFFF off MIG): an application's illegal instruction (13),
then an uncorrectable HBM error contained to the process (94) and the row marked for remapping
at the next reset (63)."""


@dataclass(frozen=True)
class _Handle:
    gpu: FakeGpu
    is_mig: bool = False


class FakeNvml:
    """pynvml's surface for a node with ``gpus``; ``init_error`` (an NVML_ERROR_*) makes nvmlInit fail."""

    NVMLError = pynvml.NVMLError

    def __init__(
        self, gpus: list[FakeGpu], *, driver: str = "550.90.07", init_error: int | None = None
    ) -> None:
        self.gpus = gpus
        self.driver = driver
        self.init_error = init_error
        self.registered: dict[str, int] = {}
        """GPU uuid -> event types registered (one event set per node, as the agent makes it)."""
        self._queue: list[FakeEventData] = []

    def happen(self, index: int, payload: Mapping[str, int]) -> None:
        """The event ``payload`` (``c_nvmlEventData_t``'s fields but the device) happens on GPU
        ``index``: queued only if its type is registered for that GPU, as in NVML."""
        gpu = self.gpus[index]
        if self.registered.get(gpu.uuid, 0) & payload["eventType"]:
            self._queue.append(FakeEventData(_Handle(gpu), **payload))

    def __getattr__(self, name: str) -> Any:
        if name.startswith(("NVML_", "nvmlEventType")):  # constants are the real ones
            return getattr(pynvml, name)
        raise AttributeError(name)

    @staticmethod
    def _whole_gpu(handle: _Handle) -> FakeGpu:
        if handle.is_mig:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return handle.gpu

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        return _Handle(self.gpus[index])

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        return handle.gpu.name

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        return handle.gpu.uuid

    def nvmlDeviceGetSerial(self, handle: _Handle) -> str:
        return self._whole_gpu(handle).serial

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> pynvml.nvmlPciInfo_t:
        gpu = self._whole_gpu(handle)
        return pynvml.nvmlPciInfo_t(busId=gpu.bus_id, pciDeviceId=gpu.pci_device_id)

    def nvmlDeviceGetNumaNodeId(self, handle: _Handle) -> int:
        return self._whole_gpu(handle).numa

    def nvmlDeviceGetVbiosVersion(self, handle: _Handle) -> str:
        return self._whole_gpu(handle).vbios

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle) -> pynvml.c_nvmlMemory_t:
        gpu = handle.gpu
        return pynvml.c_nvmlMemory_t(
            total=gpu.memory_total, free=gpu.memory_total - gpu.memory_used, used=gpu.memory_used
        )

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> pynvml.c_nvmlUtilization_t:
        return pynvml.c_nvmlUtilization_t(gpu=self._whole_gpu(handle).utilization, memory=40)

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._whole_gpu(handle).temperature

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        return self._whole_gpu(handle).power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: _Handle) -> int:
        return self._whole_gpu(handle).energy_mj

    def nvmlDeviceGetClockInfo(self, handle: _Handle, clock: int) -> int:
        gpu = self._whole_gpu(handle)
        return {pynvml.NVML_CLOCK_SM: gpu.sm_clock, pynvml.NVML_CLOCK_MEM: gpu.mem_clock}[clock]

    def nvmlDeviceGetPcieThroughput(self, handle: _Handle, counter: int) -> int:
        gpu = self._whole_gpu(handle)
        return gpu.pcie_tx_kib if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else gpu.pcie_rx_kib

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        mode = (
            pynvml.NVML_DEVICE_MIG_ENABLE if self._whole_gpu(handle).migs else pynvml.NVML_DEVICE_MIG_DISABLE
        )
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, slot: int) -> _Handle:
        migs = self._whole_gpu(handle).migs
        mig = migs[slot] if slot < len(migs) else None
        if mig is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return _Handle(mig, is_mig=True)

    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlEventSetFree(self, _events: object) -> None:
        pass

    def nvmlDeviceRegisterEvents(self, handle: _Handle, event_types: int, _events: object) -> None:
        gpu = self._whole_gpu(handle)
        self.registered[gpu.uuid] = self.registered.get(gpu.uuid, 0) | event_types

    def nvmlEventSetWait_v2(self, _events: object, timeout_ms: int) -> FakeEventData:
        if not self._queue:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return self._queue.pop(0)

    def nvmlDeviceGetTotalEccErrors(self, handle: _Handle, error_type: int, counter_type: int) -> int:
        gpu = self._whole_gpu(handle)
        corrected = error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
        if counter_type == pynvml.NVML_VOLATILE_ECC:
            return gpu.ecc_volatile_corrected if corrected else gpu.ecc_volatile_uncorrected
        assert counter_type == pynvml.NVML_AGGREGATE_ECC
        return gpu.ecc_corrected if corrected else gpu.ecc_uncorrected

    def nvmlDeviceGetRetiredPages(self, handle: _Handle, cause: int) -> list[int]:
        pages = self._whole_gpu(handle).retired_pages
        if pages is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        single, double, _ = pages
        sbe = cause == pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
        return list(single if sbe else double)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: _Handle) -> int:
        pages = self._whole_gpu(handle).retired_pages
        if pages is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return pages[2]

    def nvmlDeviceGetRemappedRows(self, handle: _Handle) -> tuple[int, int, int, int]:
        return self._whole_gpu(handle).remapped_rows
