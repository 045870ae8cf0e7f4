"""Confluent's error bodies and codes, on every response the registry's REST front-end sends.

Clients branch on ``error_code`` (python-schema-registry-client, confluent-kafka, kafkajs'
registry client), and some parse every body as JSON: so an unknown route (404), a wrong method
(405) and an unexpected failure (500) answer with ``{"error_code", "message"}`` too, as
Confluent's Jersey server does, never with aiohttp's plain-text pages.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from enum import IntEnum
from typing import Any

from aiohttp import web

from gpulens.schemas.model.exceptions import IncompatibleSchemaError, RegistryError

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


class ErrorCode(IntEnum):
    """Confluent's error codes; a five-digit code starts with its HTTP status."""

    SUBJECT_NOT_FOUND = 40401
    VERSION_NOT_FOUND = 40402
    SCHEMA_NOT_FOUND = 40403
    SUBJECT_COMPATIBILITY_NOT_CONFIGURED = 40408
    SUBJECT_MODE_NOT_CONFIGURED = 40409
    INCOMPATIBLE_SCHEMA = 409
    INVALID_SCHEMA = 42201
    INVALID_VERSION = 42202
    INVALID_COMPATIBILITY_LEVEL = 42203
    INVALID_MODE = 42204
    OPERATION_NOT_PERMITTED = 42205
    STORE_ERROR = 50001

    @property
    def status(self) -> int:
        """The HTTP status this code is sent with."""
        return self.value // 100 if self.value >= 10_000 else self.value


class ApiError(Exception):
    """A refusal the client is told about with Confluent's code."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def json_response(body: Any, status: int = 200) -> web.Response:
    """``body`` as JSON with the registry's content type."""
    return web.Response(body=json.dumps(body).encode(), status=status, content_type=CONTENT_TYPE)


def _error(status: int, code: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    response = json_response({"error_code": code, "message": message}, status)
    response.headers.update(headers or {})
    return response


@web.middleware
async def confluent_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Turn every failure of ``handler`` into Confluent's JSON error body."""
    try:
        return await handler(request)
    except ApiError as err:
        return _error(err.code.status, err.code, err.message)
    except IncompatibleSchemaError as err:
        return _error(409, ErrorCode.INCOMPATIBLE_SCHEMA, str(err))
    except RegistryError as err:  # the store topic could not be written
        log.error("%s %s: %s", request.method, request.path, err)
        return _error(500, ErrorCode.STORE_ERROR, f"Error in the backend data store: {err}")
    except web.HTTPException as err:  # no route (404), wrong method (405): Jersey's wording
        allow = {"Allow": err.headers["Allow"]} if "Allow" in err.headers else None
        return _error(err.status, err.status, f"HTTP {err.status} {err.reason}", allow)
    except Exception as err:
        log.exception("%s %s failed", request.method, request.path)
        return _error(500, 500, f"Internal Server Error: {type(err).__name__}: {err}")
