"""REST front-end of the embedded registry (Confluent Schema Registry API, AVRO only).

Serves what ``confluent_kafka.schema_registry.SchemaRegistryClient`` and the Avro serdes
call: register, lookup, ids, subjects, versions, latest, delete, compatibility test and
config. Errors use Confluent's ``{"error_code", "message"}`` bodies and codes.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from schemas.exceptions import IncompatibleSchemaError
from schemas.registry.compatibility import LEVELS, parse
from schemas.registry.store import SchemaStore, SchemaVersion

log = logging.getLogger(__name__)

STORE = web.AppKey("store", SchemaStore)
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


class ApiError(Exception):
    """A Confluent-style error response."""

    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(body), status=status, content_type="application/json")


@web.middleware
async def _errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as err:
        return _json({"error_code": err.code, "message": err.message}, err.status)
    except IncompatibleSchemaError as err:
        return _json({"error_code": 409, "message": str(err)}, 409)


def _store(request: web.Request) -> SchemaStore:
    return request.app[STORE]


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.text())
    except ValueError as err:
        raise ApiError(400, 400, f"request body is not JSON: {err}") from err
    if not isinstance(body, dict):
        raise ApiError(400, 400, "request body must be a JSON object")
    return body


async def _schema_text(request: web.Request) -> str:
    body = await _body(request)
    if body.get("schemaType", "AVRO") != "AVRO":
        raise ApiError(422, 42201, f"only AVRO schemas are supported, not {body['schemaType']}")
    if body.get("references"):
        raise ApiError(422, 42201, "schema references are not supported by the embedded registry")
    text = body.get("schema")
    if not isinstance(text, str):
        raise ApiError(422, 42201, "the body needs a 'schema' string")
    try:
        parse(text)
    except Exception as err:  # avro raises SchemaParseException, ValueError, TypeError
        raise ApiError(422, 42201, f"invalid Avro schema: {err}") from err
    return text


def _subject_versions(request: web.Request) -> list[SchemaVersion]:
    subject = request.match_info["subject"]
    versions = _store(request).versions(subject)
    if not versions:
        raise ApiError(404, 40401, f"Subject '{subject}' not found.")
    return versions


def _version(request: web.Request) -> SchemaVersion:
    versions = _subject_versions(request)
    wanted = request.match_info["version"]
    if wanted in ("latest", "-1"):
        return versions[-1]
    try:
        number = int(wanted)
    except ValueError as err:
        raise ApiError(422, 42202, f"invalid version {wanted!r}") from err
    found = next((v for v in versions if v.version == number), None)
    if found is None:
        raise ApiError(404, 40402, f"Version {number} not found.")
    return found


def _schema_id(request: web.Request) -> int:
    try:
        return int(request.match_info["id"])
    except ValueError as err:
        raise ApiError(404, 40403, "Schema not found") from err


# --- handlers ----------------------------------------------------------------------------------


async def root(_request: web.Request) -> web.Response:
    return _json({})


async def list_subjects(request: web.Request) -> web.Response:
    return _json(_store(request).subjects())


async def list_versions(request: web.Request) -> web.Response:
    return _json([v.version for v in _subject_versions(request)])


async def get_version(request: web.Request) -> web.Response:
    return _json(_version(request).as_json())


async def get_version_schema(request: web.Request) -> web.Response:
    return web.Response(text=_version(request).schema, content_type="application/json")


async def register(request: web.Request) -> web.Response:
    text = await _schema_text(request)
    entry = await asyncio.to_thread(_store(request).register, request.match_info["subject"], text)
    return _json({"id": entry.id})


async def lookup(request: web.Request) -> web.Response:
    subject = request.match_info["subject"]
    text = await _schema_text(request)
    if not _store(request).versions(subject):
        raise ApiError(404, 40401, f"Subject '{subject}' not found.")
    found = _store(request).lookup(subject, text)
    if found is None:
        raise ApiError(404, 40403, "Schema not found")
    return _json(found.as_json())


async def delete_subject(request: web.Request) -> web.Response:
    _subject_versions(request)
    deleted = await asyncio.to_thread(_store(request).delete, request.match_info["subject"])
    return _json(deleted)


async def delete_version(request: web.Request) -> web.Response:
    version = _version(request)
    await asyncio.to_thread(_store(request).delete, version.subject, version.version)
    return _json(version.version)


async def get_schema(request: web.Request) -> web.Response:
    schema_id = _schema_id(request)
    text = _store(request).schema_by_id(schema_id)
    if text is None:
        raise ApiError(404, 40403, f"Schema {schema_id} not found")
    return _json({"schema": text})


async def get_schema_versions(request: web.Request) -> web.Response:
    usages = _store(request).usages(_schema_id(request))
    return _json([{"subject": v.subject, "version": v.version} for v in usages])


async def get_schema_subjects(request: web.Request) -> web.Response:
    return _json(sorted({v.subject for v in _store(request).usages(_schema_id(request))}))


async def schema_types(_request: web.Request) -> web.Response:
    return _json(["AVRO"])


async def test_compatibility(request: web.Request) -> web.Response:
    text = await _schema_text(request)
    store = _store(request)
    subject = request.match_info["subject"]
    against = [_version(request)] if "version" in request.match_info else store.versions(subject)
    problems = store.problems(subject, text, against=against)
    body: dict[str, Any] = {"is_compatible": not problems}
    if request.query.get("verbose", "").lower() == "true":
        body["messages"] = problems
    return _json(body)


async def get_config(request: web.Request) -> web.Response:
    return _json({"compatibilityLevel": _store(request).compatibility(request.match_info.get("subject"))})


async def put_config(request: web.Request) -> web.Response:
    body = await _body(request)
    level = str(body.get("compatibility", "")).upper()
    if level not in LEVELS:
        raise ApiError(422, 42203, f"invalid compatibility level {level!r}; one of {', '.join(LEVELS)}")
    await asyncio.to_thread(_store(request).set_compatibility, request.match_info.get("subject"), level)
    return _json({"compatibility": level})


async def delete_config(request: web.Request) -> web.Response:
    subject = request.match_info["subject"]
    previous = _store(request).compatibility(subject)
    await asyncio.to_thread(_store(request).set_compatibility, subject, None)
    return _json({"compatibilityLevel": previous})


def build_app(store: SchemaStore) -> web.Application:
    """The registry's aiohttp application over a loaded ``store``."""
    app = web.Application(middlewares=[_errors])
    app[STORE] = store
    app.add_routes(
        [
            web.get("/", root),
            web.get("/subjects", list_subjects),
            web.get("/subjects/{subject}/versions", list_versions),
            web.post("/subjects/{subject}/versions", register),
            web.get("/subjects/{subject}/versions/{version}", get_version),
            web.get("/subjects/{subject}/versions/{version}/schema", get_version_schema),
            web.delete("/subjects/{subject}/versions/{version}", delete_version),
            web.post("/subjects/{subject}", lookup),
            web.delete("/subjects/{subject}", delete_subject),
            web.get("/schemas/types", schema_types),
            web.get("/schemas/ids/{id}", get_schema),
            web.get("/schemas/ids/{id}/versions", get_schema_versions),
            web.get("/schemas/ids/{id}/subjects", get_schema_subjects),
            web.post("/compatibility/subjects/{subject}/versions/{version}", test_compatibility),
            web.post("/compatibility/subjects/{subject}/versions", test_compatibility),
            web.get("/config", get_config),
            web.put("/config", put_config),
            web.get("/config/{subject}", get_config),
            web.put("/config/{subject}", put_config),
            web.delete("/config/{subject}", delete_config),
        ]
    )
    return app


def serve(store: SchemaStore, *, host: str, port: int) -> None:
    """Load the store and serve until SIGINT/SIGTERM."""
    store.load()
    try:
        web.run_app(build_app(store), host=host, port=port, print=None, handle_signals=True)
    finally:
        store.close()
