"""The embedded registry as clients nobody here wrote see it: python-schema-registry-client
(PyPI), confluent-kafka's own client, and plain HTTP held against Confluent's API reference.

The module has a private platform: it changes the global compatibility level and mode, which
would otherwise change what every other test's registrations meet.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from aiohttp.test_utils import TestClient, TestServer
from confluent_kafka.schema_registry import SchemaRegistryClient as ConfluentClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from schema_registry.client import SchemaRegistryClient
from schema_registry.client.errors import ClientError

from gpulens.config import GPULensSettings
from gpulens.infra.registry import SchemaStore, build_app
from gpulens.platform import REGISTRY, manager, service_specs

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


@pytest.fixture(scope="module")
def platform(module_platform: tuple[GPULensSettings, object]) -> GPULensSettings:
    return module_platform[0]


@pytest.fixture
def url(platform: GPULensSettings) -> str:
    return platform.registry.url


@pytest.fixture
def client(url: str) -> SchemaRegistryClient:
    return SchemaRegistryClient(url)


def record(name: str, *fields: dict) -> dict:
    return {"type": "record", "name": name, "fields": list(fields)}


LONG_A = {"name": "a", "type": "long"}
OPTIONAL_B = {"name": "b", "type": ["null", "string"], "default": None}
REQUIRED_C = {"name": "c", "type": "long"}


def call(method: str, url: str, body: dict | None = None) -> tuple[int, str, object]:
    """Status, content type and JSON body of one request, whatever the status."""
    request = urllib.request.Request(
        url,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Content-Type": CONTENT_TYPE},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers.get_content_type(), json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get_content_type(), json.loads(err.read())


def mode_of(client: SchemaRegistryClient, path: str) -> dict:
    """``/mode`` through the client's own transport (the library has no mode method)."""
    response = client.request(f"{client.url_manager.url}{path}", method="GET")
    assert response.status_code == 200, response.text
    return response.json()


def set_mode(client: SchemaRegistryClient, path: str, mode: str) -> dict:
    response = client.request(f"{client.url_manager.url}{path}", method="PUT", body={"mode": mode})
    assert response.status_code == 200, response.text
    return response.json()


def test_register_get_by_id_and_versions(client, unique) -> None:
    subject = f"conf-{unique}-value"
    v1, v2 = record(f"R{unique}", LONG_A), record(f"R{unique}", LONG_A, OPTIONAL_B)

    first = client.register(subject, v1)
    again = SchemaRegistryClient(client.url_manager.url).register(subject, v1)  # no cache: asks
    second = client.register(subject, v2)

    assert again == first and second != first
    assert SchemaRegistryClient(client.url_manager.url).get_by_id(first).raw_schema == v1
    assert client.get_versions(subject) == [1, 2]
    latest = client.get_schema(subject)
    assert (latest.schema_id, latest.version, latest.schema.raw_schema) == (second, 2, v2)
    assert client.get_schema(subject, 1).schema_id == first
    assert client.check_version(subject, v1).version == 1
    assert [(s.subject, s.version) for s in client.get_schema_subject_versions(second)] == [(subject, 2)]
    assert client.get_by_id(999_999) is None


def test_compatibility_global_and_per_subject(client, url, unique) -> None:
    subject = f"compat-{unique}-value"
    client.register(subject, record(f"C{unique}", LONG_A, REQUIRED_C))
    # Dropping a required field: new readers still read old data (BACKWARD), old readers cannot
    # read new data (not FORWARD, so not FULL).
    dropped = record(f"C{unique}", LONG_A)

    assert client.get_compatibility() == "BACKWARD"  # GET /config/ : the trailing slash of the client
    with pytest.raises(ClientError) as unset:
        client.get_compatibility(subject)  # Confluent: 404 40408 until the subject has its own level
    assert (unset.value.http_code, unset.value.server_traceback["error_code"]) == (404, 40408)
    assert client.test_compatibility(subject, dropped) is True

    assert client.update_compatibility("FULL", subject)
    assert client.get_compatibility(subject) == "FULL"
    assert client.test_compatibility(subject, dropped) is False
    verbose = client.test_compatibility(subject, dropped, verbose=True)
    assert verbose["is_compatible"] is False and "c" in " ".join(verbose["messages"])

    try:
        assert client.update_compatibility("NONE")
        assert client.get_compatibility() == "NONE"
        assert client.get_compatibility(subject) == "FULL"  # the subject's own level wins
        other = f"compat2-{unique}-value"
        client.register(other, record(f"D{unique}", LONG_A, REQUIRED_C))
        assert client.test_compatibility(other, record(f"D{unique}", {"name": "z", "type": "int"})) is True
    finally:
        assert call("DELETE", f"{url}/config") == (200, CONTENT_TYPE, {"compatibilityLevel": "NONE"})
    assert client.get_compatibility() == "BACKWARD"  # deleted: the configured default again

    assert call("DELETE", f"{url}/config/{subject}") == (200, CONTENT_TYPE, {"compatibilityLevel": "FULL"})
    assert call("GET", f"{url}/config/{subject}?defaultToGlobal=true")[2] == {
        "compatibilityLevel": "BACKWARD"
    }
    assert call("DELETE", f"{url}/config/{subject}")[:2] == (404, CONTENT_TYPE)


