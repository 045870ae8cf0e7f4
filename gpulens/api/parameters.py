"""The query parameters the endpoints share, validated by FastAPI; errors name the parameter.

A bound that comes from the settings (the largest page, the most buckets) is checked here
and refused as FastAPI refuses the rest, so every bad parameter is one kind of answer: 400
with the parameter's name (gpulens/api/app.py).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from gpulens.api.queries import END_OF_TIME, NEWEST_SAMPLE, START_OF_TIME
from gpulens.api.reading import Page, Reader
from gpulens.api.settings import ApiSettings

__all__ = [
    "AsOf",
    "Cluster",
    "Db",
    "Paging",
    "SeriesAsked",
    "SeriesRequest",
    "Settings",
    "Span",
    "TimeRange",
    "api_settings",
    "at",
    "authorize",
    "invalid",
    "page",
    "paged",
    "reader",
    "series_answer",
    "time_range",
    "utc",
]

Cluster = Annotated[str, Query(min_length=1, description="Cluster name (see /api/clusters).")]
AsOf = Annotated[
    datetime | None,
    Query(
        alias="asOf",
        description="RFC 3339 instant (e.g. 2023-02-01T12:00:00Z): answer as of then, from history. "
        "Default: the newest state.",
    ),
]
Start = Annotated[datetime | None, Query(description="RFC 3339 start of the range (inclusive).")]
End = Annotated[datetime | None, Query(description="RFC 3339 end of the range (exclusive).")]
Step = Annotated[int, Query(ge=1, le=86_400, description="Bucket size, seconds.")]

SERIES_SPAN = timedelta(hours=1)
"""How far a time series reaches back from its end when ``start`` is left out."""


def invalid(parameter: str, message: str, value: object = None) -> RequestValidationError:
    """A refusal of query parameter ``parameter``, answered as FastAPI's own (400 naming it)."""
    return RequestValidationError(
        [{"type": "value_error", "loc": ("query", parameter), "msg": message, "input": value}]
    )


def api_settings(request: Request) -> ApiSettings:
    settings: ApiSettings = request.app.state.settings
    return settings


def reader(request: Request) -> Reader:
    """The process's ClickHouse reader (read-only, shared by the server's threads)."""
    shared: Reader = request.app.state.reader
    return shared


_bearer = HTTPBearer(auto_error=False, description="The token of api.token, when one is configured.")


