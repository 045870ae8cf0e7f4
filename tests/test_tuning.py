"""The long-running processes hand the heap memory they freed back to the system (glibc), and
the ClickHouse holder the pages of chDB's library it does not use (Linux)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType

import chdb
import pytest

from gpulens.config import GPULensSettings
from gpulens.infra.clickhouse.engine import LIBRARY
from gpulens.infra.python_allocator import allocator_env, jemalloc_library
from gpulens.main_job import EXPORTER, SINK, WORKER, pipeline_specs
from gpulens.tuning import PageOutPolicy, _glibc

# What the processes below share: their RSS in MB, and a heap filled with ~400 MB of 1-2 KB
# objects of which nine in ten are freed (the tenth keeps every stretch of the heap in use, as a
# few live records do).
RSS = """
import sys, time
from gpulens.tuning import hand_back_freed_memory
def rss():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS'):
            return int(line.split()[1]) // 1024
"""
FILL_AND_FREE_NINE_IN_TEN = """
held = [bytes(1024 + i % 1024) for i in range(300_000)]
kept = held[::10]
del held
"""
ANSWER_WHEN_ASKED = """
for line in sys.stdin:
    print(rss(), flush=True)
"""

# A process that fills and frees, prints its RSS once freed, then starts trimming or not, and
# prints its RSS whenever asked. The trimming starts after the first print: started before the
# freeing, under the full suite's load it once trimmed while the freeing ran, and the first
# figure was already the trimmed one (181 MB, and 181 at the lowest).
FREE_NINE_IN_TEN = (
    RSS
    + FILL_AND_FREE_NINE_IN_TEN
    + "print(rss(), flush=True)\n"
    + """
if sys.argv[1] == 'trim':
    assert hand_back_freed_memory(every_s=0.1, from_bytes=16 << 20)
"""
    + ANSWER_WHEN_ASKED
)


glibc_only = pytest.mark.skipif(_glibc() is None, reason="malloc_trim is glibc's")


def watch_rss(
    script: str,
    *args: str,
    first: int,
    enough: Callable[[list[int], int], bool],
    within_s: float = 10,
    env: Mapping[str, str] = MappingProxyType({}),
) -> tuple[list[int], int]:
    """Run ``script`` (``env`` added to this environment): the first ``first`` RSS figures (MB)
    it prints, and the lowest it shows after them, asked every 0.2 s for ``within_s`` or until
    ``enough(firsts, lowest)``."""
    with subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    ) as process:
        assert process.stdin is not None and process.stdout is not None
        try:
            firsts = [int(process.stdout.readline()) for _ in range(first)]
            lowest = firsts[-1]
            deadline = time.monotonic() + within_s  # a trim every 0.1 s has had many chances by then
            while time.monotonic() < deadline and not enough(firsts, lowest):
                time.sleep(0.2)
                process.stdin.write("\n")
                process.stdin.flush()
                lowest = min(lowest, int(process.stdout.readline()))
        finally:
            process.kill()
    return firsts, lowest


def rss_after_freeing(mode: str, within_s: float = 10) -> tuple[int, int]:
    """The RSS (MB) right after freeing, and the lowest within ``within_s`` after (less when it
    halved)."""
    (freed,), lowest = watch_rss(
        FREE_NINE_IN_TEN, mode, first=1, enough=lambda f, low: low < f[0] / 2, within_s=within_s
    )
    return freed, lowest


@glibc_only
def test_freed_heap_memory_stays_with_the_process_unless_handed_back() -> None:
    freed, lowest = rss_after_freeing("none")
    assert lowest > freed * 0.8, f"RSS {freed} MB after freeing, {lowest} MB at the lowest"


@glibc_only
def test_freed_heap_memory_is_handed_back_to_the_system() -> None:
    freed, lowest = rss_after_freeing("trim", within_s=60)  # once no trim in 10 s, under the full suite
    assert lowest < freed / 2, f"RSS {freed} MB after freeing, {lowest} MB at the lowest"


# A process whose freed heap was handed back, then reuses part of it (24 MB: its free total moves
# less than the 32 MB a trim waits for) and frees that again; it prints its RSS in MB before the
# reuse, while the reused memory is held, and then whenever asked.
REUSE_AFTER_TRIM = (
    RSS
    + "assert hand_back_freed_memory(every_s=0.1, from_bytes=32 << 20)\n"
    + FILL_AND_FREE_NINE_IN_TEN
    + """
