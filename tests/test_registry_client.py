"""The pipeline's own schema-registry client, held to confluent-kafka's against the real
registry, and at the HTTP boundary (a stand-in server) for what the embedded registry never
does: refuse, fail for a while, ask for credentials."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from gpulens.platform import free_port
from gpulens.schemas.model.exceptions import DecodeError, DecodeFailure, RegistryError
from gpulens.schemas.model.topics import PODS
from gpulens.schemas.wire.codec import AvroCodec
from gpulens.schemas.wire.registry_client import RegistryClient, RegistryHTTPError


def _record_schema(name: str) -> str:
    return json.dumps({"type": "record", "name": name, "fields": [{"name": "a", "type": "long"}]})


def test_an_id_it_registers_is_the_id_confluents_client_finds(platform, unique) -> None:
    ours, theirs = RegistryClient(platform.registry.url), SchemaRegistryClient({"url": platform.registry.url})
    text = _record_schema(f"Ours{unique}")
    schema_id = ours.register(f"ours-{unique}", text)
    assert json.loads(theirs.get_schema(schema_id).schema_str) == json.loads(text)
    assert theirs.register_schema(f"ours-{unique}", Schema(text, "AVRO")) == schema_id


def test_it_reads_back_what_confluents_client_registered(platform, unique) -> None:
    theirs = SchemaRegistryClient({"url": platform.registry.url})
    text = _record_schema(f"Theirs{unique}")
    schema_id = theirs.register_schema(f"theirs-{unique}", Schema(text, "AVRO"))
    ours = RegistryClient(platform.registry.url)
    assert json.loads(ours.schema_text(schema_id)) == json.loads(text)
    assert ours.register(f"theirs-{unique}", text) == schema_id


def test_an_unknown_id_is_the_error_confluents_client_reports(platform) -> None:
    with pytest.raises(SchemaRegistryError) as theirs:
        SchemaRegistryClient({"url": platform.registry.url}).get_schema(987_001)
    with pytest.raises(RegistryHTTPError) as ours:
        RegistryClient(platform.registry.url).schema_text(987_001)
    assert (ours.value.http_status_code, ours.value.error_code) == (
        theirs.value.http_status_code,
        theirs.value.error_code,
    )
    assert ours.value.error_message == theirs.value.error_message


class _Registry(BaseHTTPRequestHandler):
    """Answers from the server's script, one answer per request; records every request."""

    def _answer(self) -> None:
        server = self.server
        assert isinstance(server, _ScriptedServer)
        length = int(self.headers.get("Content-Length") or 0)
        server.seen.append((self.command, self.path, dict(self.headers), self.rfile.read(length)))
        status, body = server.script.pop(0) if server.script else (200, {"id": 1, "schema": "{}"})
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the test reads ``seen``."""


class _ScriptedServer(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Registry)
        self.script: list[tuple[int, dict[str, object]]] = []
        self.seen: list[tuple[str, str, dict[str, str], bytes]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def scripted() -> Iterator[_ScriptedServer]:
    server = _ScriptedServer()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_a_registration_posts_the_schema_to_the_subjects_versions(scripted) -> None:
    scripted.script = [(200, {"id": 42})]
    assert RegistryClient(scripted.url).register("a b/c-value", '{"type": "long"}') == 42
    method, path, headers, body = scripted.seen[0]
    assert (method, path) == ("POST", "/subjects/a%20b%2Fc-value/versions")
    assert headers["Content-Type"] == "application/vnd.schemaregistry.v1+json"
    assert json.loads(body) == {"schema": '{"type": "long"}'}


def test_credentials_in_the_url_are_sent_as_basic_authentication(scripted) -> None:
    url = scripted.url.replace("http://", "http://lens:s%40cret@")
    RegistryClient(url).schema_text(7)
    _, path, headers, _ = scripted.seen[0]
    assert path == "/schemas/ids/7"
    assert headers["Authorization"] == "Basic bGVuczpzQGNyZXQ="  # base64 of "lens:s@cret"


def test_an_unavailable_registry_is_asked_again_with_growing_waits(scripted) -> None:
    waits: list[float] = []
    scripted.script = [(503, {"error_code": 50301, "message": "busy"})] * 2 + [(200, {"id": 5})]
    assert RegistryClient(scripted.url, sleep=waits.append).register("s", "{}") == 5
    assert (len(scripted.seen), waits) == (3, [1.0, 2.0])


def test_a_refusal_is_raised_at_once_with_the_registrys_code(scripted) -> None:
    waits: list[float] = []
    scripted.script = [(409, {"error_code": 409, "message": "Schema being registered is incompatible"})]
    with pytest.raises(RegistryHTTPError) as caught:
        RegistryClient(scripted.url, sleep=waits.append).register("s", "{}")
    assert (caught.value.http_status_code, caught.value.error_code, len(scripted.seen), waits) == (
        409,
        409,
        1,
        [],
    )
    assert "incompatible" in str(caught.value)


def test_a_url_that_refuses_connections_gives_way_to_the_next_in_the_list(scripted) -> None:
    scripted.script = [(200, {"schema": '"long"'})]
    closed = f"http://127.0.0.1:{free_port()}"
    assert RegistryClient(f"{closed}, {scripted.url}").schema_text(3) == '"long"'


def test_a_codec_without_a_registry_reports_it_unreachable_not_a_bad_record() -> None:
    waits: list[float] = []
    codec = AvroCodec(RegistryClient(f"http://127.0.0.1:{free_port()}", sleep=waits.append))
    with pytest.raises(RegistryError, match="unreachable") as caught:
        codec.decode(PODS, b"\x00\x00\x00\x00\x09" + b"\x00")
    assert not isinstance(caught.value, DecodeError)
    assert waits == [1.0, 2.0, 4.0]


def test_a_codec_reads_an_id_the_registry_does_not_know_as_a_dead_letter(scripted) -> None:
    scripted.script = [(404, {"error_code": 40403, "message": "Schema 9 not found"})]
    with pytest.raises(DecodeError) as caught:
        AvroCodec(RegistryClient(scripted.url)).decode(PODS, b"\x00\x00\x00\x00\x09" + b"\x00")
    assert caught.value.reason is DecodeFailure.UNKNOWN_SCHEMA_ID


def test_a_url_that_is_not_http_is_refused_with_what_to_write() -> None:
    with pytest.raises(ValueError, match=r"expected http\(s\)://host"):
        RegistryClient("localhost:8081")
