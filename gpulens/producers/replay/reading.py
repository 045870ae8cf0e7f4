"""Reading trace CSV files (errors name the file, line and problem), and ending a replay."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from gpulens.producers.replay.exceptions import TraceError
from gpulens.schemas.model.ids import event_id
from gpulens.schemas.model.models import Watermark


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


def end_of_replay(cluster: str, source: str, at: datetime) -> Watermark:
    """The final watermark of a replay: stream processors close every open window on it."""
    return Watermark(
        event_id=event_id(cluster, source, "end", at.isoformat()),
        cluster=cluster,
        event_time=at,
        source=source,
        final=True,
    )