def test_readonly_mode_refuses_registrations(client, url, unique) -> None:
    subject = f"ro-{unique}-value"
    kept = record(f"M{unique}", LONG_A)
    kept_id = client.register(subject, kept)
    assert mode_of(client, "mode") == {"mode": "READWRITE"}

    assert set_mode(client, f"mode/{subject}", "READONLY") == {"mode": "READONLY"}
    assert mode_of(client, f"mode/{subject}") == {"mode": "READONLY"}
    fresh = SchemaRegistryClient(url)
    assert fresh.register(subject, kept) == kept_id  # a lookup: allowed, as on Confluent
    with pytest.raises(ClientError) as refused:
        fresh.register(subject, record(f"M{unique}", LONG_A, OPTIONAL_B))
    assert refused.value.http_code == 422
    assert refused.value.server_traceback["error_code"] == 42205
    assert call("DELETE", f"{url}/subjects/{subject}")[:2] == (422, CONTENT_TYPE)
    assert fresh.get_versions(subject) == [1]

    other = f"ro2-{unique}-value"
    try:
        assert set_mode(client, "mode", "READONLY") == {"mode": "READONLY"}
        with pytest.raises(ClientError) as globally:
            fresh.register(other, record(f"N{unique}", LONG_A))
        assert globally.value.server_traceback["error_code"] == 42205
    finally:
        set_mode(client, "mode", "READWRITE")
    assert fresh.register(other, record(f"N{unique}", LONG_A)) > 0

    assert call("DELETE", f"{url}/mode/{subject}") == (200, CONTENT_TYPE, {"mode": "READONLY"})
    assert call("GET", f"{url}/mode/{subject}")[2]["error_code"] == 40409
    assert call("GET", f"{url}/mode/{subject}?defaultToGlobal=true")[2] == {"mode": "READWRITE"}
    assert fresh.register(subject, record(f"M{unique}", LONG_A, OPTIONAL_B)) > kept_id


def test_modes_and_levels_survive_a_registry_restart(module_platform, client, unique) -> None:
    settings, config_file = module_platform
    subject = f"restart-{unique}-value"
    client.register(subject, record(f"S{unique}", LONG_A))
    set_mode(client, f"mode/{subject}", "READONLY")
    client.update_compatibility("FORWARD", subject)

    services = manager(settings)
    services.stop(REGISTRY)
    services.start(service_specs(settings, config_file)[REGISTRY], timeout=60)

    fresh = SchemaRegistryClient(settings.registry.url)
    assert mode_of(fresh, f"mode/{subject}") == {"mode": "READONLY"}
    assert fresh.get_compatibility(subject) == "FORWARD"
    assert mode_of(fresh, "mode") == {"mode": "READWRITE"}


def test_confluent_kafka_client_modes_contexts_and_types(url, unique) -> None:
    confluent = ConfluentClient({"url": url})
    subject = f"ck-{unique}-value"
    assert confluent.get_global_mode() == "READWRITE"
    assert confluent.update_mode(subject, "READONLY") == "READONLY"
    assert confluent.get_mode(subject) == "READONLY"
    assert confluent.delete_mode(subject) == "READONLY"
    with pytest.raises(SchemaRegistryError) as unset:
        confluent.get_mode(subject)
    assert (unset.value.http_status_code, unset.value.error_code) == (404, 40409)
    with pytest.raises(SchemaRegistryError) as invalid:
        confluent.update_global_mode("IMPORT")  # needs registrations with given ids: not served
    assert (invalid.value.http_status_code, invalid.value.error_code) == (422, 42204)
    assert confluent.get_contexts() == ["."]
    assert confluent.get_schema_types() == ["AVRO"]