freed, deadline = rss(), time.monotonic() + 10
while rss() > freed / 2 and time.monotonic() < deadline:
    time.sleep(0.1)
time.sleep(0.5)
print(rss(), flush=True)
again = [bytes(1024 + i % 1024) for i in range(16_000)]
print(rss(), flush=True)
del again
"""
    + ANSWER_WHEN_ASKED
)


@glibc_only
def test_freed_heap_memory_reused_and_freed_again_is_handed_back_again() -> None:
    (trimmed, reused), lowest = watch_rss(REUSE_AFTER_TRIM, first=2, enough=lambda f, low: low <= f[0] + 3)
    assert reused >= trimmed + 8, f"the reuse did not show: {trimmed} -> {reused} MB"
    assert lowest <= trimmed + 3, f"RSS {trimmed} MB trimmed, {reused} MB reused, {lowest} MB at the lowest"


# A process that imports chDB, optionally hands its library's pages back, then queries it; it
# prints the library's path, its resident MB after the import, after the hand-back (or not) and
# after the query, and the query's answer.
CHDB_PAGES = """
import sys
import chdb
from gpulens.infra.clickhouse.engine import LIBRARY
from gpulens.tuning import hand_back_library_pages, resident_kb
def resident():
    return resident_kb(LIBRARY) // 1024
print(LIBRARY)
print(resident())
if sys.argv[1] == 'hand-back':
    assert hand_back_library_pages(LIBRARY)
print(resident())
answer = chdb.query('SELECT sum(number) FROM numbers(1000)', 'CSV').bytes().decode().strip()
print(resident())
print(answer)
"""


def library_resident_mb(mode: str, site: Path) -> tuple[int, int, int, str]:
    """Run :data:`CHDB_PAGES` on a copy of chDB of its own: the kernel reclaims only pages no
    other process maps, and the suite's holder maps the installed library."""
    package = Path(chdb.__file__).parent
    for name in (package.name, *(p.name for p in package.parent.glob("chdb_core.libs"))):
        shutil.copytree(package.parent / name, site / name)
    done = subprocess.run(
        [sys.executable, "-c", CHDB_PAGES, mode],
        capture_output=True, text=True, timeout=120, check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])},
    )  # fmt: skip
    library, imported, handed, queried, answer = done.stdout.split()
    assert library.startswith(str(site)), f"not the copy: {library}"
    return int(imported), int(handed), int(queried), answer


def kernel_pages_out() -> bool:
    """Linux 5.4 or later, where madvise takes MADV_PAGEOUT."""
    if not sys.platform.startswith("linux"):
        return False
    major, minor = (int(part) for part in re.findall(r"\d+", os.uname().release)[:2])
    return (major, minor) >= (5, 4)


linux_only = pytest.mark.skipif(
    LIBRARY is None or not kernel_pages_out(), reason="madvise(MADV_PAGEOUT) is Linux's, 5.4 and later"
)


@linux_only
def test_chdbs_library_stays_resident_as_imported_unless_handed_back(tmp_path: Path) -> None:
    imported, kept, _, _ = library_resident_mb("none", tmp_path)
    assert imported > 100, f"importing chDB read only {imported} MB of its library"
    assert kept > imported * 0.9, f"{imported} MB resident after the import, {kept} MB after"


@linux_only
def test_chdbs_unused_library_pages_are_handed_back_and_it_still_answers(tmp_path: Path) -> None:
    imported, handed, queried, answer = library_resident_mb("hand-back", tmp_path)
    assert handed < imported / 2, f"{imported} MB resident after the import, {handed} MB after the hand-back"
    assert queried < imported / 2, f"{queried} MB resident after a query ({imported} after the import)"
    assert answer == str(sum(range(1000)))


