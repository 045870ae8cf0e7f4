"""Leader election over a coordination.k8s.io/v1 Lease, so that one watcher replica publishes.

As client-go's leaderelection: the holder renews ``spec.renewTime`` every renew interval; a
candidate takes the lease over when it is free (no holder) or when its record has not changed
for a whole lease duration *as the candidate observes it* (its own monotonic clock, so clock
skew between machines does not matter). Writes carry the resourceVersion read, so two
candidates cannot both win: the loser gets 409. The holder counts itself leader only until
its last successful renewal plus the lease duration, and releases the lease on stop so that a
successor need not wait for the expiry.
"""

from __future__ import annotations

import logging
import math
import time
from datetime import UTC, datetime
from typing import Any

from gpulens.producers.kubernetes._types import RawObject
from gpulens.producers.kubernetes.api import KubeApi
from gpulens.producers.kubernetes.exceptions import ConflictError, KubernetesApiError, NotFoundError
from gpulens.producers.kubernetes.settings import LeaseSettings

log = logging.getLogger(__name__)

_LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"


def _micro_time(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    """One candidate; call :meth:`try_acquire_or_renew` every renew interval."""

    def __init__(self, api: KubeApi, settings: LeaseSettings) -> None:
        self._api = api
        self._settings = settings
        self._collection = _LEASES.format(namespace=settings.namespace)
        self._path = f"{self._collection}/{settings.name}"
        self._duration = max(1, math.ceil(settings.duration_s))
        self._valid_until = 0.0
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0

    @property
    def identity(self) -> str:
        """This candidate's holderIdentity."""
        return self._settings.identity

    @property
    def leading(self) -> bool:
        """Whether this candidate holds the lease now (renewed within the lease duration)."""
        return time.monotonic() < self._valid_until

    def try_acquire_or_renew(self) -> bool:
        """Take or renew the lease if allowed; whether this candidate leads now."""
        started = time.monotonic()
        try:
            lease = self._api.request("GET", self._path)
        except NotFoundError:
            return self._write("POST", self._collection, self._new_lease(), started)
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        if holder and holder != self.identity and not self._expired(lease, started):
            self._valid_until = 0.0
            return False
        if holder != self.identity:
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
            spec["acquireTime"] = _micro_time(datetime.now(UTC))
            log.info("lease %s: %s takes over from %s", self._path, self.identity, holder or "nobody")
        spec.update(self._holder_fields())
        lease["spec"] = spec
        return self._write("PUT", self._path, lease, started)

    def release(self) -> None:
        """Give the lease up now if held, so that another candidate takes over at once."""
        if not self.leading:
            return
        self._valid_until = 0.0
        try:
            lease = self._api.request("GET", self._path)
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            lease["spec"].update(holderIdentity=None, leaseDurationSeconds=1)
            self._api.request("PUT", self._path, body=lease)
        except KubernetesApiError as err:  # it expires on its own; nothing more to do
            log.warning("lease %s not released: %s", self._path, err)

    def _expired(self, lease: RawObject, now: float) -> bool:
        """Whether the lease record stayed the same for a whole lease duration, by our clock."""
        spec = lease.get("spec") or {}
        record = (spec.get("holderIdentity"), spec.get("renewTime"), lease["metadata"].get("resourceVersion"))
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = spec.get("leaseDurationSeconds") or self._duration
        return now - self._observed_at >= duration

    def _write(self, method: str, path: str, lease: RawObject, started: float) -> bool:
        try:
            self._api.request(method, path, body=lease)
        except ConflictError:  # another candidate wrote first
            self._valid_until = 0.0
            return False
        self._valid_until = started + self._duration
        return True

    def _holder_fields(self) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self._duration,
            "renewTime": _micro_time(datetime.now(UTC)),
        }

    def _new_lease(self) -> RawObject:
        now = _micro_time(datetime.now(UTC))
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self._settings.name, "namespace": self._settings.namespace},
            "spec": {**self._holder_fields(), "acquireTime": now, "leaseTransitions": 0},
        }
