"""List, then watch from the list's resourceVersion; resume after each stream; relist on 410.

Modelled on kopf's ``continuous_watch``/``infinite_watch``: one list gives the objects that
exist and a resourceVersion; watches resume from the last resourceVersion seen (bookmarks
included) each time a stream ends, so a server-side ``timeoutSeconds`` or a dropped
connection loses nothing. Only ``410 Gone`` (an HTTP status or an ERROR event) means the
history is gone: :func:`continuous_watch` returns and :func:`infinite_watch` relists, and the
caller compares the relist with what it knew. Temporary failures are retried with the
backoff of the settings; after the last delay the error is raised.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from gpulens.producers.kubernetes._types import RawObject
from gpulens.producers.kubernetes.api import KubeApi, status_error
from gpulens.producers.kubernetes.exceptions import NotFoundError, ResourceExpiredError, TemporaryApiError
from gpulens.producers.kubernetes.resources import ResourceKind
from gpulens.producers.kubernetes.settings import WatcherSettings
from gpulens.schemas.model.models import ChangeType

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Listed:
    """Every object of a resource that exists now (first list or relist)."""

    resource: ResourceKind
    objects: list[RawObject]
    resource_version: str


@dataclass(frozen=True, slots=True)
class Changed:
    """One ADDED, MODIFIED or DELETED watch event."""

    resource: ResourceKind
    type: ChangeType
    object: RawObject


WatchItem = Listed | Changed


class Backoff:
    """The settings' retry delays with jitter; waits are cut short by ``stop``."""

    def __init__(self, settings: WatcherSettings, stop: threading.Event) -> None:
        self._delays = settings.backoff_s
        self._jitter = settings.backoff_jitter
        self._stop = stop
        self._attempt = 0

    def reset(self) -> None:
        """A request succeeded: the next failure starts from the first delay again."""
        self._attempt = 0

    def wait(self, err: TemporaryApiError) -> bool:
        """Sleep before the next attempt (at least the server's Retry-After); True when stopped.

        Raises ``err`` when every delay has been spent.
        """
        if self._attempt >= len(self._delays):
            raise err
        delay = self._delays[self._attempt] * (1 + random.uniform(0, self._jitter))
        self._attempt += 1
        delay = max(delay, err.retry_after or 0.0)
        log.warning("%s; retrying in %.2fs (attempt %d)", err, delay, self._attempt)
        return self._stop.wait(delay)


def list_objects(
    api: KubeApi, resource: ResourceKind, *, settings: WatcherSettings, backoff: Backoff
) -> Listed | None:
    """One list of ``resource`` with retries; None when stopped while retrying."""
    path = resource.path(settings.namespace)
    while True:
        try:
            answer = api.request("GET", path)
        except TemporaryApiError as err:
            if backoff.wait(err):
                return None
            continue
        backoff.reset()
        return Listed(resource, answer.get("items") or [], answer["metadata"]["resourceVersion"])


def served(api: KubeApi, resource: ResourceKind, *, backoff: Backoff) -> bool:
    """Whether the API server serves ``resource`` (its group version's discovery document names
    it); False when stopped while retrying."""
    while True:
        try:
            answer = api.request("GET", resource.group_path)
        except NotFoundError:
            return False
        except TemporaryApiError as err:
            if backoff.wait(err):
                return False
            continue
        backoff.reset()
        return any(r.get("name") == resource.plural for r in answer.get("resources") or ())


def continuous_watch(
    api: KubeApi, resource: ResourceKind, *, settings: WatcherSettings, stop: threading.Event
) -> Iterator[WatchItem]:
    """A list, then its changes, until the history expires (410) or ``stop`` is set."""
    backoff = Backoff(settings, stop)
    listed = list_objects(api, resource, settings=settings, backoff=backoff)
    if listed is None:
        return
    yield listed
    path = resource.path(settings.namespace)
    resource_version = listed.resource_version
    while not stop.is_set():
        query = [
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(settings.watch_timeout_s)),
        ]
        try:
            for event in api.stream(
                path, query=query, timeout_s=settings.watch_timeout_s + settings.request_timeout_s
            ):
                if event["type"] == "ERROR":
                    raise status_error("GET", path, event["object"])
                backoff.reset()
                resource_version = event["object"]["metadata"]["resourceVersion"]
                if event["type"] != "BOOKMARK":
                    yield Changed(resource, ChangeType(event["type"]), event["object"])
        except ResourceExpiredError as err:
            log.info(
                "%s: history expired after resourceVersion %s (%s); relisting",
                resource.key,
                resource_version,
                err.detail,
            )
            return
        except TemporaryApiError as err:
            if stop.is_set() or backoff.wait(err):  # a stream broken by stopping is no failure
                return


def infinite_watch(
    api: KubeApi, resource: ResourceKind, *, settings: WatcherSettings, stop: threading.Event
) -> Iterator[WatchItem]:
    """:func:`continuous_watch` again and again: every 410 becomes a relist, until ``stop``."""
    while not stop.is_set():
        yield from continuous_watch(api, resource, settings=settings, stop=stop)
