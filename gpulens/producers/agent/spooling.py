"""A bounded on-disk spool for records the broker did not acknowledge (sqlite3, one file).

Records keep the sequence number the agent gave them when they were made, so the spool
hands them back in the order they were made, even when a record that failed late (after
a newer one was spooled) arrives later. Over the bound the oldest *droppable* records (GPU
samples) go first; inventory and container events are never dropped, even if that leaves
the spool above its bound.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gpulens.producers.agent.exceptions import SpoolError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    seq INTEGER PRIMARY KEY,
    topic TEXT NOT NULL,
    key BLOB,
    value BLOB NOT NULL,
    droppable INTEGER NOT NULL,
    size INTEGER NOT NULL
)
"""


@dataclass(frozen=True, slots=True)
class SpooledRecord:
    """One encoded record and its place in the agent's order."""

    seq: int
    topic: str
    key: bytes | None
    value: bytes
    droppable: bool

    @property
    def size(self) -> int:
        return len(self.value) + len(self.key or b"")


class Spool:
    """Records in ``directory/spool.sqlite3``, at most ``max_bytes`` of droppable ones."""

    def __init__(self, directory: Path, *, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(directory / "spool.sqlite3", isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(_SCHEMA)
            count, size, last = self._db.execute(
                "SELECT count(*), coalesce(sum(size), 0), coalesce(max(seq), 0) FROM records"
            ).fetchone()
        except sqlite3.Error as err:
            raise SpoolError(f"cannot open the spool in {directory}: {err}") from err
        self.count, self.bytes, self.last_seq = int(count), int(size), int(last)
        """Records, their bytes, and the highest sequence number ever spooled (survives restarts)."""

    @contextmanager
    def _writing(self, what: str) -> Iterator[sqlite3.Connection]:
        try:
            yield self._db
        except sqlite3.Error as err:
            raise SpoolError(f"spool {what}: {err}") from err

    def append(self, record: SpooledRecord) -> int:
        """Keep ``record``; then drop the oldest droppable records above the bound; how many went.

        A dropped record may be on its way to the broker already; if it arrives, so much the better.
        """
        with self._writing("append"):
            self._db.execute(
                "INSERT INTO records VALUES (?, ?, ?, ?, ?, ?)",
                (record.seq, record.topic, record.key, record.value, int(record.droppable), record.size),
            )
        self.count += 1
        self.bytes += record.size
        self.last_seq = max(self.last_seq, record.seq)
        dropped = 0
        while self.bytes > self.max_bytes:
            with self._writing("drop"):
                victim = self._db.execute(
                    "SELECT seq, size FROM records WHERE droppable = 1 ORDER BY seq LIMIT 1"
                ).fetchone()
                if victim is None:
                    break
                self._db.execute("DELETE FROM records WHERE seq = ?", (victim[0],))
            self.count -= 1
            self.bytes -= victim[1]
            dropped += 1
        return dropped

    def head(self, limit: int) -> list[SpooledRecord]:
        """The oldest ``limit`` records, oldest first."""
        with self._writing("read"):
            rows = self._db.execute(
                "SELECT seq, topic, key, value, droppable FROM records ORDER BY seq LIMIT ?", (limit,)
            ).fetchall()
        return [SpooledRecord(seq, topic, key, value, bool(drop)) for seq, topic, key, value, drop in rows]

    def remove(self, seq: int) -> None:
        """Forget a record the broker acknowledged (or that a drop already removed)."""
        with self._writing("remove"):
            row = self._db.execute("DELETE FROM records WHERE seq = ? RETURNING size", (seq,)).fetchone()
        if row is not None:
            self.count -= 1
            self.bytes -= row[0]

    def close(self) -> None:
        self._db.close()
