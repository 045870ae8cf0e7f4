"""REST front-end of the embedded registry (Confluent Schema Registry API, AVRO only).

Serves what registry clients call (confluent-kafka's ``SchemaRegistryClient`` and serdes,
python-schema-registry-client, kafkajs' registry client, ClickHouse's ``AvroConfluent``):
subjects and versions (register, lookup, delete), schemas by id, the schema list and types,
compatibility tests, compatibility levels (``/config``), modes (``/mode``) and contexts (the
default one only). Every route answers with and without a trailing slash, as Jersey does, and
every error is Confluent's ``{"error_code", "message"}`` (see :mod:`gpulens.infra.registry.errors`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from gpulens.infra.registry.compatibility import LEVELS, parse
from gpulens.infra.registry.errors import CONTENT_TYPE, ApiError, ErrorCode, confluent_errors, json_response
from gpulens.infra.registry.store import MODES, READONLY, SchemaStore, SchemaVersion

STORE = web.AppKey("store", SchemaStore)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _store(request: web.Request) -> SchemaStore:
    return request.app[STORE]


def _flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "").lower() == "true"


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.text())
    except ValueError as err:
        raise web.HTTPBadRequest(reason=f"request body is not JSON: {err}") from err
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(reason="request body must be a JSON object")
    return body


async def _schema_text(request: web.Request) -> str:
    body = await _body(request)
    if body.get("schemaType", "AVRO") != "AVRO":
        raise ApiError(ErrorCode.INVALID_SCHEMA, f"only AVRO schemas are supported, not {body['schemaType']}")
    if body.get("references"):
        raise ApiError(
            ErrorCode.INVALID_SCHEMA, "schema references are not supported by the embedded registry"
        )
    text = body.get("schema")
    if not isinstance(text, str):
        raise ApiError(ErrorCode.INVALID_SCHEMA, "the body needs a 'schema' string")
    try:
        parse(text)
    except Exception as err:  # avro raises SchemaParseException, ValueError, TypeError
        raise ApiError(ErrorCode.INVALID_SCHEMA, f"Invalid schema: {err}") from err
    return text


def _subject_versions(request: web.Request) -> list[SchemaVersion]:
    subject = request.match_info["subject"]
    versions = _store(request).versions(subject)
    if not versions:
        raise ApiError(ErrorCode.SUBJECT_NOT_FOUND, f"Subject '{subject}' not found.")
    return versions


def _version(request: web.Request) -> SchemaVersion:
    versions = _subject_versions(request)
    wanted = request.match_info["version"]
    if wanted in ("latest", "-1"):
        return versions[-1]
    try:
        number = int(wanted)
    except ValueError as err:
        raise ApiError(
            ErrorCode.INVALID_VERSION,
            f"The specified version '{wanted}' is not a valid version id. "
            'Allowed values are between [1, 2^31-1] and the string "latest"',
        ) from err
    found = next((v for v in versions if v.version == number), None)
    if found is None:
        raise ApiError(ErrorCode.VERSION_NOT_FOUND, f"Version {number} not found.")
    return found


def _schema_id(request: web.Request) -> int:
    try:
        return int(request.match_info["id"])
    except ValueError as err:
        raise ApiError(ErrorCode.SCHEMA_NOT_FOUND, "Schema not found") from err


def _schema_by_id(request: web.Request) -> str:
    schema_id = _schema_id(request)
    text = _store(request).schema_by_id(schema_id)
    if text is None:
        raise ApiError(ErrorCode.SCHEMA_NOT_FOUND, f"Schema {schema_id} not found")
    return text


def _writable(request: web.Request) -> str:
    """The subject of the request, refused when its mode (or the global one) is READONLY."""
    subject = request.match_info["subject"]
    if _store(request).mode(subject) == READONLY:
        raise ApiError(ErrorCode.OPERATION_NOT_PERMITTED, f"Subject {subject} is in read-only mode")
    return subject


def _raw(text: str) -> web.Response:
    """A schema's own text as the body (the ``.../schema`` routes)."""
    return web.Response(body=text.encode(), content_type=CONTENT_TYPE)


# --- subjects and versions ---------------------------------------------------------------------


async def root(_request: web.Request) -> web.Response:
    return json_response({})


async def list_subjects(request: web.Request) -> web.Response:
    prefix = request.query.get("subjectPrefix", "")
    return json_response([s for s in _store(request).subjects() if s.startswith(prefix)])


