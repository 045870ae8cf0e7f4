"""Writing into ClickHouse: columnar inserts of rows, or Avro values ClickHouse decodes itself,
retried with backoff while it is away.

A temporary failure (unreachable, overloaded, timed out) is retried after the delays of
``SinkSettings.retry_backoff_s``, the last one repeating, until ClickHouse answers or the
caller stops; a permanent one (:class:`StatementError`) is raised at once. A retried insert
carries the same ``insert_deduplication_token``, so an insert that did land before its
answer was lost is not stored twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from itertools import chain, repeat
from typing import TypeVar

from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import Error as DriverError
from prometheus_client import Counter, Histogram

from gpulens.consumers.clickhouse.exceptions import ClickHouseUnavailable, translate
from gpulens.consumers.clickhouse.rows import Row, Table

__all__ = ["INSERT_SECONDS", "RETRIES", "ROWS_WRITTEN", "TableWriter", "retrying"]

log = logging.getLogger(__name__)

T = TypeVar("T")

ROWS_WRITTEN = Counter("gpulens_sink_rows_written_total", "Rows ClickHouse accepted, by table.", ["table"])
INSERT_SECONDS = Histogram(
    "gpulens_sink_insert_seconds",
    "Duration of one accepted insert, by table.",
    ["table"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
RETRIES = Counter(
    "gpulens_sink_retries_total",
    "Attempts that failed temporarily and were retried, by operation.",
    ["operation"],
)


def retrying(call: Callable[[], T], *, operation: str, backoff: Sequence[float], stop: threading.Event) -> T:
    """``call()``, retried after each :class:`ClickHouseUnavailable` with the ``backoff`` delays
    (the last repeats); the error is re-raised once ``stop`` is set."""
    delays = chain(backoff, repeat(backoff[-1]))
    while True:
        try:
            return call()
        except ClickHouseUnavailable as err:
            if stop.is_set():
                raise
            delay = next(delays)
            RETRIES.labels(operation).inc()
            log.warning("%s; retrying in %.1f s", err, delay)
            if stop.wait(delay):
                raise


class TableWriter:
    """Inserts rows of the sink's tables, or Avro values for ClickHouse to decode, through one client."""

    def __init__(
        self,
        client: Client,
        *,
        backoff: Sequence[float],
        stop: threading.Event,
        registry_url: str | None = None,
    ) -> None:
        """``registry_url``: the schema registry as ClickHouse reaches it, for :meth:`write_avro`."""
        self._client = client
        self._backoff = backoff
        self._stop = stop
        self._registry_url = registry_url

    def write_avro(self, table: str, values: list[bytes], *, into: str, token: str) -> int:
        """Insert Confluent-framed Avro ``values`` (Kafka values as they are) into ``table``,
        decoded by ClickHouse (``FORMAT AvroConfluent``, writer schemas fetched from the
        registry by id), retrying while it is away; returns the records ClickHouse read. The
        metrics and retries name ``into``, the table the rows land in (as for :meth:`write`).

        Raises :class:`~gpulens.consumers.clickhouse.exceptions.StatementError` when it refuses them
        (a value it cannot read, a row breaking the table's constraints): nothing is stored.
        """
        if self._registry_url is None:
            raise ValueError("write_avro needs the registry URL ClickHouse fetches schemas from")
        settings = {
            "format_avro_schema_registry_url": self._registry_url,
            "insert_deduplication_token": token,
        }
        body = b"".join(values)

        def insert() -> tuple[int, int]:
            started = time.perf_counter()
            try:
                summary = self._client.raw_insert(
                    table, insert_block=body, fmt="AvroConfluent", settings=settings
                )
            except DriverError as err:
                raise translate(err, f"inserting {len(values)} Avro records into {table}") from err
            INSERT_SECONDS.labels(into).observe(time.perf_counter() - started)
            return int(summary.summary.get("read_rows", len(values))), summary.written_rows

        read, written = retrying(insert, operation=f"insert {into}", backoff=self._backoff, stop=self._stop)
        ROWS_WRITTEN.labels(into).inc(max(written - read, 0))  # written: the values' table too
        return read

    def write(self, table: Table, rows: list[Row], *, token: str) -> None:
        """Insert ``rows`` (column-oriented), retrying while ClickHouse is away."""
        columns = list(zip(*rows, strict=True))

        def insert() -> None:
            started = time.perf_counter()
            try:
                self._client.insert(
                    table.name,
                    columns,
                    column_names=table.columns,
                    column_oriented=True,
                    settings={"insert_deduplication_token": token},
                )
            except DriverError as err:
                raise translate(err, f"inserting {len(rows)} rows into {table.name}") from err
            INSERT_SECONDS.labels(table.name).observe(time.perf_counter() - started)

        retrying(insert, operation=f"insert {table.name}", backoff=self._backoff, stop=self._stop)
        ROWS_WRITTEN.labels(table.name).inc(len(rows))
