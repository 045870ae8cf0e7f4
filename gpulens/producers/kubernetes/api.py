"""The official Kubernetes client, used generically: URL paths in, raw JSON dicts out.

Every resource (built-in or custom) goes through the same two calls, :meth:`KubeApi.request`
and :meth:`KubeApi.stream`, over the client's ``ApiClient`` (its configuration, auth and TLS);
the client's typed models are skipped because the translators read the JSON directly. Client
and urllib3 errors are translated into :mod:`gpulens.producers.kubernetes.exceptions` here.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import config as kube_config
from kubernetes.client import ApiClient, Configuration
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from gpulens.producers.kubernetes._types import RawObject, RawWatchEvent
from gpulens.producers.kubernetes.exceptions import (
    ConflictError,
    KubernetesApiError,
    NotFoundError,
    PermanentApiError,
    ResourceExpiredError,
    TemporaryApiError,
)
from gpulens.schemas.model.exceptions import ConfigError

Query = list[tuple[str, str]]


def load_configuration(*, kubeconfig: Path | None = None, in_cluster: bool = False) -> Configuration:
    """Client configuration from the pod's service account, or a kubeconfig file (default: ~/.kube)."""
    configuration = Configuration()
    try:
        if in_cluster:
            kube_config.load_incluster_config(client_configuration=configuration)
        else:
            kube_config.load_kube_config(
                config_file=str(kubeconfig) if kubeconfig else None, client_configuration=configuration
            )
    except kube_config.ConfigException as err:
        where = "the in-cluster service account" if in_cluster else f"kubeconfig {kubeconfig or '(default)'}"
        raise ConfigError(f"cannot configure the Kubernetes client from {where}: {err}") from err
    return configuration


class KubeApi:
    """Requests and watch streams against one API server; :meth:`interrupt` unblocks every stream."""

    def __init__(self, configuration: Configuration, *, request_timeout_s: float = 30.0) -> None:
        self._client = ApiClient(configuration)
        self._timeout = request_timeout_s
        self._lock = threading.Lock()
        self._open: set[urllib3.BaseHTTPResponse] = set()

    def close(self) -> None:
        """Close the connection pool."""
        self.interrupt()
        self._client.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Query | None = None,
        body: RawObject | None = None,
        content_type: str = "application/json",
    ) -> RawObject:
        """One request; the decoded JSON answer. A PATCH says its kind in ``content_type``
        (``application/merge-patch+json``: the API server refuses plain JSON there)."""
        with self._send(
            method, path, query=query, body=body, content_type=content_type, timeout=self._timeout
        ) as response:
            data: RawObject = json.loads(response.data)
            return data

    def stream(self, path: str, *, query: Query, timeout_s: float) -> Iterator[RawWatchEvent]:
        """The events of a watch request, one per line, until the server ends the stream.

        ``timeout_s`` is the read timeout: a stream silent for longer is dead (the server
        sends at least a bookmark or ends the stream within its own timeoutSeconds).
        """
        with self._send("GET", path, query=query, timeout=timeout_s) as response:
            self._track(response, add=True)
            try:
                buffer = b""
                for chunk in _chunks(response, "GET", path):
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if line.strip():
                            yield json.loads(line)
            finally:
                self._track(response, add=False)

    def interrupt(self) -> None:
        """Make every open stream end now (used to stop watch threads blocked in a read)."""
        with self._lock:
            responses = list(self._open)
        for response in responses:
            # already released or closed (its socket too, as it ended meanwhile: EBADF): nothing to unblock
            with suppress(ValueError, RuntimeError, OSError):
                response.shutdown()

    def _track(self, response: urllib3.BaseHTTPResponse, *, add: bool) -> None:
        with self._lock:
            (self._open.add if add else self._open.discard)(response)

    @contextmanager
    def _send(
        self,
        method: str,
        path: str,
        *,
        query: Query | None = None,
        body: RawObject | None = None,
        content_type: str = "application/json",
        timeout: float,
    ) -> Iterator[urllib3.BaseHTTPResponse]:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        try:
            serialized = self._client.param_serialize(
                method=method,
                resource_path=path,
                query_params=query or [],
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            response = self._client.call_api(*serialized, _request_timeout=(self._timeout, timeout)).response
        except ApiException as err:  # the client wraps TLS and protocol failures
            raise TemporaryApiError(method, path, err.status or 0, str(err.reason)) from err
        except HTTPError as err:
            raise TemporaryApiError(method, path, 0, f"{type(err).__name__}: {err}") from err
        try:
            if not 200 <= response.status < 300:
                raise _api_error(method, path, response)
            yield response
        finally:
            response.release_conn()


def _chunks(response: urllib3.BaseHTTPResponse, method: str, path: str) -> Iterator[bytes]:
    try:
        yield from response.stream(amt=None, decode_content=True)
    except HTTPError as err:
        raise TemporaryApiError(method, path, response.status, f"stream broke: {err}") from err


def _api_error(method: str, path: str, response: urllib3.BaseHTTPResponse) -> KubernetesApiError:
    """The error a non-2xx answer means, with the Status message the API server put in the body."""
    status = response.status
    detail = _status_message(response.data) or response.reason or ""
    retry_after = response.headers.get("Retry-After")
    if status == 410:
        return ResourceExpiredError(method, path, status, detail)
    if status == 429 or status >= 500:
        return TemporaryApiError(
            method, path, status, detail, retry_after=float(retry_after) if retry_after else None
        )
    error_type = {404: NotFoundError, 409: ConflictError}.get(status, PermanentApiError)
    return error_type(method, path, status, detail)


def _status_message(body: bytes) -> str | None:
    try:
        status: Any = json.loads(body)
    except ValueError:
        return body.decode(errors="replace")[:200] or None
    return status.get("message") if isinstance(status, dict) else None


def status_error(method: str, path: str, status: RawObject) -> KubernetesApiError:
    """The error an ERROR watch event means (its object is a Status)."""
    code, message = int(status.get("code") or 0), str(status.get("message") or status.get("reason"))
    if code == 410:
        return ResourceExpiredError(method, path, code, message)
    if code == 429 or code >= 500:
        return TemporaryApiError(method, path, code, message)
    return PermanentApiError(method, path, code, message)
