"""Interpreter and allocator settings of the long-running processes (worker, sink, exporter,
load generator).

They build and drop thousands of small objects a second (records, rows, window state).
CPython runs a young-generation collection every 700 net allocations, and each one walks
the young objects: measured in the worker on the fleet sample path
(``python -m bench.worker_throughput``), collecting every 10,000 instead gave 1.5x the
records per CPU-second, the same as turning collection off. Our objects rarely form cycles;
reference counting frees them. Startup objects (modules, schemas, generated readers) are
frozen out of every later collection.

What they free goes back to the system only in part: glibc's malloc keeps freed memory in its
heaps for reuse, and a burst (a 100,000-GPU cluster's start, a catch-up) leaves the heap at its
high-water mark. A thread therefore hands freed heap memory back (``malloc_trim``) every
:data:`TRIM_EVERY_S` seconds while at least :data:`TRIM_FROM_BYTES` of it lie free. Every
time, not only when more came free: a trimmed chunk stays counted free, and malloc carving
allocations out of it makes its pages resident again without the free total moving. Trimming
only past 32 MB more free than at the low left, 150 s into a 100,000-GPU run, 189 MB in the
worker and 66 MB in the sink that one more trim handed back (0.01-0.04 s each).

A large native library can be the same: importing chDB reads 240 MB of its 529 MB library into
the process, of which inserts and queries then use about 60 MB. :func:`hand_back_library_pages`
asks the kernel to reclaim a library's resident pages (``madvise(MADV_PAGEOUT)``, Linux 5.4 and
later) now, and again whenever they grew past the working set that came back
(:class:`PageOutPolicy`, looked at every :data:`PAGE_OUT_EVERY_S`); those in use come back at
their next touch. It reclaims only pages no other process maps: the holder is the one process
that loads chDB.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import threading
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

YOUNG_THRESHOLD = 50_000
"""Net allocations between two young-generation collections (CPython's default: 700)."""
OLDER_THRESHOLD = 100
"""Young collections per middle-generation one, and middle per full one (CPython's default: 10).
The worker's live state (records held for event time, holders, windows) reaches the older
generations, and each of their collections walks all of it. On the fleet sample path (five
processors, ``bench.worker_throughput``) the worker took 5.8-6.1 CPU-s with 10,000/10/10,
5.1-5.3 with 50,000/100/100 and 4.85-5.0 with collection off. The load generator keeps the
records of the last two minutes to resend (``EventPublisher``): with CPython's defaults at
100,000 GPUs, a third of its main thread's time went to collections (py-spy), and these
thresholds took it from 22-23.5 % of a core to 14.3-15.1 % in a probe over 50 s of steady load
(``bench.simulate_cost``: 24.8 % before, 19.0 % after, in two runs of the same day)."""


TRIM_EVERY_S = 10.0
TRIM_FROM_BYTES = 32 << 20
"""Free heap bytes from which a trim is worth its cost: it walks the heap holding malloc's lock
(10-40 ms for the worker's and the sink's heaps at 100,000 GPUs, 60-150 ms for a fragmented
1.3 GB heap): at most 1.5 % of a core, every :data:`TRIM_EVERY_S`."""


PAGE_OUT_EVERY_S = 60.0
"""How often the library's resident pages are looked at (:class:`PageOutPolicy` says whether to
hand them back): a burst (a 100,000-GPU cluster's start, a migration, a large merge) reads in
pages steady work never touches again. At 100,000 GPUs (``bench.e2e_scale``, 240 s) the holder's
library pages were 68-120 MB once the start was digested with a hand-back every 60 s, against
155-160 with one every 600 s; but each hand-back also made it read its working set in again
(up to 120 MB, from disk), one such run's second minute had a p99 of 5.4 s, and 30 s had given a
6.2-s minute once."""
PAGE_OUT_SLACK_KB = 32 << 10
"""Growth of the library's resident pages past its working set that is worth a hand-back."""
MADV_PAGEOUT = 21
"""Linux's advice to reclaim the given pages now (``<sys/mman.h>``)."""


def tune_for_throughput() -> None:
    """Collect cycles less often, never re-scan what exists at startup, and hand freed memory
    back to the system."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, OLDER_THRESHOLD, OLDER_THRESHOLD)
    hand_back_freed_memory()


def hand_back_freed_memory(every_s: float = TRIM_EVERY_S, from_bytes: int = TRIM_FROM_BYTES) -> bool:
    """Start the thread that trims malloc's heaps (module docstring); False where the C library
    is not glibc (musl, macOS) and nothing is trimmed."""
    libc = _glibc()
    if libc is None:
        return False
    threading.Thread(
        target=_trim_forever, args=(libc, every_s, from_bytes), name="malloc-trim", daemon=True
    ).start()
    return True


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                     "fordblks", "keepcost")
    ]  # fmt: skip


def _glibc() -> Any:
    """glibc with ``malloc_trim`` and ``mallinfo2`` (2.33 and later); None elsewhere (musl,
    macOS), where nothing is trimmed."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
        libc.mallinfo2.argtypes, libc.mallinfo2.restype = [], _MallInfo2
    except (OSError, AttributeError, TypeError):
        return None
    return libc


def free_heap_bytes(libc: Any) -> int:
    """Bytes malloc holds free in its heaps (mmapped blocks are returned when freed)."""
    info: _MallInfo2 = libc.mallinfo2()
    return int(info.fordblks)


def _trim_forever(libc: Any, every_s: float, from_bytes: int) -> None:
    """Trim whenever ``from_bytes`` or more lie free (module docstring)."""
    while True:  # a daemon thread: it ends with its process
        time.sleep(every_s)
        free = free_heap_bytes(libc)
        if free >= from_bytes:
            started = time.perf_counter()
            libc.malloc_trim(0)
            log.debug(
                "handed freed heap memory back: %.0f MB free; %.0f ms",
                free / 1e6, (time.perf_counter() - started) * 1000,
            )  # fmt: skip


def hand_back_library_pages(library: Path, every_s: float = PAGE_OUT_EVERY_S) -> bool:
    """Reclaim the resident pages of the shared library ``library`` now, and start a thread that
    looks at them every ``every_s`` and reclaims them again when :class:`PageOutPolicy` says so
    (module docstring); False, with nothing started, where the
    kernel or the C library cannot (not Linux, a kernel before 5.4, ``library`` not mapped)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.madvise.restype = ctypes.c_int
    except (OSError, AttributeError):
        return False
    if not page_out(libc, library):
        return False
    threading.Thread(
        target=_page_out_forever, args=(libc, library, every_s), name="page-out", daemon=True
    ).start()
    return True


def page_out(libc: Any, library: Path) -> bool:
    """Advise the kernel to reclaim every mapping of ``library`` in this process; False if it
    is not mapped or the kernel refused."""
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return False
    path = str(library.resolve())  # as the kernel names it
    ranges = [
        [int(bound, 16) for bound in fields[0].split("-")]
        for fields in (line.split(maxsplit=5) for line in maps)
        if len(fields) == 6 and fields[5] == path
    ]
    for low, high in ranges:
        if libc.madvise(low, high - low, MADV_PAGEOUT) != 0:
            log.debug("madvise(MADV_PAGEOUT) of %s: errno %d", library, ctypes.get_errno())
            return False
    return bool(ranges)


class PageOutPolicy:
    """Whether a look at a library's resident pages should hand them back: only when they grew
    past its working set by ``slack_kb``. The working set is what is resident at the first look
    after a hand-back (what the process read in again since); that look hands nothing back. So a
    burst's pages go back within two looks, and a process whose pages stay put never reads its
    working set in again for nothing."""

    def __init__(self, slack_kb: int = PAGE_OUT_SLACK_KB) -> None:
        self._slack_kb = slack_kb
        self._working_kb: int | None = None
        """Resident at the first look after the last hand-back (None: that look is next)."""

    def due(self, resident_kb: int) -> bool:
        """Hand back now, ``resident_kb`` of the library being resident."""
        if self._working_kb is None:
            self._working_kb = resident_kb
            return False
        if resident_kb <= self._working_kb + self._slack_kb:
            return False
        self._working_kb = None
        return True


def resident_kb(library: Path) -> int:
    """KB of ``library``'s pages resident in this process (its mappings' Rss, /proc/self/smaps)."""
    path, kb, inside = str(library.resolve()), 0, False
    with Path("/proc/self/smaps").open() as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5 and ":" in fields[3]:  # a mapping's header
                inside = len(fields) == 6 and fields[5] == path
            elif inside and fields[0] == "Rss:":
                kb += int(fields[1])
    return kb


def _page_out_forever(libc: Any, library: Path, every_s: float) -> None:
    policy = PageOutPolicy()
    while True:  # a daemon thread: it ends with its process
        time.sleep(every_s)
        try:
            due = policy.due(resident_kb(library))
        except OSError:  # /proc unreadable: hand back as before
            due = True
        if due:
            page_out(libc, library)
