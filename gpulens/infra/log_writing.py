"""Bounded service logs: a writer that owns a service's log file and rotates it.

A service started with a :class:`LogRotation` writes its output into a pipe, and this module,
run as its own small process (``python -m gpulens.infra.log_writing PATH MAX_BYTES BACKUPS``), copies
the pipe into ``PATH``. Before a line would take the file past ``MAX_BYTES`` the file is
renamed ``PATH.1`` (older ones shift up to ``PATH.<BACKUPS>``, the oldest dropped) and a new
one is opened: the broker and the ClickHouse holder cannot be told to reopen their output,
and copying a file they still write (the supervisor's copytruncate) loses the lines written
in between; here nothing kept is lost. The writer runs in a session of its own, so signals
meant for its service never reach it: it exits when the service's end of the pipe closes
(the service and its children exited), after writing all they wrote.
"""

from __future__ import annotations

import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

__all__ = ["LogRotation", "shift_backups", "write_rotating"]


@dataclass(frozen=True, slots=True)
class LogRotation:
    """How large a service's log may grow, and how many old ones are kept beside it."""

    max_bytes: int = 50_000_000
    backups: int = 2

    def argv(self, path: Path) -> list[str]:
        """The writer's command line for ``path``."""
        return [sys.executable, "-m", __name__, str(path), str(self.max_bytes), str(self.backups)]


def shift_backups(path: Path, backups: int) -> None:
    """Make room for a new ``PATH.1``: ``PATH.n`` becomes ``PATH.n+1`` up to ``PATH.<backups>``."""
    for n in range(backups - 1, 0, -1):
        older = path.with_name(f"{path.name}.{n}")
        if older.exists():
            older.replace(path.with_name(f"{path.name}.{n + 1}"))


def write_rotating(source: BinaryIO, path: Path, rotation: LogRotation) -> None:
    """Copy ``source``'s lines into ``path`` until its end, rotating by ``rotation``."""
    out = path.open("ab", buffering=0)  # unbuffered: a service that fails to start is read at once
    size = out.tell()
    try:
        for line in source:
            if size and size + len(line) > rotation.max_bytes:
                out.close()
                if rotation.backups > 0:
                    shift_backups(path, rotation.backups)
                    path.replace(path.with_name(f"{path.name}.1"))
                    out = path.open("ab", buffering=0)
                else:
                    out = path.open("wb", buffering=0)
                size = 0
            out.write(line)
            size += len(line)
    finally:
        out.close()


def main(argv: list[str]) -> None:
    path, max_bytes, backups = Path(argv[0]), int(argv[1]), int(argv[2])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C ends the service; its last words still come
    write_rotating(sys.stdin.buffer, path, LogRotation(max_bytes, backups))


if __name__ == "__main__":
    main(sys.argv[1:])
