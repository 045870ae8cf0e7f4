"""One way to get a ClickHouse client for whatever the configuration points at."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlparse

import clickhouse_connect
from clickhouse_connect.driver import options
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import Error as DriverError

from gpulens.consumers.clickhouse.exceptions import translate
from gpulens.consumers.clickhouse.settings import ClickHouseSettings


def get_client(
    settings: ClickHouseSettings,
    *,
    database: str | None = None,
    query_settings: Mapping[str, str | int | float] | None = None,
    session: bool = True,
) -> Client:
    """A clickhouse-connect client: HTTP for ``http(s)://`` URLs, in-process chDB for ``chdb://``.

    ``query_settings`` go with every statement (``{"readonly": 2}``: ClickHouse refuses writes).
    ``session`` False: no session id, so that threads may share the client (ClickHouse refuses
    concurrent statements in one session).

    Raises :class:`~gpulens.consumers.clickhouse.exceptions.ClickHouseUnavailable` when the server
    cannot be reached (the client asks it for its version on creation).
    """
    url = urlparse(settings.url)
    try:
        if url.scheme == "chdb":
            return clickhouse_connect.get_client(
                dsn=settings.url, database=database, settings=dict(query_settings or {})
            )
        return clickhouse_connect.get_client(
            host=url.hostname or "127.0.0.1",
            port=url.port or (8443 if url.scheme == "https" else 8123),
            secure=url.scheme == "https",
            username=settings.username,
            password=settings.password.get_secret_value(),
            database=database,
            settings=dict(query_settings or {}),
            autogenerate_session_id=session,
        )
    except DriverError as err:
        raise translate(err, f"connecting to {settings.url}") from err


def insert_rows_only() -> None:
    """Have clickhouse-connect take pandas and numpy as not installed in this process.

    On every insert it looks both up, importing them, only to tell a DataFrame or an array from
    rows, and pandas brings pyarrow: a sink at rest held 162 MB of RSS with them, 80 MB without,
    and it inserts rows only. Where they are not installed, clickhouse-connect
    resolves them to None exactly so; pandas is installed here for chDB.
    """
    options.pd = options.pd_time_test = options.np = None