def test_schema_list_and_raw_schema(client, url, unique) -> None:
    first, second = f"list-{unique}-a", f"list-{unique}-b"
    a1, a2, b1 = (
        record(f"A{unique}", LONG_A),
        record(f"A{unique}", LONG_A, OPTIONAL_B),
        record(f"B{unique}", LONG_A),
    )
    ids = [client.register(first, a1), client.register(first, a2), client.register(second, b1)]

    status, kind, listed = call("GET", f"{url}/schemas?subjectPrefix=list-{unique}")
    assert (status, kind) == (200, CONTENT_TYPE)
    assert [(s["subject"], s["version"], s["id"], json.loads(s["schema"])) for s in listed] == [
        (first, 1, ids[0], a1),
        (first, 2, ids[1], a2),
        (second, 1, ids[2], b1),
    ]
    latest = call("GET", f"{url}/schemas?subjectPrefix=list-{unique}&latestOnly=true")[2]
    assert [(s["subject"], s["version"]) for s in latest] == [(first, 2), (second, 1)]
    paged = call("GET", f"{url}/schemas?subjectPrefix=list-{unique}&offset=1&limit=1")[2]
    assert [(s["subject"], s["version"]) for s in paged] == [(first, 2)]

    assert call("GET", f"{url}/schemas/ids/{ids[1]}/schema") == (200, CONTENT_TYPE, a2)
    assert call("GET", f"{url}/subjects/{first}/versions/1/schema") == (200, CONTENT_TYPE, a1)
    assert call("GET", f"{url}/contexts") == (200, CONTENT_TYPE, ["."])


@pytest.fixture
def existing(client, unique) -> Iterator[str]:
    subject = f"err-{unique}-value"
    client.register(subject, record(f"E{unique}", LONG_A))
    yield subject


ERRORS = [
    ("GET", "/subjects/no-such-subject/versions", None, 404, 40401),
    ("GET", "/subjects/{subject}/versions/99", None, 404, 40402),
    ("GET", "/schemas/ids/999999", None, 404, 40403),
    ("GET", "/schemas/ids/999999/schema", None, 404, 40403),
    ("GET", "/config/{subject}", None, 404, 40408),
    ("GET", "/mode/{subject}", None, 404, 40409),
    ("DELETE", "/mode/{subject}", None, 404, 40401),
    ("POST", "/subjects/{subject}/versions", {"schema": '{"type": "record", "name": "X"}'}, 422, 42201),
    ("GET", "/subjects/{subject}/versions/one", None, 422, 42202),
    ("PUT", "/config/{subject}", {"compatibility": "SIDEWAYS"}, 422, 42203),
    ("PUT", "/mode", {"mode": "SIDEWAYS"}, 422, 42204),
    # Another record, with a field old data lacks: BACKWARD-incompatible with the subject's.
    ("POST", "/subjects/{subject}/versions", {"schema": json.dumps(record("E", REQUIRED_C))}, 409, 409),
    ("GET", "/no/such/route", None, 404, 404),
    ("DELETE", "/schemas/types", None, 405, 405),
    ("POST", "/config", None, 405, 405),
]


@pytest.mark.parametrize(("method", "path", "body", "status", "code"), ERRORS)
def test_errors_are_confluent_json(url, existing, method, path, body, status, code) -> None:
    got_status, kind, error = call(method, url + path.format(subject=existing), body)
    assert (got_status, kind) == (status, CONTENT_TYPE)
    assert set(error) == {"error_code", "message"} and error["error_code"] == code
    assert isinstance(error["message"], str) and error["message"]


def test_a_store_that_cannot_write_is_a_500_with_confluent_code(platform) -> None:
    """The store never loaded has no producer: the write fails as a broker outage would, at once."""
    store = SchemaStore(platform.kafka, topic="never-loaded", default_compatibility="BACKWARD")

    async def put_config() -> tuple[int, str, dict]:
        async with TestClient(TestServer(build_app(store))) as http:
            response = await http.put("/config", json={"compatibility": "FULL"})
            return response.status, response.content_type, await response.json(content_type=None)

    status, kind, error = asyncio.run(put_config())
    assert (status, kind, error["error_code"]) == (500, CONTENT_TYPE, 50001)
    assert "not loaded" in error["message"]


SLASHED = [
    "/subjects",
    "/subjects/{subject}/versions",
    "/subjects/{subject}/versions/1",
    "/subjects/{subject}/versions/latest/schema",
    "/schemas",
    "/schemas/types",
    "/schemas/ids/{id}",
    "/schemas/ids/{id}/schema",
    "/schemas/ids/{id}/versions",
    "/contexts",
    "/config",
    "/config/{subject}",
    "/mode",
    "/mode/{subject}",
]


def test_every_route_takes_a_trailing_slash(client, url, unique) -> None:
    subject = f"slash-{unique}-value"
    schema_id = client.register(subject, record(f"T{unique}", LONG_A))
    client.update_compatibility("FULL", subject)
    set_mode(client, f"mode/{subject}", "READWRITE")
    for path in SLASHED:
        plain = call("GET", url + path.format(subject=subject, id=schema_id))
        assert plain[0] == 200, (path, plain)
        assert call("GET", url + path.format(subject=subject, id=schema_id) + "/") == plain, path

    slashed = record(f"T{unique}", LONG_A, OPTIONAL_B)
    assert call("POST", f"{url}/subjects/{subject}/versions/", {"schema": json.dumps(slashed)})[0] == 200
    assert call("PUT", f"{url}/config/{subject}/", {"compatibility": "NONE"})[2] == {"compatibility": "NONE"}
    assert client.get_versions(subject) == [1, 2]
