"""Errors of the API and of the reports made from it.

    GPULensError
    ├── ApiError            `gpulens api` cannot serve (its port is taken, the server stopped)
    └── ReportError         `gpulens report` cannot report what was asked
        ├── UnknownWorkload     no pod of the workload was ever seen (in the cluster asked)
        └── AmbiguousWorkload   the uid is a workload of several clusters: --cluster chooses

A request's own errors are HTTP answers, not exceptions of this tree: bad parameters are 400
naming the parameter, a missing or wrong token 401, an unknown node or workload 404, and
ClickHouse's trouble (:mod:`gpulens.consumers.clickhouse.exceptions`) 503 when temporary, 500
otherwise (gpulens/api/app.py).
"""

from __future__ import annotations

from gpulens.schemas.model.exceptions import GPULensError


class ApiError(GPULensError):
    """`gpulens api` cannot serve: its port is taken, or its server stopped on its own."""


class ReportError(GPULensError):
    """`gpulens report` cannot report what was asked."""


class UnknownWorkload(ReportError):
    """No pod of the workload was ever seen (in the cluster asked, when one was)."""


class AmbiguousWorkload(ReportError):
    """The uid is a workload of several clusters (replays of one trace into two): --cluster chooses."""