async def list_versions(request: web.Request) -> web.Response:
    return json_response([v.version for v in _subject_versions(request)])


async def get_version(request: web.Request) -> web.Response:
    return json_response(_version(request).as_json())


async def get_version_schema(request: web.Request) -> web.Response:
    return _raw(_version(request).schema)


async def register(request: web.Request) -> web.Response:
    subject = _writable(request)
    text = await _schema_text(request)
    entry = await asyncio.to_thread(_store(request).register, subject, text)
    return json_response({"id": entry.id})


async def lookup(request: web.Request) -> web.Response:
    subject = request.match_info["subject"]
    text = await _schema_text(request)
    if not _store(request).versions(subject):
        raise ApiError(ErrorCode.SUBJECT_NOT_FOUND, f"Subject '{subject}' not found.")
    found = _store(request).lookup(subject, text)
    if found is None:
        raise ApiError(ErrorCode.SCHEMA_NOT_FOUND, "Schema not found")
    return json_response(found.as_json())


async def delete_subject(request: web.Request) -> web.Response:
    subject = _writable(request)
    _subject_versions(request)
    return json_response(await asyncio.to_thread(_store(request).delete, subject))


async def delete_version(request: web.Request) -> web.Response:
    _writable(request)
    version = _version(request)
    await asyncio.to_thread(_store(request).delete, version.subject, version.version)
    return json_response(version.version)


# --- schemas -------------------------------------------------------------------------------------


async def list_schemas(request: web.Request) -> web.Response:
    """Every schema version, by subject and version; Confluent's filters and paging."""
    prefix = request.query.get("subjectPrefix", "")
    chosen = [
        v
        for v in _store(request).all_versions(deleted=_flag(request, "deleted"))
        if v.subject.startswith(prefix)
    ]
    if _flag(request, "latestOnly"):
        chosen = list({v.subject: v for v in chosen}.values())
    try:
        offset, limit = int(request.query.get("offset", 0)), int(request.query.get("limit", -1))
    except ValueError as err:
        raise web.HTTPBadRequest(reason=f"offset and limit must be integers: {err}") from err
    chosen = chosen[offset:] if limit < 0 else chosen[offset : offset + limit]
    return json_response([v.as_json() for v in chosen])


async def get_schema(request: web.Request) -> web.Response:
    return json_response({"schema": _schema_by_id(request)})


async def get_schema_only(request: web.Request) -> web.Response:
    return _raw(_schema_by_id(request))


async def get_schema_versions(request: web.Request) -> web.Response:
    usages = _store(request).usages(_schema_id(request))
    return json_response([{"subject": v.subject, "version": v.version} for v in usages])


async def get_schema_subjects(request: web.Request) -> web.Response:
    return json_response(sorted({v.subject for v in _store(request).usages(_schema_id(request))}))


async def schema_types(_request: web.Request) -> web.Response:
    return json_response(["AVRO"])


async def list_contexts(_request: web.Request) -> web.Response:
    """Only the default context: subjects are never qualified with one."""
    return json_response(["."])


async def test_compatibility(request: web.Request) -> web.Response:
    text = await _schema_text(request)
    store = _store(request)
    subject = request.match_info["subject"]
    against = [_version(request)] if "version" in request.match_info else store.versions(subject)
    problems = store.problems(subject, text, against=against)
    body: dict[str, Any] = {"is_compatible": not problems}
    if _flag(request, "verbose"):
        body["messages"] = problems
    return json_response(body)


# --- compatibility levels and modes: global, or per subject ------------------------------------


async def get_config(request: web.Request) -> web.Response:
    store, subject = _store(request), request.match_info.get("subject")
    if subject is None or _flag(request, "defaultToGlobal"):
        return json_response({"compatibilityLevel": store.compatibility(subject)})
    level = store.own_compatibility(subject)
    if level is None:
        raise ApiError(
            ErrorCode.SUBJECT_COMPATIBILITY_NOT_CONFIGURED,
            f"Subject '{subject}' does not have subject-level compatibility configured",
        )
    return json_response({"compatibilityLevel": level})


async def put_config(request: web.Request) -> web.Response:
    level = str((await _body(request)).get("compatibility", "")).upper()
    if level not in LEVELS:
        raise ApiError(
            ErrorCode.INVALID_COMPATIBILITY_LEVEL,
            f"Invalid compatibility level {level!r}. Valid values are {', '.join(LEVELS)}",
        )
    await asyncio.to_thread(_store(request).set_compatibility, request.match_info.get("subject"), level)
    return json_response({"compatibility": level})


