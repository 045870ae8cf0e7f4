"""The ClickHouse HTTP interface on top of the embedded engine.

Speaks enough of ClickHouse's HTTP protocol for ``curl``, clickhouse-connect's HttpClient
and anything else that talks to a ClickHouse server: ``GET``/``POST`` with ``?query=``,
the query in the body, ``INSERT ... FORMAT X`` with the data in the body, ``database``,
``default_format``, ``param_*`` bind parameters, settings as URL parameters, and
compressed request bodies (``Content-Encoding`` lz4, zstd, gzip, deflate). A compressed
body may hold many frames (clickhouse-connect writes one LZ4 frame per block): every frame
is decoded, never only the first.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import re
import uuid
import zlib
from concurrent.futures import ThreadPoolExecutor

import lz4.frame
import zstandard
from aiohttp import web

from consumers.clickhouse.engine import EmbeddedEngine, EngineError, Outcome

log = logging.getLogger(__name__)

ENGINE = web.AppKey("engine", EmbeddedEngine)
EXECUTOR = web.AppKey("executor", ThreadPoolExecutor)

# URL parameters that steer the HTTP exchange, not the query.
_TRANSPORT = {
    "query",
    "database",
    "default_format",
    "query_id",
    "session_id",
    "session_timeout",
    "session_check",
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
_HTTP_STATUS = {60: 404, 81: 404, 62: 400, 27: 400, 115: 400, 36: 400, 47: 400, 46: 400, 117: 400, 243: 507}
"""ClickHouse's HTTP status per error code (as the server answers: a full disk is 507); 500 otherwise."""

MAX_BODY = 4 * 1024**3


def decompress(body: bytes, encoding: str) -> bytes:
    """Decode a request body; every frame / member of a multi-frame body is decoded."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity", "none"):
        return body
    if encoding == "lz4":
        return _lz4_frames(body)
    if encoding == "zstd":
        reader = zstandard.ZstdDecompressor().stream_reader(body, read_across_frames=True)
        return reader.read()
    if encoding == "gzip":
        return gzip.decompress(body)
    if encoding == "deflate":
        return zlib.decompress(body)
    raise EngineError(f"Code: 9. Unsupported Content-Encoding {encoding!r}: use lz4, zstd, gzip or deflate")


def _lz4_frames(body: bytes) -> bytes:
    parts: list[bytes] = []
    rest = body
    while rest:
        decoder = lz4.frame.LZ4FrameDecompressor()
        parts.append(decoder.decompress(rest))
        if not decoder.eof:
            raise EngineError("Code: 271. truncated LZ4 frame in the request body (CANNOT_DECOMPRESS)")
        rest = decoder.unused_data
    return b"".join(parts)


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


async def handle(request: web.Request) -> web.StreamResponse:
    """Run the request's statement; ClickHouse's status codes and error bodies on failure."""
    raw = await request.read() if request.can_read_body else b""
    if request.method == "GET" and not raw and "query" not in request.query:
        return web.Response(text="Ok.\n")
    params = request.query
    query_id = params.get("query_id") or str(uuid.uuid4())
    fmt = params.get("default_format", "TabSeparated")
    settings = {k: v for k, v in params.items() if k not in _TRANSPORT and not k.startswith("param_")}
    binds = {k[len("param_") :]: v for k, v in params.items() if k.startswith("param_")}
    engine = request.app[ENGINE]
    loop = asyncio.get_running_loop()
    try:
        body = decompress(raw, request.headers.get("Content-Encoding", ""))
        statement, data = _split(request, body)
        if data is not None:
            outcome = await loop.run_in_executor(
                request.app[EXECUTOR],
                lambda: engine.insert(statement, data, settings=settings, database=params.get("database")),
            )
        else:
            outcome = await loop.run_in_executor(
                request.app[EXECUTOR],
                lambda: engine.execute(
                    statement, fmt=fmt, params=binds, settings=settings, database=params.get("database")
                ),
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
    return web.Response(body=outcome.body, headers=_headers(outcome, query_id, fmt))


def _error(code: int, text: str, query_id: str) -> web.Response:
    """ClickHouse's HTTP error: its status for the code, the text, X-ClickHouse-Exception-Code."""
    return web.Response(
        text=text + "\n",
        status=_HTTP_STATUS.get(code, 500),
        headers={"X-ClickHouse-Exception-Code": str(code), "X-ClickHouse-Query-Id": query_id},
    )


async def ping(_request: web.Request) -> web.Response:
    return web.Response(text="Ok.\n")


def build_app(engine: EmbeddedEngine) -> web.Application:
    """The endpoint's aiohttp application (one engine thread: chDB runs one statement at a time)."""
    # aiohttp would decode gzip/deflate/zstd bodies itself but not lz4; decoding all of them
    # in one place keeps the multi-frame rule in one place too.
    app = web.Application(client_max_size=MAX_BODY, handler_args={"auto_decompress": False})
    app[ENGINE] = engine
    app[EXECUTOR] = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chdb")

    async def _shutdown(app: web.Application) -> None:
        app[EXECUTOR].shutdown(wait=True)

    app.on_cleanup.append(_shutdown)
    app.add_routes([web.get("/ping", ping), web.get("/", handle), web.post("/", handle)])
    return app


def serve(engine: EmbeddedEngine, *, host: str, port: int) -> None:
    """Serve the engine over HTTP until SIGINT/SIGTERM, then release it."""
    try:
        web.run_app(build_app(engine), host=host, port=port, print=None, handle_signals=True)
    finally:
        engine.close()
