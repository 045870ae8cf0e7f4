"""The ClickHouse HTTP interface on top of the embedded engine.

Speaks enough of ClickHouse's HTTP protocol for ``curl``, clickhouse-connect's HttpClient
and anything else that talks to a ClickHouse server: ``GET``/``POST`` with ``?query=``,
the query in the body, ``INSERT ... FORMAT X`` with the data in the body, ``database``,
``default_format``, ``param_*`` bind parameters, settings as URL parameters, and
compressed request bodies (``Content-Encoding`` lz4, zstd, gzip, deflate), the
``X-ClickHouse-Format`` / ``X-ClickHouse-Database`` / ``X-ClickHouse-Query-Id`` request
headers (winning over the URL parameters, as in ClickHouse), sessions (``session_id``,
``session_timeout``, ``session_check``, ``close_session``), and ``/ping``,
``/replicas_status`` and ``/play``. A compressed body may hold many frames
(clickhouse-connect writes one LZ4 frame per block): every frame is decoded, never only the
first.

URL settings belong to their request alone: a request without a session runs on a connection
of its own, opened for it and closed after it; a session's request runs on the session's
connection (see :mod:`gpulens.infra.clickhouse.sessions`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import re
import uuid
import zlib
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import cramjam
from aiohttp import web
from multidict import MultiMapping

from gpulens.infra.clickhouse.engine import Connection, EmbeddedEngine, EngineError, Outcome
from gpulens.infra.clickhouse.sessions import DEFAULT_LIMIT, Session, Sessions

log = logging.getLogger(__name__)

ENGINE = web.AppKey("engine", EmbeddedEngine)
EXECUTOR = web.AppKey("executor", ThreadPoolExecutor)
SESSIONS = web.AppKey("sessions", Sessions)
WORKERS = 4
"""Statements running at once (chDB runs statements of different connections in parallel)."""
EXPIRY_SWEEP_S = 5.0

# URL parameters that steer the HTTP exchange, not the query.
_TRANSPORT = {
    "query",
    "database",
    "default_format",
    "query_id",
    "session_id",
    "session_timeout",
    "session_check",
    "close_session",
    "stacktrace",
    "compress",
    "decompress",
    "enable_http_compression",
    "http_zlib_compression_level",
    "send_progress_in_http_headers",
    "http_headers_progress_interval_ms",
    "wait_end_of_query",
    "buffer_size",
    "client_protocol_version",
    "user",
    "password",
    "quota_key",
}
_INSERT = re.compile(r"^\s*INSERT\b", re.IGNORECASE)
_INSERT_WITH_FORMAT = re.compile(r"^\s*INSERT\b.*?\bFORMAT\s+\w+[ \t]*(\r?\n|$)", re.IGNORECASE | re.DOTALL)
_HTTP_STATUS = {
    60: 404,
    81: 404,
    115: 404,
    46: 404,
    47: 404,
    73: 404,
    62: 400,
    27: 400,
    36: 400,
    117: 400,
    243: 507,
}
"""ClickHouse's HTTP status per error code (its ``exceptionCodeToHTTPStatus``; a full disk is 507);
500 otherwise, READONLY (164) and the session errors included, as ClickHouse answers them."""
_OUTPUT_FORMAT = re.compile(r"\bFORMAT\s+(\w+)\s*(?:\bSETTINGS\b[^']*)?;?\s*$", re.IGNORECASE)
PLAY_PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>GPULens ClickHouse</title></head>
<body>
<h1>GPULens ClickHouse (chDB)</h1>
<form id="f"><textarea id="q" rows="8" cols="100">SELECT version()</textarea><br>
<button>Run</button></form>
<pre id="out"></pre>
<script>
document.getElementById("f").onsubmit = async (event) => {
  event.preventDefault();
  const response = await fetch("/?default_format=PrettyCompactMonoBlock", {
    method: "POST", body: document.getElementById("q").value});
  document.getElementById("out").textContent = await response.text();
};
</script>
</body></html>
"""

MAX_BODY = 4 * 1024**3


