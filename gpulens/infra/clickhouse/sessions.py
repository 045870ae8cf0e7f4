"""ClickHouse HTTP sessions (``session_id``) on the embedded engine, as ClickHouse keeps them.

A session owns one engine :class:`~gpulens.infra.clickhouse.engine.Connection`, so what it
``SET``s, the database it ``USE``s and the temporary tables it creates are its own. It lives
``session_timeout`` seconds (default 60, at most 3600; the value of the request that created
it, as in ClickHouse) after its last request ends, serves one request at a time (a concurrent
one gets SESSION_IS_LOCKED), and at most ``limit`` of them exist at once (a new one past that
gets USER_SESSION_LIMIT_EXCEEDED once expired sessions are gone).

Settings a request carries in its URL are that request's, not the session's. chDB offers no
per-statement settings besides a statement's own ``SETTINGS`` clause (which means storage
settings in a ``CREATE TABLE``), so a session applies them to its own connection and takes
them back at its next request that does not carry them. They never leave the session; a
client sending the same settings on every request (clickhouse-connect does) pays nothing
after the first. ``readonly`` is the exception: ClickHouse refuses to lower it in the
session that raised it, so a request asking for it runs on a fresh connection set up as the
session stands (:meth:`Session.copy_to`: its database and its own settings). What that
request cannot see are the session's temporary tables; with ``readonly=1`` no temporary
table can be created either, so a client that is read-only on every request loses nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from gpulens.infra.clickhouse.engine import Connection, EmbeddedEngine, EngineError

DEFAULT_TIMEOUT_S = 60
MAX_TIMEOUT_S = 3600
DEFAULT_LIMIT = 1000


@dataclass
class Session:
    """One named session: its connection and the request settings now in force on it."""

    connection: Connection
    timeout_s: int
    idle_since: float = field(default_factory=time.monotonic)
    busy: bool = False
    overridden: dict[str, str] = field(default_factory=dict)
    """Setting -> the session's own value before a request's URL setting replaced it."""
    applied: dict[str, str] = field(default_factory=dict)
    """Setting -> the request value now in force."""

    def enter(self, settings: dict[str, str], database: str | None) -> None:
        """Make ``settings`` (and ``database``) those of the coming request, in one ``SET``."""
        if database:
            self.connection.use(database)
        changes = {name: self.overridden[name] for name in self.overridden if name not in settings}
        fresh = [name for name in settings if name not in self.overridden]
        own = self.connection.values(fresh) if fresh else {}
        changes |= {name: value for name, value in settings.items() if self.applied.get(name) != value}
        self.connection.apply(changes)
        for name in list(self.overridden):
            if name not in settings:
                del self.overridden[name]
                del self.applied[name]
        self.overridden |= own
        self.applied |= settings

    def copy_to(self, connection: Connection) -> None:
        """Set ``connection`` up as this session stands: its current database and its own
        settings (those a ``SET`` in the session changed, not a request's URL settings)."""
        body = self.connection.execute(
            "SELECT currentDatabase(), name, value FROM system.settings "
            "WHERE changed AND name != 'database' UNION ALL SELECT currentDatabase(), '', ''",
            fmt="TabSeparatedRaw",
        ).body
        rows = [line.split("\t") for line in body.decode().splitlines()]
        own = {name: value for _, name, value in rows if name} | self.overridden
        connection.use(rows[0][0])
        connection.apply(own)


class Sessions:
    """The named sessions of one endpoint; thread-safe."""

    def __init__(self, engine: EmbeddedEngine, *, limit: int = DEFAULT_LIMIT) -> None:
        self._engine = engine
        self._limit = limit
        self._lock = threading.Lock()
        self._sessions: dict[str, Session] = {}

    @contextmanager
    def use(self, session_id: str, *, timeout: str | None, check: bool, close: bool) -> Iterator[Session]:
        """The session ``session_id`` for one request: created unless ``check``, expired sessions
        swept first; ``close`` ends it after the request. ``timeout`` is checked on every
        request but only the creating request's value counts (ClickHouse keeps it so too)."""
        timeout_s = _timeout(timeout)
        session = self._acquire(session_id, timeout_s, check)
        try:
            yield session
        finally:
            self._release(session_id, session, close)

    def expire(self) -> int:
        """End the sessions idle longer than their timeout; how many ended."""
        with self._lock:
            now = time.monotonic()
            gone = [
                sid for sid, s in self._sessions.items() if not s.busy and now - s.idle_since > s.timeout_s
            ]
            ended = [self._sessions.pop(sid) for sid in gone]
        for session in ended:
            session.connection.close()
        return len(ended)

    def close(self) -> None:
        """End every session."""
        with self._lock:
            ended = list(self._sessions.values())
            self._sessions.clear()
        for session in ended:
            session.connection.close()

    def _acquire(self, session_id: str, timeout_s: int, check: bool) -> Session:
        self.expire()
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                if check:
                    raise EngineError(
                        f"Code: 372. DB::Exception: Session {session_id} not found. (SESSION_NOT_FOUND)"
                    )
                if len(self._sessions) >= self._limit:
                    raise EngineError(
                        f"Code: 700. DB::Exception: Too many sessions: the limit of {self._limit} "
                        "sessions is reached; end one (close_session=1) or wait for one to expire. "
                        "(USER_SESSION_LIMIT_EXCEEDED)"
                    )
                session = Session(connection=self._engine.connect(), timeout_s=timeout_s)
                self._sessions[session_id] = session
            elif session.busy:
                raise EngineError(
                    f"Code: 373. DB::Exception: Session {session_id} is locked by a concurrent client. "
                    "(SESSION_IS_LOCKED)"
                )
            session.busy = True
            return session

    def _release(self, session_id: str, session: Session, close: bool) -> None:
        with self._lock:
            session.busy = False
            session.idle_since = time.monotonic()
            if close and self._sessions.get(session_id) is session:
                del self._sessions[session_id]
            else:
                return
        session.connection.close()


def _timeout(value: str | None) -> int:
    """``session_timeout`` in seconds, checked as ClickHouse checks it."""
    if value is None:
        return DEFAULT_TIMEOUT_S
    if not value.isdigit():
        raise EngineError(
            f"Code: 374. DB::Exception: Invalid session timeout: '{value}'. (INVALID_SESSION_TIMEOUT)"
        )
    if int(value) > MAX_TIMEOUT_S:
        raise EngineError(
            f"Code: 374. DB::Exception: Session timeout '{value}' is larger than max_session_timeout: "
            f"{MAX_TIMEOUT_S}. (INVALID_SESSION_TIMEOUT)"
        )
    return int(value)
