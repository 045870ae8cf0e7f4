"""Slices of the public traces, for tests whose point holds on part of a trace.

A test that proves exactness end to end replays a whole trace once; a test that proves a
property of the process (a kill, a restart, a shard) replays the head of it, and its oracle
reads the same slice, so the comparison stays as strict and each later worker of a new group
has less of it to read again.
"""

from __future__ import annotations

from pathlib import Path


def head_of(path: Path, rows: int, into: Path) -> Path:
    """The first ``rows`` data rows of a CSV, written to ``into`` (header included)."""
    with path.open() as handle:
        lines = [next(handle) for _ in range(rows + 1)]
    into.write_text("".join(lines))
    return into