def decompress(body: bytes, encoding: str) -> bytes:
    """Decode a request body; every frame / member of a multi-frame body is decoded."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity", "none"):
        return body
    if encoding in ("lz4", "zstd"):  # LZ4 frames, zstd frames: every one of a concatenation
        codec = cramjam.lz4 if encoding == "lz4" else cramjam.zstd
        try:
            return bytes(codec.decompress(body))
        except cramjam.DecompressionError as err:
            raise EngineError(f"Code: 271. {err} in the request body (CANNOT_DECOMPRESS)") from err
    if encoding == "gzip":
        return gzip.decompress(body)
    if encoding == "deflate":
        return zlib.decompress(body)
    raise EngineError(f"Code: 9. Unsupported Content-Encoding {encoding!r}: use lz4, zstd, gzip or deflate")


def _split(request: web.Request, body: bytes) -> tuple[str, bytes | None]:
    """The statement and, for an INSERT with data, the data."""
    query = request.query.get("query", "")
    if query:
        if _INSERT.match(query) and _INSERT_WITH_FORMAT.match(query.rstrip() + "\n"):
            return query, body
        return (query + ("\n" + body.decode() if body else "")), None
    text_end = _INSERT_WITH_FORMAT.match(body[:65536].decode(errors="replace"))
    if text_end is not None:
        head = text_end.group(0).encode()
        return head.decode(), body[len(head) :]
    return body.decode(), None


def _headers(outcome: Outcome, query_id: str, fmt: str) -> dict[str, str]:
    summary = {
        "read_rows": str(outcome.rows_read),
        "read_bytes": str(outcome.bytes_read),
        "written_rows": str(outcome.rows_written),
        "written_bytes": str(outcome.bytes_written),
        "elapsed_ns": str(int(outcome.elapsed_s * 1e9)),
    }
    return {
        "X-ClickHouse-Query-Id": query_id,
        "X-ClickHouse-Format": fmt,
        "X-ClickHouse-Timezone": "UTC",
        "X-ClickHouse-Server-Display-Name": "gpulens-chdb",
        "X-ClickHouse-Summary": json.dumps(summary),
    }


@dataclass(frozen=True, slots=True)
class _Statement:
    """One request's statement with everything it runs under."""

    sql: str
    data: bytes | None
    fmt: str
    binds: dict[str, str]
    settings: dict[str, str]
    database: str | None

    @property
    def output_format(self) -> str:
        """The format the answer is in: the statement's own ``FORMAT`` clause, else ``fmt``."""
        if self.data is None and (match := _OUTPUT_FORMAT.search(self.sql)):
            return match.group(1)
        return self.fmt

    def run_on(self, connection: Connection) -> Outcome:
        if self.data is not None:
            return connection.insert(self.sql, self.data)
        return connection.execute(self.sql, fmt=self.fmt, params=self.binds)


def _run(app: web.Application, params: MultiMapping[str], statement: _Statement) -> Outcome:
    """Run ``statement`` in its session, or on a connection of its own (in a worker thread)."""
    session_id = params.get("session_id")
    if not session_id:
        return _on_own_connection(app[ENGINE], statement, seed=None)
    with app[SESSIONS].use(
        session_id,
        timeout=params.get("session_timeout"),
        check=params.get("session_check") == "1",
        close=params.get("close_session", "0").lower() in ("1", "true"),
    ) as session:
        if statement.settings.get("readonly", "0") != "0":
            # ClickHouse never lowers readonly in the session that raised it, so a read-only
            # request of a session runs on a copy of the session (see sessions.py).
            return _on_own_connection(app[ENGINE], statement, seed=session)
        session.enter(statement.settings, statement.database)
        return statement.run_on(session.connection)


def _on_own_connection(engine: EmbeddedEngine, statement: _Statement, *, seed: Session | None) -> Outcome:
    """Run ``statement`` on a connection opened for it (set up as ``seed`` stands) and closed after it."""
    connection = engine.connect()
    try:
        if seed is not None:
            seed.copy_to(connection)
        if statement.database:
            connection.use(statement.database)
        connection.apply(statement.settings)
        return statement.run_on(connection)
    finally:
        connection.close()


