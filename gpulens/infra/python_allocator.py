"""The memory allocator of the pipeline's Python processes: jemalloc where it is found.

CPython's own allocator (pymalloc) carves small objects out of 1 MB arenas and gives an arena
back only once every object in it is gone. A long-running consumer interleaves what it keeps
(state, caches) with what it drops (decoded records), so after a burst one kept object pins
each arena: in the worker at 20,000 GPUs, 147 MB of arenas held 56 MB of live objects
(``sys._debugmallocstats``). jemalloc hands back any freed 4 KB page. With it under
``PYTHONMALLOC=malloc`` (every object from jemalloc), the worker's RSS at 20,000 GPUs was 192 /
193 MB at 60 / 120 s against 242 / 242 on pymalloc, at the same CPU (25 % of a core; the five
processors' fleet path 32.5-33.8k samples per CPU-second against 32.1-33.1k). glibc's malloc
instead of jemalloc was the slowest (27.4-29.8k).

The library comes from Debian's ``libjemalloc2`` (``deploy/jemalloc/install_jemalloc.sh`` unpacks
it into ``.tools/lib`` at ``make install``) or from the system. Where neither is found the
processes run on pymalloc, as before. Never for the ClickHouse holder: chDB brings its own
jemalloc and aborts beside a preloaded one.
"""

from __future__ import annotations

import ctypes.util
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

PythonAllocator = Literal["jemalloc", "pymalloc"]

TOOLS_LIBRARY = Path(__file__).resolve().parents[2] / ".tools" / "lib" / "libjemalloc.so.2"
"""Where ``make install`` unpacks jemalloc (a checkout's ``.tools``)."""
JEMALLOC_CONF = "background_thread:true,dirty_decay_ms:1000"
"""Hand freed pages back within about a second, from jemalloc's own thread, so that a process
that goes quiet after a burst shrinks too (without the thread jemalloc purges only while it
allocates)."""


def jemalloc_library() -> str | None:
    """The jemalloc library to preload: ``.tools``'s, else the system's; None if there is none."""
    if TOOLS_LIBRARY.is_file():
        return str(TOOLS_LIBRARY)
    return ctypes.util.find_library("jemalloc")


def allocator_env(choice: PythonAllocator, environ: Mapping[str, str]) -> dict[str, str]:
    """What a pipeline process's environment adds to ``environ`` to run on ``choice``: nothing
    for pymalloc, where jemalloc is not found, or where the user preloads a library or picks
    CPython's allocator already (``LD_PRELOAD``, ``PYTHONMALLOC``: theirs stand)."""
    if choice == "pymalloc" or "LD_PRELOAD" in environ or "PYTHONMALLOC" in environ:
        return {}
    library = jemalloc_library()
    if library is None:
        return {}
    env = {"LD_PRELOAD": library, "PYTHONMALLOC": "malloc"}
    if "MALLOC_CONF" not in environ:
        env["MALLOC_CONF"] = JEMALLOC_CONF
    return env