async def delete_config(request: web.Request) -> web.Response:
    """Back to the global level (a subject) or to the configured default (global); the old level."""
    store, subject = _store(request), request.match_info.get("subject")
    previous = store.compatibility(None) if subject is None else store.own_compatibility(subject)
    if previous is None:
        raise ApiError(ErrorCode.SUBJECT_NOT_FOUND, f"Subject '{subject}' not found.")
    await asyncio.to_thread(store.set_compatibility, subject, None)
    return json_response({"compatibilityLevel": previous})


async def get_mode(request: web.Request) -> web.Response:
    store, subject = _store(request), request.match_info.get("subject")
    if subject is None or _flag(request, "defaultToGlobal"):
        return json_response({"mode": store.mode(subject)})
    mode = store.own_mode(subject)
    if mode is None:
        raise ApiError(
            ErrorCode.SUBJECT_MODE_NOT_CONFIGURED,
            f"Subject '{subject}' does not have subject-level mode configured",
        )
    return json_response({"mode": mode})


async def put_mode(request: web.Request) -> web.Response:
    mode = str((await _body(request)).get("mode", "")).upper()
    if mode not in MODES:
        raise ApiError(ErrorCode.INVALID_MODE, f"Invalid mode {mode!r}. Valid values are {', '.join(MODES)}")
    await asyncio.to_thread(_store(request).set_mode, request.match_info.get("subject"), mode)
    return json_response({"mode": mode})


async def delete_mode(request: web.Request) -> web.Response:
    """Back to the global mode; the subject's old mode."""
    store, subject = _store(request), request.match_info["subject"]
    previous = store.own_mode(subject)
    if previous is None:
        raise ApiError(ErrorCode.SUBJECT_NOT_FOUND, f"Subject '{subject}' not found.")
    await asyncio.to_thread(store.set_mode, subject, None)
    return json_response({"mode": previous})


ROUTES: tuple[tuple[str, str, Handler], ...] = (
    ("GET", "/subjects", list_subjects),
    ("GET", "/subjects/{subject}/versions", list_versions),
    ("POST", "/subjects/{subject}/versions", register),
    ("GET", "/subjects/{subject}/versions/{version}", get_version),
    ("GET", "/subjects/{subject}/versions/{version}/schema", get_version_schema),
    ("DELETE", "/subjects/{subject}/versions/{version}", delete_version),
    ("POST", "/subjects/{subject}", lookup),
    ("DELETE", "/subjects/{subject}", delete_subject),
    ("GET", "/schemas", list_schemas),
    ("GET", "/schemas/types", schema_types),
    ("GET", "/schemas/ids/{id}", get_schema),
    ("GET", "/schemas/ids/{id}/schema", get_schema_only),
    ("GET", "/schemas/ids/{id}/versions", get_schema_versions),
    ("GET", "/schemas/ids/{id}/subjects", get_schema_subjects),
    ("GET", "/contexts", list_contexts),
    ("POST", "/compatibility/subjects/{subject}/versions/{version}", test_compatibility),
    ("POST", "/compatibility/subjects/{subject}/versions", test_compatibility),
    ("GET", "/config", get_config),
    ("PUT", "/config", put_config),
    ("DELETE", "/config", delete_config),
    ("GET", "/config/{subject}", get_config),
    ("PUT", "/config/{subject}", put_config),
    ("DELETE", "/config/{subject}", delete_config),
    ("GET", "/mode", get_mode),
    ("PUT", "/mode", put_mode),
    ("GET", "/mode/{subject}", get_mode),
    ("PUT", "/mode/{subject}", put_mode),
    ("DELETE", "/mode/{subject}", delete_mode),
)
"""Method, path and handler of every route; each is served at ``path`` and ``path/``."""


def build_app(store: SchemaStore) -> web.Application:
    """The registry's aiohttp application over a loaded ``store``."""
    app = web.Application(middlewares=[confluent_errors])
    app[STORE] = store
    app.router.add_get("/", root)
    for method, path, handler in ROUTES:
        for variant in (path, f"{path}/"):
            app.router.add_route(method, variant, handler)
    return app


def serve(store: SchemaStore, *, host: str, port: int) -> None:
    """Load the store and serve until SIGINT/SIGTERM."""
    store.load()
    try:
        web.run_app(build_app(store), host=host, port=port, print=None, handle_signals=True)
    finally:
        store.close()