async def handle(request: web.Request) -> web.StreamResponse:
    """Run the request's statement; ClickHouse's status codes and error bodies on failure."""
    raw = await request.read() if request.can_read_body else b""
    if request.method == "GET" and not raw and "query" not in request.query:
        return web.Response(text="Ok.\n")
    params = request.query
    headers = request.headers
    query_id = params.get("query_id") or headers.get("X-ClickHouse-Query-Id") or str(uuid.uuid4())
    fmt = headers.get("X-ClickHouse-Format") or params.get("default_format") or "TabSeparated"
    database = headers.get("X-ClickHouse-Database") or params.get("database") or None
    settings = {k: v for k, v in params.items() if k not in _TRANSPORT and not k.startswith("param_")}
    binds = {k[len("param_") :]: v for k, v in params.items() if k.startswith("param_")}
    try:
        sql, data = _split(request, decompress(raw, headers.get("Content-Encoding", "")))
        statement = _Statement(sql, data, fmt, binds, settings, database)
        outcome = await asyncio.get_running_loop().run_in_executor(
            request.app[EXECUTOR], _run, request.app, params, statement
        )
    except EngineError as err:
        log.info("query failed (%s): %s", query_id, str(err).splitlines()[0][:300])
        return _error(err.code, str(err), query_id)
    except UnicodeDecodeError as err:
        return _error(62, f"Code: 62. DB::Exception: query is not UTF-8: {err}. (SYNTAX_ERROR)", query_id)
    except Exception as err:  # a bug here: still ClickHouse's error format, never a bare 500
        log.exception("query failed (%s) inside the endpoint", query_id)
        return _error(
            1001, f"Code: 1001. DB::Exception: {type(err).__name__}: {err}. (STD_EXCEPTION)", query_id
        )
    return web.Response(body=outcome.body, headers=_headers(outcome, query_id, statement.output_format))


def _error(code: int, text: str, query_id: str) -> web.Response:
    """ClickHouse's HTTP error: its status for the code, the text, X-ClickHouse-Exception-Code."""
    return web.Response(
        text=text + "\n",
        status=_HTTP_STATUS.get(code, 500),
        headers={"X-ClickHouse-Exception-Code": str(code), "X-ClickHouse-Query-Id": query_id},
    )


async def ok(_request: web.Request) -> web.Response:
    """``/ping`` and ``/replicas_status``: this single, unreplicated engine is always in sync."""
    return web.Response(text="Ok.\n")


async def play(_request: web.Request) -> web.Response:
    """``/play``: a page to type a query into, as ClickHouse serves one."""
    return web.Response(text=PLAY_PAGE, content_type="text/html")


async def _expire_sessions(app: web.Application) -> AsyncIterator[None]:
    """End idle sessions in the background too, so an abandoned one frees its connection."""

    async def sweep() -> None:
        while True:
            await asyncio.sleep(EXPIRY_SWEEP_S)
            await asyncio.get_running_loop().run_in_executor(app[EXECUTOR], app[SESSIONS].expire)

    task = asyncio.create_task(sweep())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    app[EXECUTOR].shutdown(wait=True)
    app[SESSIONS].close()


def build_app(engine: EmbeddedEngine, *, max_sessions: int = DEFAULT_LIMIT) -> web.Application:
    """The endpoint's aiohttp application; at most ``max_sessions`` sessions at once."""
    # aiohttp would decode gzip/deflate/zstd bodies itself but not lz4; decoding all of them
    # in one place keeps the multi-frame rule in one place too.
    app = web.Application(client_max_size=MAX_BODY, handler_args={"auto_decompress": False})
    app[ENGINE] = engine
    app[EXECUTOR] = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="chdb")
    app[SESSIONS] = Sessions(engine, limit=max_sessions)
    app.cleanup_ctx.append(_expire_sessions)
    app.add_routes(
        [
            web.get("/ping", ok),
            web.get("/replicas_status", ok),
            web.get("/play", play),
            web.get("/", handle),
            web.post("/", handle),
        ]
    )
    return app


def serve(engine: EmbeddedEngine, *, host: str, port: int, max_sessions: int = DEFAULT_LIMIT) -> None:
    """Serve the engine over HTTP until SIGINT/SIGTERM, then release it."""
    try:
        app = build_app(engine, max_sessions=max_sessions)
        web.run_app(app, host=host, port=port, print=None, handle_signals=True)
    finally:
        engine.close()
