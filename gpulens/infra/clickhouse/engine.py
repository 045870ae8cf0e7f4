"""The embedded ClickHouse engine (chDB) held by one process, and its connections.

chDB allows one engine per data path per process, so exactly one process (the holder)
opens it; everyone else reaches it through the HTTP endpoint. Inside the holder every
request or session works on a :class:`Connection` of its own: chDB keeps settings, the
current database and temporary tables per connection, so a setting one client asks for
(``readonly=1`` included) can never reach another, and statements on different
connections run in parallel.
"""

from __future__ import annotations

import errno
import importlib.util
import re
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import chdb
from chdb.state.sqlitelike import Connection as ChdbConnection

from gpulens.schemas.model.exceptions import GPULensError

_NATIVE = importlib.util.find_spec("chdb._chdb")
LIBRARY = Path(_NATIVE.origin) if _NATIVE is not None and _NATIVE.origin else None
"""chDB's native library (529 MB), whose pages the holder hands back where unused
(:func:`gpulens.tuning.hand_back_library_pages`); None if chDB's layout changed."""

MERGE_NICE = 19
"""The nice value ClickHouse gives the threads running merges and mutations (its server setting
``os_threads_nice_value_merge_mutate``): background work, 15 % of a core on average and 40-60 %
at times at 100,000 GPUs, that yields to inserts and queries, the samples' path."""

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


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class EmbeddedEngine:
    """A chDB engine on ``path``: one connection keeps it open, :meth:`connect` hands out more."""

    def __init__(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._spool = path / "tmp-inserts"
        self._spool.mkdir(exist_ok=True)
        try:
            # Server settings are the engine's start-up arguments, given to its first connection.
            self._keeper = chdb.connect(f"{path}?os_threads_nice_value_merge_mutate={MERGE_NICE}")
        except Exception as err:
            raise EngineError(
                f"cannot open the ClickHouse engine at {path}: {err} "
                "(only one process may hold it; is another gpulens holder running?)"
            ) from err

    def connect(self) -> Connection:
        """A new connection: default settings, database ``default``, no temporary tables."""
        return Connection(chdb.connect(str(self.path)), self._spool)

    def close(self) -> None:
        """Release the engine (the data stays on disk); chDB stops it with its last connection."""
        self._keeper.close()


class Connection:
    """One ClickHouse session inside the engine; one statement at a time (calls are serialized)."""

    def __init__(self, raw: ChdbConnection, spool: Path) -> None:
        self._raw = raw
        self._spool = spool
        self._lock = threading.Lock()

    def close(self) -> None:
        """End the session: its temporary tables go with it."""
        with self._lock:
            self._raw.close()

    def execute(
        self, sql: str, *, fmt: str = "TabSeparated", params: dict[str, str] | None = None
    ) -> Outcome:
        """Run one statement; an embedded ``FORMAT`` clause wins over ``fmt``."""
        with self._lock:
            return self._run(sql, fmt, params or {})

    def insert(self, statement: str, data: bytes) -> Outcome:
        """Run ``INSERT ... FORMAT X`` with ``data`` as its input (the bytes of format X)."""
        with self._lock, tempfile.NamedTemporaryFile(dir=self._spool, suffix=".insert") as tmp:
            try:
                tmp.write(data)
                tmp.flush()
            except OSError as err:
                raise _write_error(err, f"cannot spool {len(data):,} bytes of insert data") from err
            return self._run(_with_infile(statement, tmp.name), "TabSeparated", {})

    def use(self, database: str) -> None:
        """Make ``database`` this session's current database."""
        self.execute(f"USE `{database.replace('`', '')}`")

    def apply(self, settings: dict[str, str]) -> None:
        """Change settings in one ``SET`` as ClickHouse applies a request's URL settings: every
        change is checked against the settings before any of them (so ``readonly=1`` beside
        other settings works), and none is made when one is refused."""
        if not settings:
            return
        for name in settings:
            if not _SETTING_NAME.match(name):
                raise EngineError(f"Code: 115. invalid setting name {name!r} (UNKNOWN_SETTING)")
        self.execute("SET " + ", ".join(f"{name} = {_quote(value)}" for name, value in settings.items()))

    def values(self, names: list[str]) -> dict[str, str]:
        """The current values of settings ``names``; an unknown name is ClickHouse's UNKNOWN_SETTING."""
        listed = ", ".join(_quote(name) for name in names)
        body = self.execute(
            f"SELECT name, value FROM system.settings WHERE name IN ({listed})", fmt="TabSeparatedRaw"
        ).body
        found = dict(line.split("\t", 1) for line in body.decode().splitlines())
        for name in names:
            if name not in found:
                raise EngineError(f"Code: 115. DB::Exception: Unknown setting '{name}'. (UNKNOWN_SETTING)")
        return found

    def _run(self, sql: str, fmt: str, params: dict[str, str]) -> Outcome:
        try:
            result = self._raw.query(sql, fmt, params=params)
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
