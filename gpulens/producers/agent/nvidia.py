"""NVIDIA GPUs through NVML (the nvidia-ml-py binding, module ``pynvml``).

Same seam as the AMD collector: the library comes in as ``library=``, defaulting to the real
``pynvml``; tests hand in an object with NVML's functions that raises pynvml's own errors.
MIG devices are GPUs of their own, linked to their parent by ``parent_device_id``.

Health (:meth:`NvidiaCollector.health`) is read per whole GPU: XIDs from an NVML event set
(``nvmlEventTypeXidCriticalError``, registered once, drained without waiting each round; an
XID on a MIG instance names its parent GPU), volatile ECC counts (since the driver loaded),
retired pages (pre-Ampere) and remapped rows (Ampere and later).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from dataclasses import dataclass
from typing import Any

from gpulens.producers.agent.collecting import HealthReading, integer, number, optional, text
from gpulens.producers.agent.exceptions import CollectorUnavailable
from gpulens.schemas.model.models import GpuDevice, GpuSample

log = logging.getLogger(__name__)

MIG_MARKER = " MIG "
"""NVML names a MIG device after its parent and profile: 'NVIDIA A100-SXM4-80GB MIG 3g.40gb'."""
MAX_XIDS_PER_ROUND = 1000
"""Events drained from the event set per round at most: an XID storm cannot stall the loop
(the rest wait in NVML's queue for the next round)."""


@dataclass(frozen=True, slots=True)
class _Handle:
    handle: Any
    device_id: str
    index: int


def _bdf(bus_id: bytes | str) -> str:
    # NVML writes an 8-digit domain in upper case (00000000:18:00.0); sysfs and kubelet use 4, lower.
    value = bus_id.decode() if isinstance(bus_id, bytes) else bus_id
    domain, _, rest = value.partition(":")
    return f"{int(domain, 16):04x}:{rest.lower()}"


class NvidiaCollector:
    """Inventory and samples of every NVIDIA GPU and MIG device NVML enumerates."""

    name = "nvidia"

    def __init__(self, library: Any | None = None) -> None:
        self._library = library
        self._lib: Any = None
        self._handles: list[_Handle] = []
        self._whole: list[_Handle] = []
        self._events: Any = None
        self._no_events = False

    def start(self) -> None:
        lib = self._library if self._library is not None else importlib.import_module("pynvml")
        try:
            lib.nvmlInit()
        except lib.NVMLError as err:
            if err.value == lib.NVML_ERROR_LIBRARY_NOT_FOUND:
                raise CollectorUnavailable(
                    "NVML (libnvidia-ml.so.1) not found (install the NVIDIA driver or run on a GPU node)"
                ) from err
            if err.value == lib.NVML_ERROR_DRIVER_NOT_LOADED:
                raise CollectorUnavailable("NVIDIA driver not loaded (NVML is there)") from err
            raise CollectorUnavailable(f"nvmlInit failed: {err}") from err
        if lib.nvmlDeviceGetCount() == 0:
            lib.nvmlShutdown()
            raise CollectorUnavailable("no NVIDIA GPU on this node")
        self._lib = lib

    def close(self) -> None:
        if self._lib is not None:
            with contextlib.suppress(self._lib.NVMLError):
                if self._events is not None:
                    self._lib.nvmlEventSetFree(self._events)
                self._lib.nvmlShutdown()
            self._lib, self._events = None, None

    def _read(self, call: str, *args: Any) -> Any:
        return optional((self._lib.NVMLError,), getattr(self._lib, call), *args)

    def gpus(self) -> list[GpuDevice]:
        lib = self._lib
        driver = text(self._read("nvmlSystemGetDriverVersion"))
        devices, handles = [], []
        for index in range(lib.nvmlDeviceGetCount()):
            handle = lib.nvmlDeviceGetHandleByIndex(index)
            gpu = self._device(handle, index, driver)
            devices.append(gpu)
            handles.append(_Handle(handle, gpu.device_id, index))
            for mig in self._mig_handles(handle):
                device = self._mig_device(mig, gpu)
                devices.append(device)
                handles.append(_Handle(mig, device.device_id, index))
        self._handles = handles
        self._whole = [h for h, gpu in zip(handles, devices, strict=True) if gpu.parent_device_id is None]
        return devices

    def _device(self, handle: Any, index: int, driver: str | None) -> GpuDevice:
        lib = self._lib
        uuid = text(lib.nvmlDeviceGetUUID(handle))
        pci = self._read("nvmlDeviceGetPciInfo", handle)
        memory = self._read("nvmlDeviceGetMemoryInfo", handle)
        return GpuDevice(
            device_id=uuid or f"nvidia-{index}",
            index=index,
            vendor="NVIDIA",
            model=text(self._read("nvmlDeviceGetName", handle)) or "NVIDIA GPU",
            uuid=uuid,
            serial=text(self._read("nvmlDeviceGetSerial", handle)),
            # pciDeviceId packs the device id in the high 16 bits and the vendor id in the low 16.
            pci_vendor_id=None if pci is None else f"0x{pci.pciDeviceId & 0xFFFF:04x}",
            pci_device_id=None if pci is None else f"0x{pci.pciDeviceId >> 16:04x}",
            bdf=None if pci is None else _bdf(pci.busId),
            numa_node=integer(self._read("nvmlDeviceGetNumaNodeId", handle)),
            vram_total_bytes=None if memory is None else int(memory.total),
            vbios_version=text(self._read("nvmlDeviceGetVbiosVersion", handle)),
            driver_version=driver,
        )

    def _mig_handles(self, handle: Any) -> list[Any]:
        lib = self._lib
        mode = self._read("nvmlDeviceGetMigMode", handle)
        if mode is None or mode[0] != lib.NVML_DEVICE_MIG_ENABLE:
            return []
        slots = range(lib.nvmlDeviceGetMaxMigDeviceCount(handle))
        # Empty slots answer NVML_ERROR_NOT_FOUND.
        found = (self._read("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot) for slot in slots)
        return [mig for mig in found if mig is not None]

    def _mig_device(self, mig: Any, parent: GpuDevice) -> GpuDevice:
        name = text(self._read("nvmlDeviceGetName", mig)) or parent.model
        memory = self._read("nvmlDeviceGetMemoryInfo", mig)
        uuid = text(self._lib.nvmlDeviceGetUUID(mig))
        return parent.model_copy(
            update={
                "device_id": uuid,
                "uuid": uuid,
                "model": name.partition(MIG_MARKER)[0],
                "vram_total_bytes": None if memory is None else int(memory.total),
                "parent_device_id": parent.device_id,
                "partition": name.partition(MIG_MARKER)[2] or None,
            }
        )

    def samples(self) -> list[GpuSample]:
        if not self._handles:
            self.gpus()
        lib = self._lib
        samples = []
        for h in self._handles:
            utilization = self._read("nvmlDeviceGetUtilizationRates", h.handle)
            memory = self._read("nvmlDeviceGetMemoryInfo", h.handle)
            milliwatts = number(self._read("nvmlDeviceGetPowerUsage", h.handle))
            millijoules = number(self._read("nvmlDeviceGetTotalEnergyConsumption", h.handle))
            tx = number(self._read("nvmlDeviceGetPcieThroughput", h.handle, lib.NVML_PCIE_UTIL_TX_BYTES))
            rx = number(self._read("nvmlDeviceGetPcieThroughput", h.handle, lib.NVML_PCIE_UTIL_RX_BYTES))
            samples.append(
                GpuSample(
                    device_id=h.device_id,
                    index=h.index,
                    utilization_pct=None if utilization is None else float(utilization.gpu),
                    memory_used_bytes=None if memory is None else int(memory.used),
                    memory_total_bytes=None if memory is None else int(memory.total),
                    temperature_edge_c=number(
                        self._read("nvmlDeviceGetTemperature", h.handle, lib.NVML_TEMPERATURE_GPU)
                    ),
                    power_watts=None if milliwatts is None else milliwatts / 1000,
                    energy_joules=None if millijoules is None else millijoules / 1000,
                    sm_clock_mhz=number(self._read("nvmlDeviceGetClockInfo", h.handle, lib.NVML_CLOCK_SM)),
                    memory_clock_mhz=number(
                        self._read("nvmlDeviceGetClockInfo", h.handle, lib.NVML_CLOCK_MEM)
                    ),
                    # NVML counts PCIe throughput in KiB/s, each direction apart.
                    pcie_bandwidth_mbps=None if tx is None or rx is None else (tx + rx) / 1024,
                    ecc_correctable=self._ecc(h.handle, lib.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                    ecc_uncorrectable=self._ecc(h.handle, lib.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
                )
            )
        return samples

    def _ecc(self, handle: Any, error_type: int) -> int | None:
        return integer(
            self._read("nvmlDeviceGetTotalEccErrors", handle, error_type, self._lib.NVML_AGGREGATE_ECC)
        )

    # --- health -------------------------------------------------------------------------------

    def health(self) -> list[HealthReading]:
        if not self._whole:
            self.gpus()
        xids = self._xids()
        return [self._health(h, tuple(xids.get(h.device_id, ()))) for h in self._whole]

    def _event_set(self) -> Any:
        """The event set every whole GPU's XIDs arrive in, made at the first call (None where NVML
        cannot make one: no XIDs then); a GPU whose driver does not support XID events is left
        out. The counters are read either way."""
        if self._events is None and not self._no_events:
            lib = self._lib
            try:
                self._events = lib.nvmlEventSetCreate()
            except lib.NVMLError as err:
                log.warning("no NVML event set, so no XIDs: %s", err)
                self._no_events = True
                return None
            for h in self._whole:
                try:
                    lib.nvmlDeviceRegisterEvents(h.handle, lib.nvmlEventTypeXidCriticalError, self._events)
                except lib.NVMLError as err:
                    log.warning("no XID events from GPU %s: %s", h.device_id, err)
        return self._events

    def _xids(self) -> dict[str, list[int]]:
        """device_id -> the XIDs that arrived since the last round, in order."""
        lib = self._lib
        events = self._event_set()
        found: dict[str, list[int]] = {}
        for _ in range(MAX_XIDS_PER_ROUND if events is not None else 0):
            try:
                data = lib.nvmlEventSetWait_v2(events, 0)
            except lib.NVMLError as err:
                if err.value == lib.NVML_ERROR_TIMEOUT:  # nothing (more) waiting
                    break
                raise
            if data.eventType & lib.nvmlEventTypeXidCriticalError:
                # The handle in the event is NVML's pointer, not one of ours: its UUID names the GPU.
                uuid = text(lib.nvmlDeviceGetUUID(data.device)) or ""
                found.setdefault(uuid, []).append(int(data.eventData))
        return found

    def _health(self, h: _Handle, xids: tuple[int, ...]) -> HealthReading:
        lib = self._lib
        counters: dict[str, int | None] = {
            "ecc_volatile_corrected": self._volatile_ecc(h.handle, lib.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            "ecc_volatile_uncorrected": self._volatile_ecc(h.handle, lib.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
        }
        for name, cause in (
            ("retired_pages_sbe", lib.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
            ("retired_pages_dbe", lib.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
        ):
            pages = self._read("nvmlDeviceGetRetiredPages", h.handle, cause)
            counters[name] = None if pages is None else len(pages)
        pending = self._read("nvmlDeviceGetRetiredPagesPendingStatus", h.handle)
        if pending is not None:
            counters["retired_pages_pending"] = int(pending == lib.NVML_FEATURE_ENABLED)
        rows = self._read("nvmlDeviceGetRemappedRows", h.handle)
        if rows is not None:
            for name, value in zip(_REMAPPED_ROWS, rows, strict=True):
                counters[name] = int(value)
        known = {name: value for name, value in counters.items() if value is not None}
        conditions = tuple(c for c, counter in _CONDITIONS if known.get(counter, 0) > 0)
        return HealthReading(h.device_id, h.index, "NVIDIA", conditions, known, xids)

    def _volatile_ecc(self, handle: Any, error_type: int) -> int | None:
        return integer(
            self._read("nvmlDeviceGetTotalEccErrors", handle, error_type, self._lib.NVML_VOLATILE_ECC)
        )


_REMAPPED_ROWS = (
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "remapped_rows_pending",
    "remapped_rows_failure",
)
"""nvmlDeviceGetRemappedRows' answer, in its order: (corrRows, uncRows, isPending, failureOccurred)."""
_CONDITIONS = (
    ("ecc-uncorrectable", "ecc_volatile_uncorrected"),
    ("retired-pages-pending", "retired_pages_pending"),
    ("row-remap-pending", "remapped_rows_pending"),
    ("row-remap-failure", "remapped_rows_failure"),
)
"""Critical conditions and the counter that shows each (above 0)."""
