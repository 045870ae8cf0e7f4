"""Errors of the API.

    GPULensError
    └── ApiError        `gpulens api` cannot serve (its port is taken, the server stopped)

A request's own errors are HTTP answers, not exceptions of this tree: bad parameters are 400
naming the parameter, a missing or wrong token 401, an unknown node or workload 404, and
ClickHouse's trouble (:mod:`gpulens.consumers.clickhouse.exceptions`) 503 when temporary, 500
otherwise (gpulens/api/app.py).
"""

from __future__ import annotations

from gpulens.schemas.model.exceptions import GPULensError


class ApiError(GPULensError):
    """`gpulens api` cannot serve: its port is taken, or its server stopped on its own."""
