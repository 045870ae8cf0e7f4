"""The orphan report: what the Focus-Server cleanup found left behind, listed, never changed.

- a Service whose selector matches no pod in its namespace (Services without a selector point
  at endpoints managed by hand and are not listed);
- a finished Job (condition Complete or Failed) whose ``ttlSecondsAfterFinished`` has passed:
  the TTL controller should have deleted it (it is off, or lagging);
- a pending pod whose controlling owner is gone (not found, or found with another uid: a new
  object of the same name). The owner is fetched at ``/apis/<apiVersion>/namespaces/<ns>/
  <kind in lower case + s>/<name>``, the plural of every built-in workload kind and of the
  usual custom ones (PyTorchJob -> pytorchjobs). An owner that may not be read (403: its kind
  is not in the ClusterRole) is not called gone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from gpulens.producers.kubernetes._types import RawObject
from gpulens.producers.kubernetes.api import KubeApi
from gpulens.producers.kubernetes.exceptions import NotFoundError, PermanentApiError

_UNREADABLE = "?"


@dataclass(frozen=True, slots=True)
class Orphan:
    """One object left behind, and why it counts as such."""

    kind: str
    namespace: str
    name: str
    reason: str


def find_orphans(api: KubeApi, *, namespace: str | None = None, now: datetime | None = None) -> list[Orphan]:
    """Orphans in ``namespace`` (every namespace when None), sorted by kind, namespace and name."""
    now = now or datetime.now(UTC)
    where = f"/namespaces/{namespace}" if namespace else ""
    pods = _items(api, f"/api/v1{where}/pods")
    found = _lonely_services(_items(api, f"/api/v1{where}/services"), pods)
    found += _expired_jobs(_items(api, f"/apis/batch/v1{where}/jobs"), now)
    found += _ownerless_pending(api, pods)
    return sorted(found, key=lambda o: (o.kind, o.namespace, o.name))


def _items(api: KubeApi, path: str) -> list[RawObject]:
    items: list[RawObject] = api.request("GET", path).get("items") or []
    return items


def _lonely_services(services: list[RawObject], pods: list[RawObject]) -> list[Orphan]:
    found = []
    for service in services:
        meta = service["metadata"]
        selector: dict[str, str] = (service.get("spec") or {}).get("selector") or {}
        if selector and not any(
            pod["metadata"].get("namespace") == meta.get("namespace")
            and selector.items() <= (pod["metadata"].get("labels") or {}).items()
            for pod in pods
        ):
            wanted = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
            found.append(
                Orphan("Service", meta["namespace"], meta["name"], f"selector {wanted} matches no pod")
            )
    return found


def _expired_jobs(jobs: list[RawObject], now: datetime) -> list[Orphan]:
    found = []
    for job in jobs:
        meta, spec, status = job["metadata"], job.get("spec") or {}, job.get("status") or {}
        ttl = spec.get("ttlSecondsAfterFinished")
        finished = next(
            (
                c
                for c in status.get("conditions") or []
                if c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
            ),
            None,
        )
        if ttl is None or finished is None:
            continue
        at = status.get("completionTime") or finished.get("lastTransitionTime")
        if not at:
            continue
        ended = datetime.fromisoformat(at.replace("Z", "+00:00"))
        if ended + timedelta(seconds=ttl) < now:
            reason = f"{finished['type']} at {at}, ttlSecondsAfterFinished {ttl} passed"
            found.append(Orphan("Job", meta["namespace"], meta["name"], reason))
    return found


def _ownerless_pending(api: KubeApi, pods: list[RawObject]) -> list[Orphan]:
    found = []
    exists: dict[tuple[str, str, str, str], str | None] = {}
    for pod in pods:
        meta = pod["metadata"]
        if (pod.get("status") or {}).get("phase") != "Pending":
            continue
        for owner in meta.get("ownerReferences") or []:
            if not owner.get("controller") or owner["kind"] == "Node":  # a static pod's mirror
                continue
            key = (owner["apiVersion"], owner["kind"], meta["namespace"], owner["name"])
            if key not in exists:
                exists[key] = _uid(api, *key)
            if exists[key] not in (owner["uid"], _UNREADABLE):
                reason = f"owner {owner['kind']}/{owner['name']} ({owner['uid']}) no longer exists"
                found.append(Orphan("Pod", meta["namespace"], meta["name"], reason))
    return found


def _uid(api: KubeApi, api_version: str, kind: str, namespace: str, name: str) -> str | None:
    """The uid of the object now there (None: none; :data:`_UNREADABLE`: not allowed to look)."""
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    try:
        obj = api.request("GET", f"{prefix}/namespaces/{namespace}/{kind.lower()}s/{name}")
    except NotFoundError:
        return None
    except PermanentApiError as err:
        if err.status != 403:
            raise
        return _UNREADABLE
    uid: str | None = obj["metadata"].get("uid")
    return uid
