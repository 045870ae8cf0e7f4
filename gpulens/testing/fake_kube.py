"""A fake Kubernetes API server that speaks the real HTTP protocol, for the watcher tests.

What it implements, as kube-apiserver does: LIST of a collection (cluster-wide or in a
namespace) with the current resourceVersion; WATCH (``?watch=true``) from a resourceVersion,
streamed as newline-delimited JSON events in chunked encoding, with BOOKMARKs when asked
(``allowWatchBookmarks``) and an end after ``timeoutSeconds``; ``410 Gone`` for a
resourceVersion older than the compacted history, either as an HTTP 410 Status or as an ERROR
event (``gone_as``); the node proxy's kubelet summary (``GET
/api/v1/nodes/{node}/proxy/stats/summary``) from what :meth:`FakeKube.set_summary` gave, 404
for a node that does not exist and 503 for one whose kubelet does not answer, as the API
server's proxy says so; discovery documents (``/apis/{group}/{version}``), Kueue's group only
when made with ``kueue=True``; equality-based ``labelSelector`` on lists; PodMetrics of ``metrics.k8s.io``
as metrics-server serves them (created as ``podmetrics``, its plural being taken); GET, POST
(409 if it exists) and PUT (409 when the resourceVersion sent is not the current one); PATCH as
a JSON merge patch (``application/merge-patch+json``, or ``strategic-merge-patch+json``, the
same for the maps and scalars the tests change; any other type 415), also on the ``scale``
subresource of Deployments and StatefulSets (an ``autoscaling/v1`` Scale); DELETE (a Status
``Success``). Every PATCH, PUT, POST and DELETE answered is kept in :attr:`FakeKube.writes`, and
every request as the RBAC authorizer sees it (API group, resource or ``resource/sub``, verb) in
:attr:`FakeKube.access`; given ``allow`` (such triples, as a ClusterRole grants them), any other
request is answered 403 Forbidden, as kube-apiserver answers a service account. One global
resourceVersion counter for every object, as etcd's revision. Tests change the state through the
Python API (:meth:`FakeKube.create`, :meth:`~FakeKube.update`, :meth:`~FakeKube.delete`), never
by touching the code under test.
"""

from __future__ import annotations

import bisect
import copy
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import parse_qs, urlparse


