"""Errors of the Kubernetes watchers.

    GPULensError
    └── WatcherError
        ├── KubernetesApiError         the API server answered with an error, or could not be reached
        │   ├── TemporaryApiError      retry after a delay: connection failures, 429, 5xx
        │   ├── ResourceExpiredError   410 Gone: the resourceVersion was compacted, relist
        │   └── PermanentApiError      retrying cannot help: 400, 401, 403, ...
        │       ├── NotFoundError      404: the object (or the custom resource definition) is absent
        │       └── ConflictError      409: someone else changed the object first
        └── StateRestoreError          the last published state could not be read back from the topics

Kubernetes client and urllib3 errors are translated into this tree where they enter, in
:mod:`gpulens.producers.kubernetes.api`, confluent-kafka errors of reading back in
:mod:`~gpulens.producers.kubernetes.restoring`; publishing is the shared :mod:`gpulens.producers.publishing`
(its ``PublishError``).
"""

from __future__ import annotations

from gpulens.schemas.model.exceptions import GPULensError


class WatcherError(GPULensError):
    """Root of the Kubernetes watchers' errors."""


class KubernetesApiError(WatcherError):
    """A request to the API server failed; carries the method, path and HTTP status (0: no answer)."""

    def __init__(self, method: str, path: str, status: int, detail: str) -> None:
        super().__init__(f"{method} {path}: {status or 'no answer'}: {detail}")
        self.method = method
        self.path = path
        self.status = status
        self.detail = detail


class TemporaryApiError(KubernetesApiError):
    """Worth retrying after a delay; ``retry_after`` is the server's Retry-After, in seconds."""

    def __init__(
        self, method: str, path: str, status: int, detail: str, *, retry_after: float | None = None
    ) -> None:
        super().__init__(method, path, status, detail)
        self.retry_after = retry_after


class ResourceExpiredError(KubernetesApiError):
    """410 Gone: the history after the requested resourceVersion is gone; only a relist helps."""


class PermanentApiError(KubernetesApiError):
    """Retrying the same request cannot succeed (bad request, forbidden, ...)."""


class NotFoundError(PermanentApiError):
    """404: the object, or the resource type itself (a custom kind whose CRD is missing)."""


class ConflictError(PermanentApiError):
    """409: the object exists already, or changed since the resourceVersion we sent."""


class StateRestoreError(WatcherError):
    """The topics could not be read back to restore the last published state."""