# ~290 MB of small objects (233 bytes each), of which one in 4,000 stays: about one per
# CPython arena (1 MB), as a long-running consumer keeps a little state among what it drops.
FREE_ALL_BUT_ONE_IN_AN_ARENA = (
    RSS
    + """
held = [bytes(200) for _ in range(1_200_000)]
kept = held[::4_000]
del held
print(rss(), flush=True)
"""
    + ANSWER_WHEN_ASKED
)


def rss_after_freeing_small_objects(env: dict[str, str], within_s: float) -> tuple[int, int]:
    """As :func:`rss_after_freeing`, for :data:`FREE_ALL_BUT_ONE_IN_AN_ARENA` run with ``env``
    added (as the supervisor adds a pipeline process's allocator)."""
    (freed,), lowest = watch_rss(
        FREE_ALL_BUT_ONE_IN_AN_ARENA,
        first=1,
        enough=lambda f, low: low < f[0] / 2,
        within_s=within_s,
        env=env,
    )
    return freed, lowest


def test_small_objects_freed_around_kept_ones_stay_with_cpythons_allocator() -> None:
    freed, lowest = rss_after_freeing_small_objects({}, within_s=5)
    assert lowest > freed * 0.8, f"RSS {freed} MB after freeing, {lowest} MB at the lowest"


def test_a_pipeline_process_on_jemalloc_hands_back_small_objects_freed_around_kept_ones() -> None:
    env = allocator_env("jemalloc", {})
    if not env:
        pytest.skip("no libjemalloc.so.2 here: `make install` unpacks it into .tools/lib")
    freed, lowest = rss_after_freeing_small_objects(env, within_s=60)  # about 1 s alone
    assert lowest < freed / 2, f"RSS {freed} MB after freeing, {lowest} MB at the lowest"


def allocator_of_each_process(monkeypatch: pytest.MonkeyPatch, **platform: str) -> dict[str, str | None]:
    """The library `gpulens up` preloads in each pipeline process (None: CPython's allocator)."""
    monkeypatch.delenv("LD_PRELOAD", raising=False)  # a user's choice would stand (tested below)
    monkeypatch.delenv("PYTHONMALLOC", raising=False)
    settings = GPULensSettings.model_validate({"platform": platform})
    return {name: spec.env.get("LD_PRELOAD") for name, spec in pipeline_specs(settings, None).items()}


def test_the_worker_sink_and_exporter_run_on_jemalloc_and_nothing_else_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    library = jemalloc_library()
    if library is None:
        pytest.skip("no libjemalloc.so.2 here: `make install` unpacks it into .tools/lib")
    preloaded = allocator_of_each_process(monkeypatch)
    assert {name for name, lib in preloaded.items() if lib == library} == {WORKER, SINK, EXPORTER}
    assert set(preloaded.values()) == {library, None}


def test_the_pipeline_runs_on_cpythons_allocator_when_told_to(monkeypatch: pytest.MonkeyPatch) -> None:
    assert set(allocator_of_each_process(monkeypatch, python_allocator="pymalloc").values()) == {None}


def test_a_library_the_user_preloads_stands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LD_PRELOAD", "libtheirs.so")
    settings = GPULensSettings()
    assert all("LD_PRELOAD" not in spec.env for spec in pipeline_specs(settings, None).values())


def test_library_pages_go_back_only_once_they_grew_past_the_working_set() -> None:
    # Looks a minute apart, in KB resident: the first look after a hand-back learns the working
    # set (what came back) and hands nothing back; then only growth past it by the slack does.
    policy = PageOutPolicy(slack_kb=100)
    looks = [(40, False), (400, True), (120, False), (150, False), (220, False), (221, True), (90, False)]
    assert [(kb, policy.due(kb)) for kb, _ in looks] == looks
