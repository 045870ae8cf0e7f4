"""Errors of the ClickHouse consumers.

    GPULensError
    ├── ClickHouseError            ClickHouse refused or could not run a statement
    │   ├── ClickHouseUnavailable  temporary: unreachable, overloaded, timed out (retry later)
    │   ├── StatementError         permanent: the statement or its data is wrong (retrying won't help)
    │   └── MigrationError         a migration cannot be applied, or was edited after it was applied
    └── SinkError                  the sink cannot start for a reason outside ClickHouse (missing topics)

clickhouse-connect's errors are translated where they enter (:func:`translate`), with the
table and the statement they concern. ClickHouse's code decides when there is one (for 1001, a
wrapped C++ exception, the OS error it names: a full disk is temporary); an answer
without a code is the server's trouble when its HTTP status is 5xx (a bare 500 from a server
whose disk is full, a 502/503 from a proxy in front of it: retried), the request's otherwise.
"""

from __future__ import annotations

import re

from clickhouse_connect.driver.exceptions import Error as DriverError
from clickhouse_connect.driver.exceptions import OperationalError

from gpulens.schemas.model.exceptions import GPULensError

# ClickHouse error codes that say "not now" rather than "never": timeouts, network, overload,
# parts pressure, read-only replicas, memory, a full disk (243 NOT_ENOUGH_SPACE, 75 write
# failed), an insert whose outcome is unknown.
TEMPORARY_CODES = frozenset({75, 159, 160, 164, 202, 203, 209, 210, 236, 241, 242, 243, 252, 319, 425, 999})

_HTTP_STATUS = re.compile(r"HTTP status (\d{3})")
# 1001 STD_EXCEPTION wraps any C++ exception; an OS error out of resources is "not now": the
# embedded engine reports a full disk as "OSError: [Errno 28] No space left on device".
_STD_EXCEPTION = 1001
_OUT_OF_RESOURCES = re.compile(r"\[Errno (?:12|23|24|28|122)\]")  # ENOMEM ENFILE EMFILE ENOSPC EDQUOT


class ClickHouseError(GPULensError):
    """ClickHouse refused or could not run a statement; ``code`` is ClickHouse's (None: transport)."""

    def __init__(self, message: str, *, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class ClickHouseUnavailable(ClickHouseError):
    """Temporary: the server is unreachable, overloaded or timed out; the same call may succeed later."""


class StatementError(ClickHouseError):
    """Permanent: the statement or its data is wrong; retrying the same call fails the same way."""


class MigrationError(ClickHouseError):
    """A migration cannot be applied, or a recorded one no longer matches its file."""


def translate(err: DriverError, what: str) -> ClickHouseError:
    """``err`` from clickhouse-connect as our error, with ``what`` (table, statement) as context."""
    code = getattr(err, "code", None)
    first_line = (str(err).strip().splitlines() or [type(err).__name__])[0][:500]
    message = f"{what}: {first_line}"
    # OperationalError: the transport failed (refused, reset, timed out) after the client's own retries.
    if isinstance(err, OperationalError) or code in TEMPORARY_CODES:
        return ClickHouseUnavailable(message, code=code)
    if code == _STD_EXCEPTION and _OUT_OF_RESOURCES.search(str(err)):
        return ClickHouseUnavailable(message, code=code)
    status = _HTTP_STATUS.search(str(err))
    if not code and status is not None and status.group(1).startswith("5"):
        return ClickHouseUnavailable(message, code=code)
    return StatementError(message, code=code)


class SinkError(GPULensError):
    """The sink cannot start or go on for a reason outside ClickHouse (e.g. missing topics)."""
