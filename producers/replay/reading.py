"""Reading trace CSV files with errors that name the file, the line and what is wrong."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

from producers.replay.exceptions import TraceError


def rows(path: Path, columns: set[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row) of a CSV file that must have ``columns``."""
    try:
        handle = path.open(newline="")
    except OSError as err:
        raise TraceError(f"cannot read {path}: {err.strerror}") from err
    with handle:
        reader = csv.DictReader(handle)
        missing = columns - set(reader.fieldnames or [])
        if missing:
            raise TraceError(f"{path}: missing columns {', '.join(sorted(missing))}")
        yield from enumerate(reader, start=2)


def number(path: Path, line: int, row: dict[str, str], column: str) -> float | None:
    """The number in ``column``; None when empty; :class:`TraceError` when not a number."""
    text = (row.get(column) or "").strip()
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        raise TraceError(f"{path}:{line}: {column} must be a number, got {text!r}") from None
