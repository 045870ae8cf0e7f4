"""The long-running processes hand the heap memory they freed back to the system (glibc)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from gpulens.tuning import _glibc

# A process that fills its heap with ~400 MB of 1-2 KB objects, frees nine in ten (the tenth
# keeps every stretch of the heap in use, as a few live records do) and prints its RSS in MB
# until told to stop: once when freed, then whenever asked.
FREE_NINE_IN_TEN = """
import sys, time
from gpulens.tuning import hand_back_freed_memory
def rss():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS'):
            return int(line.split()[1]) // 1024
if sys.argv[1] == 'trim':
    assert hand_back_freed_memory(every_s=0.1, from_bytes=16 << 20)
held = [bytes(1024 + i % 1024) for i in range(300_000)]
kept = held[::10]
del held
print(rss(), flush=True)
for line in sys.stdin:
    print(rss(), flush=True)
"""


def rss_after_freeing(mode: str) -> tuple[int, int]:
    """The RSS (MB) right after freeing, and the lowest within 10 s after (less when it halved)."""
    command = [sys.executable, "-c", FREE_NINE_IN_TEN, mode]
    with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as process:
        assert process.stdin is not None and process.stdout is not None
        try:
            freed = lowest = int(process.stdout.readline())
            deadline = time.monotonic() + 10  # a trim every 0.1 s has had many chances by then
            while time.monotonic() < deadline and lowest >= freed / 2:
                time.sleep(0.2)
                process.stdin.write("\n")
                process.stdin.flush()
                lowest = min(lowest, int(process.stdout.readline()))
        finally:
            process.kill()
    return freed, lowest


pytestmark = pytest.mark.skipif(_glibc() is None, reason="malloc_trim is glibc's")


def test_freed_heap_memory_stays_with_the_process_unless_handed_back() -> None:
    freed, lowest = rss_after_freeing("none")
    assert lowest > freed * 0.8, f"RSS {freed} MB after freeing, {lowest} MB at the lowest"


def test_freed_heap_memory_is_handed_back_to_the_system() -> None:
    freed, lowest = rss_after_freeing("trim")
    assert lowest < freed / 2, f"RSS {freed} MB after freeing, {lowest} MB at the lowest"
