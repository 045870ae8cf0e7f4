"""How the API reads ClickHouse: one read-only client, bound parameters only, rows as dicts.

Read-only by construction: every statement carries ``readonly=2`` (ClickHouse refuses
INSERT, ALTER, CREATE, DROP and the rest; settings such as ``max_execution_time`` may still
be set), and the only ways in are :meth:`Reader.rows` and :meth:`Reader.page`, which take a
constant statement (:mod:`gpulens.api.queries`) and its values as bound parameters
(``{name:Type}``): a request's text is never part of a statement (``page`` wraps the statement
in constant SQL of its own, its limit and offset bound too).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import Error as DriverError

from gpulens.consumers.clickhouse.client import get_client
from gpulens.consumers.clickhouse.exceptions import translate
from gpulens.consumers.clickhouse.settings import ClickHouseSettings

__all__ = ["READ_ONLY", "Page", "Reader", "open_reader"]

READ_ONLY = 2
"""ClickHouse's ``readonly`` level: reads, and settings of the request; no writes, no DDL."""

Row = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Page:
    """Which page of a list: ``number`` from 1, ``size`` rows."""

    number: int
    size: int

    @property
    def offset(self) -> int:
        return (self.number - 1) * self.size


def _plain(value: Any) -> Any:
    """A ClickHouse value as JSON can carry it: naive datetimes are UTC, NaN is null."""
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


class Reader:
    """Runs the API's statements on one client (shared by the server's threads: no session)."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def rows(self, statement: str, parameters: Mapping[str, object]) -> list[Row]:
        """The rows of ``statement`` with ``parameters`` bound, as dicts by column name."""
        try:
            result = self._client.query(statement, parameters=dict(parameters))
        except DriverError as err:
            raise translate(err, statement.split("\n", 1)[0][:120]) from err
        names = result.column_names
        return [
            {name: _plain(value) for name, value in zip(names, row, strict=True)}
            for row in result.result_rows
        ]

    def page(self, statement: str, parameters: Mapping[str, object], page: Page) -> tuple[list[Row], int]:
        """One page of ``statement``'s rows (which must be ordered) and how many rows it has in all."""
        total = self.rows(f"SELECT count() AS total FROM ({statement})", parameters)[0]["total"]
        rows = self.rows(
            f"{statement}\nLIMIT {{page_size:UInt32}} OFFSET {{page_offset:UInt64}}",
            {**parameters, "page_size": page.size, "page_offset": page.offset},
        )
        return rows, int(total)

    def close(self) -> None:
        self._client.close()


def open_reader(settings: ClickHouseSettings, *, timeout_s: float) -> Reader:
    """A reader of ``settings.database``: every statement read-only, stopped after ``timeout_s``."""
    client = get_client(
        settings,
        database=settings.database,
        query_settings={"readonly": READ_ONLY, "max_execution_time": timeout_s},
        session=False,
    )
    return Reader(client)
