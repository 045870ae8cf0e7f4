"""The embedded engine's ClickHouse HTTP interface as third-party clients see it.

clickhouse-connect, clickhouse-sqlalchemy and plain HTTP (urllib) against the real endpoint
process; expectations are ClickHouse's documented behaviour (status codes, headers, session
rules), not our code's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlencode

import clickhouse_connect
import pytest
import sqlalchemy as sa
from clickhouse_connect.driver.exceptions import DatabaseError

from gpulens.consumers.clickhouse.client import get_client
from gpulens.consumers.clickhouse.migrating import migrate
from gpulens.infra.launching import port_open
from gpulens.platform import free_port

INSERTS = 40


@pytest.fixture
def endpoint(platform) -> str:
    return f"http://127.0.0.1:{platform.clickhouse.http_port}"


@pytest.fixture
def database(platform, unique) -> str:
    name = f"conf_{unique}"
    get_client(platform.clickhouse).command(f"CREATE DATABASE {name}")
    return name


def _client(platform, database: str | None = None, **settings: object):
    return clickhouse_connect.get_client(
        host="127.0.0.1", port=platform.clickhouse.http_port, database=database, settings=settings
    )


def _http(
    url: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict, bytes]:
    """Status, headers and body of one request; an error status is an answer, not an exception."""
    request = urllib.request.Request(url, data=body, headers=headers or {}, method="POST" if body else "GET")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def _lines(endpoint: str, database: str, query: str) -> list[str]:
    """The lines a query answers over plain HTTP."""
    status, _, body = _http(f"{endpoint}/?" + urlencode({"database": database, "query": query}))
    assert status == 200, body
    return body.decode().splitlines()


# --- settings belong to their request ------------------------------------------------------------


def test_a_readonly_client_is_refused_writes_while_another_client_inserts(platform, database) -> None:
    writer = _client(platform, database)
    writer.command("CREATE TABLE t (id UInt32) ENGINE = MergeTree ORDER BY id")
    reader = _client(platform, database, readonly=1)  # as BI tools connect
    start = threading.Barrier(2)
    written: list[int] = []

    def write() -> None:
        start.wait()
        for i in range(INSERTS):
            writer.insert("t", [[i]], column_names=["id"])
            written.append(i)

    thread = threading.Thread(target=write)
    thread.start()
    start.wait()
    refusals = []
    try:
        for i in range(INSERTS):  # interleaved with the writer's inserts
            with pytest.raises(DatabaseError) as caught:
                reader.insert("t", [[10_000 + i]], column_names=["id"])
            refusals.append(caught.value)
            assert reader.command("SELECT count() FROM t") <= INSERTS, "reads still work"
    finally:
        thread.join(timeout=60)

    assert written == list(range(INSERTS)), "every insert of the other client succeeded"
    assert all("code: 164" in str(err) and "READONLY" in str(err) for err in refusals)
    assert writer.query("SELECT count(), sum(id) FROM t").result_rows == [(INSERTS, sum(range(INSERTS)))]
    assert reader.command("SELECT getSetting('readonly')") == 1
    assert writer.command("SELECT getSetting('readonly')") == 0, "readonly never reached the engine"


def test_readonly_in_the_url_refuses_that_request_only_with_clickhouses_answer(endpoint, database) -> None:
    _http(f"{endpoint}/?database={database}", b"CREATE TABLE t (id UInt32) ENGINE = MergeTree ORDER BY id")

    status, headers, body = _http(f"{endpoint}/?database={database}&readonly=1", b"INSERT INTO t VALUES (1)")
    assert (status, headers["X-ClickHouse-Exception-Code"]) == (500, "164")  # ClickHouse: READONLY is a 500
    assert b"Code: 164" in body and b"READONLY" in body

    status, _, _ = _http(f"{endpoint}/?database={database}", b"INSERT INTO t VALUES (2)")
    assert status == 200, "the next request writes: readonly was that request's"
    query = urlencode({"database": database, "query": "SELECT sum(id) FROM t", "max_result_rows": "1"})
    assert _http(f"{endpoint}/?{query}")[::2] == (200, b"2\n"), "one row is within max_result_rows=1"
    status, headers, _ = _http(
        f"{endpoint}/?" + urlencode({"query": "SELECT number FROM numbers(10)", "max_result_rows": "1"})
    )
    assert (status, headers["X-ClickHouse-Exception-Code"]) == (500, "396"), "max_result_rows applies"
    assert _http(f"{endpoint}/?" + urlencode({"query": "SELECT count() FROM numbers(10)"}))[2] == b"10\n"


# --- sessions ------------------------------------------------------------------------------------


def test_two_sessions_keep_their_own_settings_and_temporary_tables(platform, endpoint) -> None:
    first, second = _client(platform), _client(platform)  # clickhouse-connect: a session per client
    first.command("SET max_threads = 3")
    second.command("SET max_threads = 5")
    for client, rows in ((first, 2), (second, 7)):
        client.command("CREATE TEMPORARY TABLE scratch (x UInt32)")
        client.command(f"INSERT INTO scratch SELECT number FROM numbers({rows})")

    assert (
        first.command("SELECT getSetting('max_threads')"),
        second.command("SELECT getSetting('max_threads')"),
    ) == (
        3,
        5,
    )
    assert (first.command("SELECT count() FROM scratch"), second.command("SELECT count() FROM scratch")) == (
        2,
        7,
    )
    status, headers, _ = _http(f"{endpoint}/?" + urlencode({"query": "SELECT count() FROM scratch"}))
    assert (status, headers["X-ClickHouse-Exception-Code"]) == (404, "60"), (
        "no session sees no temporary table"
    )
    no_session = _http(f"{endpoint}/?" + urlencode({"query": "SELECT getSetting('max_threads')"}))[2]
    assert int(no_session) not in (3, 5)
    assert first.command("SELECT getSetting('max_threads')", settings={"max_threads": 7}) == 7
    assert first.command("SELECT getSetting('max_threads')") == 3, (
        "a URL setting does not stay in the session"
    )
    assert first.command("SELECT getSetting('max_threads')", settings={"readonly": 2}) == 3, (
        "a read-only request of a session runs with the session's settings"
    )
    first.command("INSERT INTO scratch VALUES (1)")  # and the session can write after it
    assert first.command("SELECT count() FROM scratch") == 3


def test_a_session_expires_after_its_timeout_and_session_check_says_so(endpoint, unique) -> None:
    def ask(**params: str) -> tuple[int, dict, bytes]:
        return _http(f"{endpoint}/?" + urlencode({"session_id": f"s-{unique}", **params}), b"SELECT 1")

    assert ask(session_timeout="1")[0] == 200
    assert ask(session_timeout="1", session_check="1")[0] == 200, "the session exists"
    time.sleep(1.5)  # the clock passing the session's timeout is what is tested, not a wait for work
    answer = ask(session_check="1")
    assert answer[1]["X-ClickHouse-Exception-Code"] == "372" and b"SESSION_NOT_FOUND" in answer[2]
    status, headers, _ = ask(session_timeout="3601")
    assert (status, headers["X-ClickHouse-Exception-Code"]) == (500, "374"), "over max_session_timeout"


def test_a_session_serves_one_request_at_a_time(endpoint, unique) -> None:
    session = urlencode({"session_id": f"busy-{unique}"})
    running = f"SELECT sleepEachRow(0.1), '{unique}' FROM numbers(600) SETTINGS max_block_size = 1"
    seen_running = (
        f"SELECT count() FROM system.processes WHERE query LIKE concat('%sleepEach', 'Row%', '{unique}%')"
    )
    answers: list[tuple[int, dict, bytes]] = []
    thread = threading.Thread(
        target=lambda: answers.append(_http(f"{endpoint}/?{session}", running.encode()))
    )
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while _lines(endpoint, "default", seen_running) != ["1"]:
            assert time.monotonic() < deadline, "the long query never showed in system.processes"
        status, headers, body = _http(f"{endpoint}/?{session}", b"SELECT 1")
        assert (status, headers["X-ClickHouse-Exception-Code"]) == (
            500,
            "373",
        ) and b"SESSION_IS_LOCKED" in body
        assert _http(f"{endpoint}/?query=SELECT%201")[2] == b"1\n", "other requests go on meanwhile"
    finally:
        kill = f"KILL QUERY WHERE query LIKE concat('%sleepEach', 'Row%', '{unique}%') SYNC"
        _http(endpoint, kill.encode())
        thread.join(timeout=60)
    assert answers[0][1]["X-ClickHouse-Exception-Code"] == "394", "the long query was cancelled"
    assert _http(f"{endpoint}/?{session}", b"SELECT 1")[::2] == (200, b"1\n"), "free again"


def test_sessions_are_bounded_and_close_session_frees_one(tmp_path: Path, spawned) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULENS_")}
    env |= {
        "GPULENS_PLATFORM__STATE_DIR": str(tmp_path / "state"),
        "GPULENS_CLICKHOUSE__HTTP_PORT": str(port),
        "GPULENS_CLICKHOUSE__HTTP_MAX_SESSIONS": "2",
    }
    spawned.append(subprocess.Popen([sys.executable, "-m", "gpulens", "serve", "clickhouse"], env=env))
    deadline = time.monotonic() + 60
    while not port_open("127.0.0.1", port):
        assert time.monotonic() < deadline and spawned[0].poll() is None, "the endpoint did not start"

    def ask(session: str, **params: str) -> tuple[int, dict, bytes]:
        query = urlencode({"session_id": session, **params})
        return _http(f"http://127.0.0.1:{port}/?{query}", b"SELECT 1")

    assert ask("a")[0] == ask("b")[0] == 200
    status, headers, body = ask("c")
    assert (status, headers["X-ClickHouse-Exception-Code"]) == (500, "700") and b"USER_SESSION_LIMIT" in body
    assert ask("a")[0] == 200, "an existing session still answers"
    assert ask("a", close_session="1")[0] == 200
    assert ask("c")[0] == 200, "a closed session frees its place"
    assert _http(f"http://127.0.0.1:{port}/?query=SELECT%202")[2] == b"2\n", "requests without a session too"


# --- format and database headers -----------------------------------------------------------------


def test_the_format_and_database_headers_are_honoured(endpoint, database) -> None:
    _http(f"{endpoint}/?database={database}", b"CREATE TABLE t (id UInt32) ENGINE = MergeTree ORDER BY id")
    _http(f"{endpoint}/?database={database}", b"INSERT INTO t VALUES (1), (2)")
    query = b"SELECT currentDatabase() AS db, count() AS n FROM t"
    in_db = {"X-ClickHouse-Database": database}

    def ask(params: str, headers: dict[str, str], sql: bytes = query) -> tuple[str, bytes]:
        status, answer_headers, body = _http(f"{endpoint}/?{params}", sql, headers)
        assert status == 200, body
        return answer_headers["X-ClickHouse-Format"], body

    fmt, body = ask("", {"X-ClickHouse-Format": "JSONEachRow", **in_db})
    assert (fmt, json.loads(body)) == ("JSONEachRow", {"db": database, "n": 2})
    assert ask("default_format=CSV&database=default", in_db) == ("CSV", f'"{database}",2\n'.encode()), (
        "the database header wins over the parameter, as in ClickHouse"
    )
    fmt, body = ask("default_format=CSV", {"X-ClickHouse-Format": "JSONCompactEachRow", **in_db})
    assert (fmt, json.loads(body)) == ("JSONCompactEachRow", [database, 2]), "so does the format header"
    assert ask("default_format=CSV", in_db, query + b" FORMAT TSV") == ("TSV", f"{database}\t2\n".encode()), (
        "the statement's own FORMAT is the format named in the answer"
    )
    assert ask("", {}, b"SELECT 1") == ("TabSeparated", b"1\n")


def test_ping_replicas_status_and_play_answer(endpoint) -> None:
    assert _http(f"{endpoint}/ping")[::2] == (200, b"Ok.\n")
    assert _http(f"{endpoint}/replicas_status")[::2] == (200, b"Ok.\n")
    status, headers, body = _http(f"{endpoint}/play")
    assert status == 200 and headers["Content-Type"].startswith("text/html") and b"<textarea" in body


# --- clickhouse-sqlalchemy -----------------------------------------------------------------------


def test_clickhouse_sqlalchemy_reflects_a_gpulens_table_and_selects_from_it(
    platform, endpoint, unique
) -> None:
    settings = platform.clickhouse.model_copy(update={"database": f"sqla_{unique}"})
    migrate(settings, samples_ttl_days=30)
    newest = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
    samples = [("c", "n1", f"g{i}", i, newest - timedelta(minutes=i), 10.0 * i, f"e{i}") for i in range(5)]
    get_client(settings, database=settings.database).insert(
        "gpu_samples",
        samples,
        column_names=[
            "cluster",
            "node",
            "device_id",
            "gpu_index",
            "event_time",
            "utilization_pct",
            "event_id",
        ],
    )
    url = f"clickhouse+http://default:@127.0.0.1:{platform.clickhouse.http_port}/{settings.database}"
    engine = sa.create_engine(url)
    try:
        tables = _lines(
            endpoint, settings.database, "SELECT name FROM system.tables WHERE database = currentDatabase()"
        )
        columns = _lines(
            endpoint,
            settings.database,
            "SELECT name FROM system.columns WHERE database = currentDatabase() AND table = 'gpu_samples' "
            "ORDER BY position",
        )
        inspector = sa.inspect(engine)
        assert sorted(inspector.get_table_names() + inspector.get_view_names()) == sorted(tables)
        assert "gpu_samples" in inspector.get_table_names()
        table = sa.Table("gpu_samples", sa.MetaData(), autoload_with=engine)
        assert [c.name for c in table.columns] == columns

        statement = (
            sa.select(table.c.device_id, table.c.utilization_pct)
            .where(table.c.utilization_pct >= 20.0)
            .order_by(table.c.device_id)
        )
        with engine.connect() as connection:
            rows = [tuple(row) for row in connection.execute(statement)]
        assert rows == [(f"g{i}", 10.0 * i) for i in range(2, 5)]
    finally:
        engine.dispose()
