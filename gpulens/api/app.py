"""The API as one FastAPI application: routes, authentication, errors, the console's files.

Built by :func:`build_app` around one read-only :class:`~gpulens.api.reading.Reader`. Every
``/api/`` route depends on :func:`~gpulens.api.parameters.authorize`; ``/healthz``,
``/openapi.json`` and the console's static files (``console/``, mounted at ``/`` last, so
every route above wins) do not. Errors are answered as JSON, each with its status:

- 400 for a bad parameter (FastAPI's validation, and the bounds of the settings), naming it:
  ``{"error": "invalid parameter: pageSize", "parameters": [{"name": "pageSize", "in":
  "query", "message": "..."}]}`` (FastAPI's own status for these, 422, is Lens's 400 here);
- 401 without the configured token, 404 for an unknown node or workload;
- 503 while ClickHouse is unreachable or busy (retry), 500 when it refused a statement;
  these as ``{"error": "..."}``.

/openapi.json says so: its routes list 400 (:class:`~gpulens.api.models.BadParameters`) where
FastAPI would list its 422.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException

from gpulens.api.models import BadParameters, Failure, Health
from gpulens.api.parameters import authorize
from gpulens.api.reading import Reader
from gpulens.api.routes import aggregation, alerts, clusters, nodes, workloads
from gpulens.api.settings import ApiSettings
from gpulens.consumers.clickhouse.exceptions import ClickHouseError, ClickHouseUnavailable

__all__ = ["CONSOLE", "build_app"]

CONSOLE = Path(__file__).with_name("console")
"""The web console's static files, served at ``/``."""


async def _bad_parameters(_request: Request, err: Exception) -> JSONResponse:
    assert isinstance(err, RequestValidationError)
    problems = [
        {
            "name": str(problem["loc"][-1]) if problem["loc"] else "",
            "in": str(problem["loc"][0]) if problem["loc"] else "",
            "message": problem["msg"],
        }
        for problem in err.errors()
    ]
    names = ", ".join(dict.fromkeys(p["name"] for p in problems))
    return JSONResponse(
        status_code=400, content={"error": f"invalid parameter: {names}", "parameters": problems}
    )


async def _http_error(_request: Request, err: Exception) -> JSONResponse:
    assert isinstance(err, HTTPException)
    return JSONResponse(status_code=err.status_code, content={"error": err.detail}, headers=err.headers)


async def _clickhouse_trouble(_request: Request, err: Exception) -> JSONResponse:
    status = 503 if isinstance(err, ClickHouseUnavailable) else 500
    return JSONResponse(status_code=status, content={"error": f"ClickHouse: {err}"})


class _LensApi(FastAPI):
    """FastAPI, with its OpenAPI document listing the 400 this API answers instead of 422."""

    def openapi(self) -> dict[str, Any]:
        schema = super().openapi()
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                operation.get("responses", {}).pop("422", None)
        for unused in ("HTTPValidationError", "ValidationError"):
            schema.get("components", {}).get("schemas", {}).pop(unused, None)
        return schema


ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": BadParameters, "description": "A parameter is wrong: each is named."},
    401: {"model": Failure, "description": "api.token is set and the request does not carry it."},
    503: {"model": Failure, "description": "ClickHouse is unreachable or busy: try again."},
}
"""The errors every /api/ route may answer, for /openapi.json."""


def build_app(settings: ApiSettings, reader: Reader) -> FastAPI:
    """The application: Lens's routes over ``reader``, guarded as ``settings`` say."""
    app = _LensApi(
        title="GPULens API",
        summary="GPU clusters as the event-sourced pipeline sees them; every current view takes asOf.",
        version="1",
        docs_url=None,  # the interactive pages load their scripts from a CDN this machine cannot reach
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.reader = reader
    app.add_exception_handler(RequestValidationError, _bad_parameters)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(ClickHouseError, _clickhouse_trouble)
    api = APIRouter(prefix="/api", dependencies=[Depends(authorize)], responses=ERRORS)
    for module in (clusters, nodes, workloads, alerts, aggregation):
        api.include_router(module.router)
    app.include_router(api)

    @app.get("/healthz", tags=["health"], response_model=Health)
    def healthz() -> dict[str, Any]:
        """The API is up (no token needed): what a supervisor or a load balancer asks."""
        return {"status": "ok"}

    app.mount("/", StaticFiles(directory=CONSOLE, html=True), name="console")
    return app
