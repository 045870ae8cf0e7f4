"""The embedded ClickHouse engine (chDB) held by one process, run one statement at a time.

chDB allows one engine per data path per process, so exactly one process (the holder)
opens it; everyone else reaches it through the HTTP endpoint. Statements run on one
thread: per-request settings and the current database are session state of the single
connection, applied before each statement and undone after.
"""

from __future__ import annotations

import errno
import re
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

import chdb

from schemas.exceptions import GPULensError

_CODE = re.compile(r"Code:\s*(\d+)")
_SETTING_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class EngineError(GPULensError):
    """ClickHouse refused a statement; ``code`` is ClickHouse's error code (0 when unknown)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        match = _CODE.search(message)
        self.code = int(match.group(1)) if match else 0


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a statement returned."""

    body: bytes
    rows_read: int = 0
    bytes_read: int = 0
    rows_written: int = 0
    bytes_written: int = 0
    elapsed_s: float = 0.0


@dataclass
class _Session:
    database: str = "default"
    originals: dict[str, str] = field(default_factory=dict)
    """Settings a request changed: name -> value before the first change."""


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class EmbeddedEngine:
    """A chDB engine on ``path``; every method is thread-safe (calls are serialized)."""

    def __init__(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._spool = path / "tmp-inserts"
        self._spool.mkdir(exist_ok=True)
        self._lock = threading.Lock()
        try:
            self._conn = chdb.connect(str(path))
        except Exception as err:
            raise EngineError(
                f"cannot open the ClickHouse engine at {path}: {err} "
                "(only one process may hold it; is another gpulens holder running?)"
            ) from err
        self._session = _Session()

    def close(self) -> None:
        """Release the engine (the data stays on disk)."""
        with self._lock:
            self._conn.close()

    def execute(
        self,
        sql: str,
        *,
        fmt: str = "TabSeparated",
        params: dict[str, str] | None = None,
        settings: dict[str, str] | None = None,
        database: str | None = None,
    ) -> Outcome:
        """Run one statement; an embedded ``FORMAT`` clause wins over ``fmt``."""
        with self._lock:
            self._prepare(settings or {}, database)
            return self._run(sql, fmt, params or {})

    def insert(
        self,
        statement: str,
        data: bytes,
        *,
        settings: dict[str, str] | None = None,
        database: str | None = None,
    ) -> Outcome:
        """Run ``INSERT ... FORMAT X`` with ``data`` as its input (the bytes of format X)."""
        with self._lock:
            self._prepare(settings or {}, database)
            with tempfile.NamedTemporaryFile(dir=self._spool, suffix=".insert") as tmp:
                try:
                    tmp.write(data)
                    tmp.flush()
                except OSError as err:
                    raise _write_error(err, f"cannot spool {len(data):,} bytes of insert data") from err
                return self._run(_with_infile(statement, tmp.name), "TabSeparated", {})

    # --- internals (lock held) -------------------------------------------------------------------

    def _run(self, sql: str, fmt: str, params: dict[str, str]) -> Outcome:
        try:
            result = self._conn.query(sql, fmt, params=params)
        except Exception as err:  # chdb raises ChdbError / RuntimeError with ClickHouse's text
            raise EngineError(str(err).strip()) from err
        return Outcome(
            body=result.bytes() or b"",
            rows_read=result.rows_read(),
            bytes_read=result.bytes_read(),
            rows_written=result.rows_written(),
            bytes_written=result.bytes_written(),
            elapsed_s=result.elapsed(),
        )

    def _prepare(self, settings: dict[str, str], database: str | None) -> None:
        session = self._session
        wanted_db = database or "default"
        if wanted_db != session.database:
            self._run(f"USE `{wanted_db.replace('`', '')}`", "TabSeparated", {})
            session.database = wanted_db
        for name in list(session.originals):
            if name not in settings:
                self._set(name, session.originals.pop(name))
        for name, value in settings.items():
            if not _SETTING_NAME.match(name):
                raise EngineError(f"Code: 115. invalid setting name {name!r} (UNKNOWN_SETTING)")
            if name not in session.originals:
                session.originals[name] = self._current(name)
            self._set(name, value)

    def _current(self, name: str) -> str:
        body = self._run(
            f"SELECT value FROM system.settings WHERE name = {_quote(name)}", "TabSeparatedRaw", {}
        ).body
        if not body:
            raise EngineError(f"Code: 115. Unknown setting {name} (UNKNOWN_SETTING)")
        return body.decode().rstrip("\n")

    def _set(self, name: str, value: str) -> None:
        self._run(f"SET {name} = {_quote(value)}", "TabSeparated", {})


def _write_error(err: OSError, what: str) -> EngineError:
    """ClickHouse's error for a failed write: NOT_ENOUGH_SPACE (243) for a full disk or quota,
    CANNOT_WRITE_TO_FILE_DESCRIPTOR (75) otherwise."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return EngineError(f"Code: 243. DB::Exception: {what}: {err.strerror}. (NOT_ENOUGH_SPACE)")
    return EngineError(f"Code: 75. DB::Exception: {what}: {err}. (CANNOT_WRITE_TO_FILE_DESCRIPTOR)")


_FORMAT = re.compile(r"\bFORMAT\s+\w+\s*$", re.IGNORECASE)
_SETTINGS = re.compile(r"\bSETTINGS\b", re.IGNORECASE)


def _with_infile(statement: str, path: str) -> str:
    """``INSERT INTO t (c) [SETTINGS ...] FORMAT X`` -> ``... FROM INFILE 'path' [SETTINGS ...] FORMAT X``."""
    statement = statement.strip().rstrip(";")
    fmt = _FORMAT.search(statement)
    if fmt is None:
        raise EngineError(
            f"Code: 62. an INSERT with data needs a FORMAT clause: {statement[:200]} (SYNTAX_ERROR)"
        )
    head = statement[: fmt.start()]
    settings = _SETTINGS.search(head)
    cut = settings.start() if settings else len(head)
    return f"{head[:cut].rstrip()} FROM INFILE {_quote(path)} {head[cut:].strip()} {fmt.group(0)}"