@dataclass(frozen=True)
class Kind:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    name: str = ""
    """What tests call it (:meth:`FakeKube.create` etc.) when its plural is taken: ``podmetrics``."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> str:
        return self.name or self.plural


KINDS = {
    k.key: k
    for k in (
        Kind("", "v1", "nodes", "Node", namespaced=False),
        Kind("", "v1", "pods", "Pod"),
        Kind("", "v1", "services", "Service"),
        Kind("apps", "v1", "deployments", "Deployment"),
        Kind("apps", "v1", "replicasets", "ReplicaSet"),
        Kind("apps", "v1", "statefulsets", "StatefulSet"),
        Kind("apps", "v1", "daemonsets", "DaemonSet"),
        Kind("batch", "v1", "jobs", "Job"),
        Kind("batch", "v1", "cronjobs", "CronJob"),
        Kind("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob"),
        Kind("coordination.k8s.io", "v1", "leases", "Lease"),
        Kind("", "v1", "persistentvolumes", "PersistentVolume", namespaced=False),
        Kind("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim"),
        Kind("storage.k8s.io", "v1", "storageclasses", "StorageClass", namespaced=False),
        Kind("kueue.x-k8s.io", "v1beta1", "workloads", "Workload"),
        Kind("metrics.k8s.io", "v1beta1", "pods", "PodMetrics", name="podmetrics"),
    )
}
_ROUTES = {(k.group, k.plural): k for k in KINDS.values()}
VERBS = ["get", "list", "watch"]
KUEUE = "kueue.x-k8s.io"
"""A group served only by a fake made with ``kueue=True`` (its CRDs installed)."""


@dataclass(frozen=True)
class _Change:
    resource_version: int
    plural: str | None  # None: a bookmark for every watch
    type: str
    object: dict[str, Any]


@dataclass
class _Request:
    kind: Kind
    namespace: str | None
    name: str | None
    query: dict[str, str]
    subresource: str | None = None


@dataclass(frozen=True)
class Write:
    """A change a client asked for over HTTP, answered with a 2xx (what tests assert on)."""

    method: str
    plural: str
    namespace: str
    name: str
    subresource: str | None
    body: dict[str, Any] | None


_MERGE_PATCHES = ("application/merge-patch+json", "application/strategic-merge-patch+json")
_SCALABLE = ("deployments", "statefulsets")


_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def _access(method: str, request: _Request) -> tuple[str, str, str]:
    """(API group, resource[/subresource], verb) of a request, as kube-apiserver authorizes it."""
    if method == "GET":
        verb = "watch" if request.query.get("watch") == "true" else "get" if request.name else "list"
    else:
        verb = _VERBS[method]
    resource = request.kind.plural + (f"/{request.subresource}" if request.subresource else "")
    return request.kind.group, resource, verb


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """RFC 7386 JSON merge patch, in place: null removes a key, maps merge, the rest replaces."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def _selects(selector: str, labels: dict[str, str]) -> bool:
    """Whether equality-based ``selector`` (``a=b,c==d,e!=f,g,!h``) selects ``labels``."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            ok = labels.get(key.strip()) != value.strip()
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            ok = labels.get(key.strip()) == value.strip()
        elif term.startswith("!"):
            ok = term[1:] not in labels
        else:
            ok = term in labels
        if not ok:
            return False
    return True


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class FakeKube:
    """The fake API server; ``with FakeKube() as kube:`` serves on 127.0.0.1:<free port>."""

    def __init__(
        self,
        *,
        gone_as: Literal["status", "event"] = "status",
        allow: Iterable[tuple[str, str, str]] | None = None,
        kueue: bool = False,
    ) -> None:
        self.gone_as = gone_as
        self.allow = None if allow is None else frozenset(allow)
        self.kueue = kueue
        self._cond = threading.Condition()
        self._objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {p: {} for p in KINDS}
        self._history: list[_Change] = []
        self._revisions: list[int] = []  # the history's resourceVersions, for bisecting
        self._revision = 0
        self._compacted = 0
        self._generation = 0  # bumped by outages: streams of an older generation end at once
        self._down = False
        self._stopping = False
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self._summaries: dict[str, dict[str, Any]] = {}
        self.writes: list[Write] = []
        self.access: list[tuple[str, str, str]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._serving: threading.Thread | None = None

    # --- lifecycle ---------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def __enter__(self) -> FakeKube:
        self._serving = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="fake-kube")
        self._serving.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._server.shutdown()
        self._server.server_close()  # joins the request threads
        if self._serving is not None:
            self._serving.join()

    # --- state, through Python -------------------------------------------------------------------

    def create(self, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Store a new object (uid, creationTimestamp and resourceVersion filled in); a copy of it."""
        kind = KINDS[plural]
        obj = copy.deepcopy(obj)
        obj.setdefault("apiVersion", kind.api_version)
        obj.setdefault("kind", kind.kind)
        meta = obj.setdefault("metadata", {})
        if kind.namespaced:
            meta.setdefault("namespace", "default")
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        with self._cond:
            key = (meta.get("namespace", ""), meta["name"])
            if key in self._objects[plural]:
                raise KeyError(f"{plural} {key} exists")
            return self._record(plural, "ADDED", obj)

    def update(
        self, plural: str, name: str, change: Callable[[dict[str, Any]], None], *, namespace: str = "default"
    ) -> dict[str, Any]:
        """Apply ``change`` to a copy of the object and store it as a new version."""
        with self._cond:
            obj = copy.deepcopy(self._objects[plural][self._key(plural, namespace, name)])
            change(obj)
            return self._record(plural, "MODIFIED", obj)

    def delete(self, plural: str, name: str, *, namespace: str = "default") -> None:
        """Remove the object (watchers get DELETED with its last state)."""
        with self._cond:
            obj = self._objects[plural][self._key(plural, namespace, name)]
            self._record(plural, "DELETED", copy.deepcopy(obj))

    def get(self, plural: str, name: str, *, namespace: str = "default") -> dict[str, Any]:
        with self._cond:
            return copy.deepcopy(self._objects[plural][self._key(plural, namespace, name)])

    def set_summary(self, node: str, summary: dict[str, Any] | None) -> None:
        """What the node's kubelet answers to ``/stats/summary`` from now on (None: it does not answer)."""
        with self._cond:
            if summary is None:
                self._summaries.pop(node, None)
            else:
                self._summaries[node] = copy.deepcopy(summary)

    def bookmark(self) -> int:
        """Send every open watch a BOOKMARK at a new resourceVersion; that version."""
        with self._cond:
            self._revision += 1
            self._append(_Change(self._revision, None, "BOOKMARK", {}))
            self._cond.notify_all()
            return self._revision

    def compact(self) -> None:
        """Forget the history: a watch from any resourceVersion seen so far gets 410 Gone."""
        with self._cond:
            self._compacted = self._revision
            self._history.clear()
            self._revisions.clear()

    @contextmanager
    def outage(self) -> Iterator[None]:
        """Break every open watch now and answer 503 to every request until the block ends."""
        with self._cond:
            self._down = True
            self._generation += 1
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._down = False

    def count(self, method: str, plural: str, *, watch: bool = False) -> int:
        """How many requests of that kind were answered (lists: ``watch`` False)."""
        with self._cond:
            return sum(
                1
                for m, p, q in self.requests
                if m == method and p == plural and (q.get("watch") == "true") == watch
            )

    def _append(self, change: _Change) -> None:
        self._history.append(change)
        self._revisions.append(change.resource_version)

    def _wake(self, generation: int, deadline: float, position: int) -> bool:
        """Under the lock: whether a watch stream has something to do."""
        return (
            self._stopping
            or self._generation != generation
            or time.monotonic() >= deadline
            or (bool(self._revisions) and self._revisions[-1] > position)
        )

    def _key(self, plural: str, namespace: str, name: str) -> tuple[str, str]:
        return (namespace if KINDS[plural].namespaced else "", name)

    def _record(self, plural: str, change: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Under the lock: a new revision for ``obj``, stored (or removed) and put in the history."""
        self._revision += 1
        obj["metadata"]["resourceVersion"] = str(self._revision)
        key = self._key(plural, obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if change == "DELETED":
            del self._objects[plural][key]
        else:
            self._objects[plural][key] = obj
        self._append(_Change(self._revision, plural, change, copy.deepcopy(obj)))
        self._cond.notify_all()
        return copy.deepcopy(obj)

    # --- HTTP -------------------------------------------------------------------------------------

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                fake._serve(self, "GET")

            def do_POST(self) -> None:
                fake._serve(self, "POST")

            def do_PUT(self) -> None:
                fake._serve(self, "PUT")

            def do_PATCH(self) -> None:
                fake._serve(self, "PATCH")

            def do_DELETE(self) -> None:
                fake._serve(self, "DELETE")

        return Handler

    def _parse(self, path: str) -> _Request | None:
        url = urlparse(path)
        parts = url.path.strip("/").split("/")
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
        group = "" if parts[:1] == ["api"] else parts[1] if len(parts) > 1 else ""
        namespace = None
        if rest[:1] == ["namespaces"] and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        kind = _ROUTES.get((group, rest[0])) if rest else None
        subresource = rest[2] if len(rest) == 3 else None
        if kind is None or len(rest) > 3 or (kind.group == KUEUE and not self.kueue):
            return None
        if subresource is not None and (subresource != "scale" or kind.plural not in _SCALABLE):
            return None
        return _Request(kind, namespace, rest[1] if len(rest) >= 2 else None, query, subresource)

    def _proxied_summary(self, path: str) -> tuple[int, dict[str, Any]] | None:
        """The answer to a node proxy's ``stats/summary`` request; None for any other path."""
        parts = urlparse(path).path.strip("/").split("/")
        if parts[:3] != ["api", "v1", "nodes"] or parts[4:] != ["proxy", "stats", "summary"]:
            return None
        node = parts[3]
        with self._cond:
            self.requests.append(("GET", "nodes/proxy", {"node": node}))
            if ("", node) not in self._objects["nodes"]:
                return 404, _status(404, "NotFound", f'nodes "{node}" not found')
            summary = self._summaries.get(node)
        if summary is None:
            message = f"error trying to reach service: dial tcp {node}:10250: connect: connection refused"
            return 503, _status(503, "ServiceUnavailable", message)
        return 200, copy.deepcopy(summary)

    def _discovery(self, path: str) -> dict[str, Any] | None:
        """The APIResourceList of ``/apis/{group}/{version}`` (``/api/v1``) where it serves kinds."""
        parts = urlparse(path).path.strip("/").split("/")
        if parts[:1] == ["api"] and len(parts) == 2:
            group, version = "", parts[1]
        elif parts[:1] == ["apis"] and len(parts) == 3:
            group, version = parts[1], parts[2]
        else:
            return None
        if group == KUEUE and not self.kueue:
            return None
        kinds = [k for k in KINDS.values() if (k.group, k.version) == (group, version)]
        if not kinds:
            return None
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": kinds[0].api_version,
            "resources": [
                {"name": k.plural, "kind": k.kind, "namespaced": k.namespaced, "verbs": VERBS} for k in kinds
            ],
        }

    def _serve(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        handler.close_connection = True
        request = self._parse(handler.path)
        with self._cond:
            if request is not None:
                self.requests.append((method, request.kind.key, request.query))
                self.access.append(_access(method, request))
            down = self._down
        if down:
            return self._reply(handler, 503, _status(503, "ServiceUnavailable", "the fake is down"))
        proxied = self._proxied_summary(handler.path) if method == "GET" else None
        if proxied is not None:
            return self._reply(handler, *proxied)
        discovery = self._discovery(handler.path) if method == "GET" else None
        if discovery is not None:
            return self._reply(handler, 200, discovery)
        if request is None:
            return self._reply(handler, 404, _status(404, "NotFound", f"no route for {handler.path}"))
        group, resource, verb = _access(method, request)
        if self.allow is not None and (group, resource, verb) not in self.allow:
            what = f'{request.kind.plural}{"." + group if group else ""} "{request.name or ""}"'
            message = (
                f'{what} is forbidden: User "system:serviceaccount:test" cannot {verb} resource '
                f'"{resource}" in API group "{group}" in the namespace "{request.namespace or ""}"'
            )
            return self._reply(handler, 403, _status(403, "Forbidden", message))
        length = int(handler.headers.get("Content-Length") or 0)
        body = json.loads(handler.rfile.read(length)) if length else None
        if method in ("POST", "PUT", "PATCH") and not isinstance(body, dict):
            return self._reply(handler, 400, _status(400, "BadRequest", "the request has no JSON object"))
        content_type = (handler.headers.get("Content-Type") or "").split(";")[0].strip()
        if method == "PATCH" and content_type not in _MERGE_PATCHES:
            message = f"the body of the request was in an unknown format ({content_type}); accepted: "
            return self._reply(
                handler, 415, _status(415, "UnsupportedMediaType", message + ", ".join(_MERGE_PATCHES))
            )
        if method == "GET" and request.query.get("watch") == "true":
            with suppress(BrokenPipeError, ConnectionResetError):  # the watcher hung up first
                self._watch(handler, request)
            return
        code, answer = self._crud(method, request, body)
        if method != "GET" and 200 <= code < 300:
            meta = answer.get("metadata", {})
            with self._cond:
                self.writes.append(
                    Write(
                        method,
                        request.kind.key,
                        request.namespace or "",
                        request.name or meta.get("name", ""),
                        request.subresource,
                        body,
                    )
                )
        self._reply(handler, code, answer)

    def _crud(
        self, method: str, request: _Request, body: dict[str, Any] | None
    ) -> tuple[int, dict[str, Any]]:
        plural = request.kind.key
        with self._cond:
            if method == "GET" and request.name is None:
                selector = request.query.get("labelSelector", "")
                items = [
                    copy.deepcopy(o)
                    for (ns, _), o in self._objects[plural].items()
                    if (request.namespace is None or ns == request.namespace)
                    and _selects(selector, o["metadata"].get("labels") or {})
                ]
                return 200, {
                    "kind": f"{request.kind.kind}List",
                    "apiVersion": request.kind.api_version,
                    "metadata": {"resourceVersion": str(self._revision)},
                    "items": items,
                }
            key = self._key(
                plural,
                request.namespace or "",
                request.name or (body or {}).get("metadata", {}).get("name") or "",
            )
            current = self._objects[plural].get(key)
            if method == "GET":
                if current is None:
                    return 404, _status(404, "NotFound", f'{plural} "{key[1]}" not found')
                return 200, copy.deepcopy(current)
            if method == "DELETE":
                if current is None:
                    return 404, _status(404, "NotFound", f'{plural} "{key[1]}" not found')
                self._record(plural, "DELETED", copy.deepcopy(current))
                success = _status(200, "", "") | {"status": "Success"}
                return 200, success | {
                    "details": {"name": key[1], "kind": plural, "uid": current["metadata"]["uid"]}
                }
            assert body is not None
            if method == "PATCH":
                if current is None:
                    return 404, _status(404, "NotFound", f'{plural} "{key[1]}" not found')
                return 200, self._patch(plural, copy.deepcopy(current), body, request.subresource)
            if method == "POST":
                if current is not None:
                    return 409, _status(409, "AlreadyExists", f'{plural} "{key[1]}" already exists')
                body["metadata"].setdefault("uid", str(uuid.uuid4()))
                return 201, self._record(plural, "ADDED", body)
            if current is None:
                return 404, _status(404, "NotFound", f'{plural} "{key[1]}" not found')
            if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                return 409, _status(
                    409, "Conflict", "the object has been modified; please apply your changes"
                )
            return 200, self._record(plural, "MODIFIED", body)

    def _patch(
        self, plural: str, obj: dict[str, Any], patch: dict[str, Any], subresource: str | None
    ) -> dict[str, Any]:
        """Under the lock: ``obj`` with ``patch`` merged in, stored; the object or its Scale."""
        if subresource is None:
            _merge(obj, patch)
            return self._record(plural, "MODIFIED", obj)
        replicas = (patch.get("spec") or {}).get("replicas")
        if replicas is not None:
            obj.setdefault("spec", {})["replicas"] = replicas
        stored = self._record(plural, "MODIFIED", obj)
        meta = stored["metadata"]
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion")},
            "spec": {"replicas": stored["spec"].get("replicas", 1)},
            "status": {"replicas": (stored.get("status") or {}).get("replicas", 0)},
        }

    def _watch(self, handler: BaseHTTPRequestHandler, request: _Request) -> None:
        since = int(request.query.get("resourceVersion") or 0)
        bookmarks = request.query.get("allowWatchBookmarks") == "true"
        deadline = time.monotonic() + float(request.query.get("timeoutSeconds") or 1800)
        with self._cond:
            generation = self._generation
            expired = since < self._compacted
        gone = _status(410, "Expired", f"too old resource version: {since} ({self._compacted})")
        if expired and self.gone_as == "status":
            return self._reply(handler, 410, gone)
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Connection", "close")  # each connection serves one request
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        if expired:
            self._send(handler, [{"type": "ERROR", "object": gone}])
            return self._end(handler)
        position = since
        while True:
            with self._cond:
                self._cond.wait_for(
                    partial(self._wake, generation, deadline, position),
                    timeout=max(0.0, deadline - time.monotonic()),
                )
                if self._stopping or self._generation != generation:
                    return  # the connection breaks without the final chunk, as in a real outage
                changes = self._history[bisect.bisect_right(self._revisions, position) :]
                timed_out = time.monotonic() >= deadline
                revision = self._revision
            events = [self._event(request, c, bookmarks) for c in changes]
            if changes:
                position = changes[-1].resource_version
            if timed_out and bookmarks:
                events.append(self._bookmark(request.kind, revision))
            self._send(handler, [e for e in events if e is not None])
            if timed_out:
                return self._end(handler)

    def _event(self, request: _Request, change: _Change, bookmarks: bool) -> dict[str, Any] | None:
        if change.plural is None:
            return self._bookmark(request.kind, change.resource_version) if bookmarks else None
        namespace = change.object["metadata"].get("namespace")
        if change.plural != request.kind.key or request.namespace not in (None, namespace):
            return None
        return {"type": change.type, "object": change.object}

    @staticmethod
    def _bookmark(kind: Kind, revision: int) -> dict[str, Any]:
        return {
            "type": "BOOKMARK",
            "object": {
                "kind": kind.kind,
                "apiVersion": kind.api_version,
                "metadata": {"resourceVersion": str(revision)},
            },
        }

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, events: list[dict[str, Any]]) -> None:
        if events:
            data = b"".join(json.dumps(e).encode() + b"\n" for e in events)
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            handler.wfile.flush()

    @staticmethod
    def _end(handler: BaseHTTPRequestHandler) -> None:
        handler.wfile.write(b"0\r\n\r\n")
        handler.wfile.flush()

    @staticmethod
    def _reply(handler: BaseHTTPRequestHandler, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        handler.send_response(code)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Connection", "close")  # each connection serves one request
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
