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


def pods_between(path: Path, start_s: int, end_s: int, into: Path, *, gone_within_s: int) -> Path:
    """The Alibaba v2023 pods created in ``[start_s, end_s)`` and deleted at most ``gone_within_s``
    after ``end_s``, their times moved back by ``start_s`` (the slice starts at second 0, as the
    trace does): a few hours of a busy day instead of the months a head of the file spans."""
    with path.open() as handle:
        header, *lines = handle.read().splitlines()
    names = header.split(",")
    kept = [header]
    for line in lines:
        row = dict(zip(names, line.split(","), strict=True))
        created, deleted = int(row["creation_time"]), row["deletion_time"]
        if start_s <= created < end_s and deleted and int(deleted) < end_s + gone_within_s:
            for column in ("creation_time", "deletion_time", "scheduled_time"):
                if row[column]:
                    row[column] = str(int(row[column]) - start_s)
            kept.append(",".join(row[n] for n in names))
    into.write_text("\n".join(kept) + "\n")
    return into
