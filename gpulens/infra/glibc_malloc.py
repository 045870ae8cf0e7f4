"""glibc malloc bounds for the processes on glibc's allocator that free large blocks.

glibc maps a block of 128 KB or more on its own, but on freeing one it raises that bound to the
block's size (up to 32 MB) and the heap's trim bound to twice it: from then on blocks that size
come from the heap, whose top stays resident while any small block lives above them. Fixed
bounds (mallopt(3), by their environment names) map every block of 128 KB or more on its own and
unmap it when freed, and trim the heap past 128 KB free.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

FIXED_BOUNDS_ENV = MappingProxyType({"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"})
"""The environment that fixes glibc's mapping and trim bounds at 128 KB."""


def fixed_bounds_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The bounds of :data:`FIXED_BOUNDS_ENV` that ``environ`` does not set (a user's own stand)."""
    return {name: value for name, value in FIXED_BOUNDS_ENV.items() if name not in environ}
