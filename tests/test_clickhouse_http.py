"""The ClickHouse HTTP interface of the embedded engine, driven by curl and clickhouse-connect."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

import clickhouse_connect
import lz4.frame
import pytest
import zstandard
from clickhouse_connect.driver.exceptions import DatabaseError

from gpulens.consumers.clickhouse.client import get_client
from gpulens.infra.launching import port_open
from gpulens.platform import free_port

ROWS = 1_000_000


@pytest.fixture
def endpoint(platform) -> str:
    return f"http://127.0.0.1:{platform.clickhouse.http_port}"


@pytest.fixture
def database(platform, unique) -> str:
    name = f"t_{unique}"
    get_client(platform.clickhouse).command(f"CREATE DATABASE {name}")
    return name


def _client(platform, database: str | None = None, compress: str | bool = False):
    return clickhouse_connect.get_client(
        host="127.0.0.1", port=platform.clickhouse.http_port, database=database, compress=compress
    )


def test_curl_select_1_answers_1(endpoint) -> None:
    out = subprocess.run(
        ["curl", "-sS", f"{endpoint}/?query=SELECT%201"], capture_output=True, text=True, check=True
    )
    assert out.stdout == "1\n"


def test_query_in_the_post_body(endpoint) -> None:
    request = urllib.request.Request(endpoint, data=b"SELECT 40 + 2 FORMAT JSONEachRow", method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.read() == b'{"plus(40, 2)":42}\n'


def test_one_million_lz4_rows_arrive_exactly(platform, database) -> None:
    client = _client(platform, database, compress="lz4")
    client.command(
        "CREATE TABLE big (id UInt64, node LowCardinality(String), util Float64) "
        "ENGINE = MergeTree ORDER BY id"
    )
    ids = list(range(ROWS))
    client.insert(
        "big",
        [ids, [f"node-{i % 1213}" for i in ids], [float(i % 100) for i in ids]],
        column_names=["id", "node", "util"],
        column_oriented=True,
    )
    assert client.command("SELECT count() FROM big") == ROWS
    assert client.command("SELECT sum(id) FROM big") == ROWS * (ROWS - 1) // 2
    assert client.command("SELECT uniqExact(node) FROM big") == 1213


@pytest.mark.parametrize("compress", ["zstd", "gzip", False])
def test_every_body_encoding_inserts_every_row(platform, database, compress) -> None:
    client = _client(platform, database, compress=compress)
    client.command("CREATE TABLE t (id UInt32) ENGINE = MergeTree ORDER BY id")
    client.insert("t", [[i] for i in range(50_000)], column_names=["id"])
    assert client.query("SELECT count(), sum(id) FROM t").result_rows == [(50_000, 49_999 * 50_000 // 2)]


@pytest.mark.parametrize(
    ("encoding", "encode"),
    [
        ("deflate", zlib.compress),
        ("gzip", gzip.compress),
        ("lz4", lz4.frame.compress),
        ("zstd", lambda data: zstandard.ZstdCompressor().compress(data)),
    ],
)
def test_a_body_of_many_frames_is_decoded_whole(platform, endpoint, database, encoding, encode) -> None:
    _client(platform, database).command("CREATE TABLE t (id UInt32) ENGINE = MergeTree ORDER BY id")
    frames = [b"INSERT INTO t FORMAT TSV\n", *(f"{i}\n".encode() for i in range(1000))]
    # deflate streams cannot be concatenated; the others can, and clients do.
    body = encode(b"".join(frames)) if encoding == "deflate" else b"".join(encode(f) for f in frames)
    request = urllib.request.Request(
        f"{endpoint}/?database={database}", data=body, method="POST", headers={"Content-Encoding": encoding}
    )
    urllib.request.urlopen(request, timeout=30).close()
    assert _client(platform, database).query("SELECT count(), sum(id) FROM t").result_rows == [
        (1000, 499_500)
    ]


@pytest.mark.parametrize(
    ("encoding", "encode"),
    [("lz4", lz4.frame.compress), ("zstd", lambda data: zstandard.ZstdCompressor().compress(data))],
)
def test_a_truncated_body_is_refused_as_clickhouse_refuses_it(endpoint, encoding, encode) -> None:
    body = encode(b"SELECT 1" + b" " * 1000)[:-4]
    request = urllib.request.Request(
        endpoint, data=body, method="POST", headers={"Content-Encoding": encoding}
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=30)
    assert caught.value.headers["X-ClickHouse-Exception-Code"] == "271"
    assert b"CANNOT_DECOMPRESS" in caught.value.read()


def test_native_types_round_trip(platform, database) -> None:
    client = _client(platform, database)
    client.command(
        "CREATE TABLE typed (at DateTime64(3, 'UTC'), node LowCardinality(String), "
        "gpus Map(String, Float64), model Nullable(String)) ENGINE = MergeTree ORDER BY at"
    )
    at = datetime(2026, 11, 1, 12, 0, 0, 123_000, tzinfo=UTC)
    client.insert(
        "typed", [[at, "n1", {"amd.com/gpu": 8.0}, None]], column_names=["at", "node", "gpus", "model"]
    )
    row = client.query("SELECT at, node, gpus, model FROM typed").result_rows[0]
    assert row[0].astimezone(UTC) == at
    assert row[1:] == ("n1", {"amd.com/gpu": 8.0}, None)


def test_bind_parameters(platform) -> None:
    client = _client(platform)
    assert client.query("SELECT {n:UInt32} * 2", parameters={"n": 21}).result_rows == [(42,)]


def test_settings_apply_to_one_query_only(platform) -> None:
    client = _client(platform)
    assert client.command("SELECT getSetting('max_threads')", settings={"max_threads": 3}) == 3
    assert client.command("SELECT getSetting('max_threads')") != 3


def test_unknown_table_is_a_404_with_the_exception_code(endpoint) -> None:
    query = quote("SELECT * FROM system.nothing")
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(f"{endpoint}/?query={query}", timeout=30)
    assert caught.value.code == 404
    assert caught.value.headers["X-ClickHouse-Exception-Code"] == "60"
    assert b"UNKNOWN_TABLE" in caught.value.read()


def test_errors_reach_clickhouse_connect_as_database_errors(platform) -> None:
    with pytest.raises(DatabaseError, match="Syntax error"):
        _client(platform).command("SELEC 1")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 40 MB tmpfs: a disk that can really fill up."""
    mount = tmp_path / "disk"
    mount.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(mount)], capture_output=True
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill (needs root): {result.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def test_a_full_disk_and_bad_sql_come_back_as_clickhouse_error_codes(
    small_disk: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULENS_")}
    env |= {
        "GPULENS_PLATFORM__STATE_DIR": str(small_disk / "state"),
        "GPULENS_CLICKHOUSE__HTTP_PORT": str(port),
    }
    spawned.append(subprocess.Popen([sys.executable, "-m", "gpulens", "serve", "clickhouse"], env=env))
    deadline = time.monotonic() + 60
    while not port_open("127.0.0.1", port):
        assert time.monotonic() < deadline and spawned[0].poll() is None, "the endpoint did not start"
    client = clickhouse_connect.get_client(host="127.0.0.1", port=port)
    client.command("CREATE TABLE t (id UInt64, s String) ENGINE = MergeTree ORDER BY id")
    rows = [[i, "x" * 1000] for i in range(1000)]  # ~1 MB of insert data

    filler = small_disk / "filler"
    with filler.open("wb") as out:  # leave ~64 KB free
        out.write(b"\0" * (shutil.disk_usage(small_disk).free - 65536))
    with pytest.raises(DatabaseError, match=r"code: 243.*NOT_ENOUGH_SPACE"):
        client.insert("t", rows, column_names=["id", "s"])
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/?query=INSERT%20INTO%20t%20FORMAT%20TSV", data=b"1\tx\n" * 100_000
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=30)
    assert (caught.value.code, caught.value.headers["X-ClickHouse-Exception-Code"]) == (507, "243")

    filler.unlink()  # space again: the same insert goes through
    client.insert("t", rows, column_names=["id", "s"])
    assert client.command("SELECT count() FROM t") == len(rows)
    with pytest.raises(DatabaseError, match=r"code: 62.*Syntax error"):
        client.query("SELEC 1")
