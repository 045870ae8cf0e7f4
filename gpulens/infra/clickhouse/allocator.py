"""The allocator settings of the process that holds the embedded engine.

chDB brings ClickHouse's own jemalloc (symbols prefixed ``je_``, so it reads ``JE_MALLOC_CONF``,
not ``MALLOC_CONF``). ClickHouse builds it to keep freed pages for 5 s before handing them
back (``dirty_decay_ms:5000``): every insert batch of the sink parses and writes a part, and the
holder's RSS rode on what the last few batches freed. Sinking a 2,500-node backlog (600,000
samples, 100,000-row batches), its peak was 436-494 MB with 5 s (six runs), 386-389 MB with
500 ms and 344-373 MB with 0, at 5.3-6.0, 5.5-5.8 and 7.6-7.9 CPU-s: 500 ms keeps the CPU and
takes the peak down by about 70 MB.

The holder's Python (the HTTP endpoint: every insert body read whole, several MB at 100,000
GPUs) runs on glibc's allocator, whose own bounds let those bodies grow the heap for good: its
heap was 62 MB all through a 100,000-GPU run, 14 MB with glibc's bounds fixed
(:mod:`gpulens.infra.glibc_malloc`), where a probe's bodies of 3-12 MB left it at 29 MB with
glibc's own.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpulens.infra.glibc_malloc import fixed_bounds_env

ENGINE_MALLOC_CONF = "dirty_decay_ms:500"
"""jemalloc options of the holder (jemalloc(3) ``opt.*`` names)."""


def engine_env(environ: Mapping[str, str]) -> dict[str, str]:
    """What the holder's environment adds to ``environ``: glibc's malloc bounds fixed, each one
    ``environ`` does not set, and :data:`ENGINE_MALLOC_CONF`, unless the user set
    ``JE_MALLOC_CONF`` (then theirs stands alone: jemalloc reads one string)."""
    env = fixed_bounds_env(environ)
    if "JE_MALLOC_CONF" not in environ:
        env["JE_MALLOC_CONF"] = ENGINE_MALLOC_CONF
    return env
