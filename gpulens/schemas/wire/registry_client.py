"""The two calls the pipeline makes of a Confluent-compatible schema registry, over plain HTTP.

The codec registers a topic's committed schema (``POST /subjects/{subject}/versions``) and looks
up the writer schema of an id it has not seen (``GET /schemas/ids/{id}``), each once per
process. confluent-kafka's ``SchemaRegistryClient`` does the same, but importing it loads its
OAuth, JWT and asyncio machinery too: 287 modules and about 15 MB of RSS (9.3 MB anonymous,
5.5 MB of library pages) in each of the worker, the sink and the exporter, which never use
them (measured: README, "The pipeline's schema-registry client"). The requests are the
registry's documented REST API, so this client works against Confluent's registry as against
the embedded one; the tests hold it to confluent-kafka's client (same ids, same errors).

What it keeps of that client's behaviour: a comma-separated list of URLs, tried in order;
``user:password@`` in a URL sent as HTTP basic authentication; connection failures, timeouts
and 408, 429 and 5xx answers retried (:data:`RETRIES` times, waits doubling from
:data:`FIRST_WAIT_S`), anything else raised at once as :class:`RegistryHTTPError` with the
registry's own error code and message.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
TIMEOUT_S = 10.0
RETRIES = 3
FIRST_WAIT_S = 1.0
_RETRIED_STATUS = frozenset({408, 429, 500, 502, 503, 504})


class RegistryHTTPError(Exception):
    """The registry answered with an error: its HTTP status, Confluent error code and message."""

    def __init__(self, http_status_code: int, error_code: int, message: str) -> None:
        super().__init__(f"{message} (HTTP status code {http_status_code}, error code {error_code})")
        self.http_status_code = http_status_code
        self.error_code = error_code
        self.error_message = message


@dataclass(frozen=True, slots=True)
class _Endpoint:
    base: str
    """The URL without its user information or trailing slash."""
    authorization: str | None


def _endpoint(url: str) -> _Endpoint:
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"schema registry URL {url!r}: expected http(s)://host[:port][/path]")
    authorization = None
    if parts.username is not None:
        user = urllib.parse.unquote(parts.username)
        password = urllib.parse.unquote(parts.password or "")
        authorization = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    netloc = parts.netloc.rpartition("@")[2]  # host[:port] as written, IPv6 brackets kept
    return _Endpoint(
        urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", "")), authorization
    )


class RegistryClient:
    """Registers schemas and reads them back by id; ``url`` may list several, comma-separated."""

    def __init__(
        self, url: str, *, timeout_s: float = TIMEOUT_S, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        self._endpoints = [_endpoint(one) for one in url.split(",") if one.strip()]
        if not self._endpoints:
            raise ValueError("schema registry URL is empty")
        self._timeout_s = timeout_s
        self._sleep = sleep

    def register(self, subject: str, schema_text: str) -> int:
        """Register an Avro schema under ``subject``; its id (the same text has the same id)."""
        path = f"/subjects/{urllib.parse.quote(subject, safe='')}/versions"
        answer = self._request("POST", path, {"schema": schema_text})
        return int(answer["id"])

    def schema_text(self, schema_id: int) -> str:
        """The schema registered as ``schema_id`` (:class:`RegistryHTTPError` 404 if none is)."""
        answer = self._request("GET", f"/schemas/ids/{int(schema_id)}", None)
        return str(answer["schema"])

    def _request(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        wait = FIRST_WAIT_S
        for attempt in range(RETRIES + 1):
            try:
                return self._once(method, path, body)
            except RegistryHTTPError as err:
                if err.http_status_code not in _RETRIED_STATUS or attempt == RETRIES:
                    raise
            except OSError:  # refused, reset, timed out (URLError is one): every URL failed
                if attempt == RETRIES:
                    raise
            self._sleep(wait)
            wait *= 2
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _once(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        """One attempt: each URL in turn until one answers (an HTTP error is an answer)."""
        data = None if body is None else json.dumps(body).encode()
        failure: OSError | None = None
        for endpoint in self._endpoints:
            headers = {"Accept": CONTENT_TYPE, "Content-Type": CONTENT_TYPE}
            if endpoint.authorization is not None:
                headers["Authorization"] = endpoint.authorization
            request = urllib.request.Request(endpoint.base + path, data=data, method=method, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=self._timeout_s) as response:
                    return json.loads(response.read())
            except urllib.error.HTTPError as err:
                raise _http_error(err) from None
            except OSError as err:
                failure = err
        assert failure is not None
        raise failure


def _http_error(err: urllib.error.HTTPError) -> RegistryHTTPError:
    """The registry's JSON error (``error_code``, ``message``), or the status line where the
    answer is not one (a proxy's page)."""
    try:
        answer = json.loads(err.read())
        return RegistryHTTPError(err.code, int(answer["error_code"]), str(answer["message"]))
    except (ValueError, KeyError, TypeError, OSError):
        return RegistryHTTPError(err.code, err.code, f"{err.code} {err.reason}")