def authorize(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """401 unless the request carries api.token (when one is configured) as a bearer token."""
    token = api_settings(request).token
    if token is None:
        return
    given = credentials.credentials if credentials is not None else ""
    if not secrets.compare_digest(given.encode(), token.get_secret_value().encode()):
        raise HTTPException(
            status_code=401,
            detail="this API needs its token: Authorization: Bearer TOKEN",
            headers={"WWW-Authenticate": "Bearer"},
        )


def utc(instant: datetime) -> datetime:
    """``instant`` in UTC; one without a zone is taken as UTC."""
    return instant.replace(tzinfo=UTC) if instant.tzinfo is None else instant.astimezone(UTC)


def at(as_of: datetime | None) -> datetime:
    """What ``{at}`` binds: ``asOf``, or after every event."""
    return END_OF_TIME if as_of is None else utc(as_of)


def page(
    request: Request,
    page_num: Annotated[int, Query(alias="pageNum", ge=1, description="Page, from 1.")] = 1,
    page_size: Annotated[int, Query(alias="pageSize", ge=1, description="Rows per page.")] = 50,
) -> Page:
    """``pageNum`` and ``pageSize``, the size at most api.page_size_max."""
    most = api_settings(request).page_size_max
    if page_size > most:
        raise invalid("pageSize", f"Input should be less than or equal to {most}", page_size)
    return Page(page_num, page_size)


@dataclass(frozen=True, slots=True)
class TimeRange:
    """``[start, end)`` in UTC."""

    start: datetime
    end: datetime


def time_range(start: Start = None, end: End = None) -> TimeRange:
    """``start`` and ``end``, each open by default (all of history), ``end`` after ``start``."""
    chosen = TimeRange(
        START_OF_TIME if start is None else utc(start), END_OF_TIME if end is None else utc(end)
    )
    if chosen.end <= chosen.start:
        raise invalid("end", "Input should be after start", end)
    return chosen


@dataclass(frozen=True, slots=True)
class SeriesRequest:
    """A time series' range as asked: ``start`` and ``end`` may be left open; ``step`` seconds."""

    start: datetime | None
    end: datetime | None
    step: int


def series(start: Start = None, end: End = None, step: Step = 60) -> SeriesRequest:
    """``start``, ``end`` (each optional) and ``step``."""
    if start is not None and end is not None and utc(end) <= utc(start):
        raise invalid("end", "Input should be after start", end)
    return SeriesRequest(None if start is None else utc(start), None if end is None else utc(end), step)


def series_range(
    chosen: SeriesRequest, reader: Reader, settings: ApiSettings, *, cluster: str, node: str | None = None
) -> TimeRange:
    """``chosen``'s range made whole: an open end is just after the newest sample (of ``node``,
    when given), an open start :data:`SERIES_SPAN` before the end; at most api.buckets_max steps."""
    end = chosen.end
    if end is None:
        newest = reader.rows(NEWEST_SAMPLE, {"cluster": cluster, "node": node})[0]
        end = newest["newest"] + timedelta(milliseconds=1) if newest["samples"] else datetime.now(UTC)
    start = chosen.start if chosen.start is not None else end - SERIES_SPAN
    if end <= start:
        raise invalid("start", "Input should be before end (the newest sample, when end is left out)")
    buckets = (end - start).total_seconds() / chosen.step
    if buckets > settings.buckets_max:
        raise invalid(
            "step",
            f"Input gives {buckets:.0f} buckets over [start, end), more than {settings.buckets_max}: "
            "ask for a larger step or a shorter range",
            chosen.step,
        )
    return TimeRange(start, end)


def series_answer(
    query: str,
    chosen: SeriesRequest,
    reader: Reader,
    settings: ApiSettings,
    *,
    cluster: str,
    node: str | None = None,
) -> dict[str, Any]:
    """A time-series answer: ``query`` per ``step`` over ``chosen``'s range made whole
    (:func:`series_range`), for ``cluster`` (and ``node``, when given)."""
    span = series_range(chosen, reader, settings, cluster=cluster, node=node)
    params = {"cluster": cluster, "node": node, "start": span.start, "end": span.end, "step": chosen.step}
    return {"start": span.start, "end": span.end, "step": chosen.step, "data": reader.rows(query, params)}


Db = Annotated[Reader, Depends(reader)]
"""The process's read-only ClickHouse reader, as an endpoint's parameter."""
Settings = Annotated[ApiSettings, Depends(api_settings)]
Paging = Annotated[Page, Depends(page)]
Span = Annotated[TimeRange, Depends(time_range)]
SeriesAsked = Annotated[SeriesRequest, Depends(series)]


GROUP_BY = r"^(namespace|workload|label:[A-Za-z0-9_./-]{1,253})$"
"""What a ``groupBy`` parameter may say: namespace, workload, or label:KEY."""
LABEL = "label:"


def grouped(statements: Mapping[str, str], group_by: str, params: dict[str, object]) -> str:
    """The statement of ``statements`` (keyed namespace, workload, label) that ``group_by`` (as
    :data:`GROUP_BY` allows) asks for; a label's key is bound as ``{label}`` in ``params``."""
    if group_by.startswith(LABEL):
        params["label"] = group_by[len(LABEL) :]
        return statements["label"]
    return statements[group_by]


def paged(rows: list[dict[str, Any]], total: int, chosen: Page, **extra: Any) -> dict[str, Any]:
    """A paginated answer: ``extra`` (e.g. ``asOf``), the page's rows, the total, the page asked."""
    return {**extra, "data": rows, "total": total, "pageNum": chosen.number, "pageSize": chosen.size}
