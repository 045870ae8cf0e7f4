"""The watcher process: lead (optionally), restore the published state, watch, publish.

One thread per watched resource pulls from its watch (:mod:`~gpulens.producers.kubernetes.watching`)
into one queue; the calling thread alone reconciles and publishes, so the state needs no
locks. Workloads are listed before pods so that the first pod events carry full owner chains.
A session (restore, watch, publish) lasts while this replica leads; losing the lease ends it
after a flush, and a new session starts from the topics again when leadership comes back.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

from gpulens.producers.kubernetes.api import KubeApi
from gpulens.producers.kubernetes.leading import LeaseElector
from gpulens.producers.kubernetes.reconciling import PublishedState, Reconciler
from gpulens.producers.kubernetes.resources import NODES, PODS, TOPICS, ResourceKind, workload_kinds
from gpulens.producers.kubernetes.settings import WatcherSettings
from gpulens.producers.kubernetes.translating import Translator
from gpulens.producers.kubernetes.watching import Backoff, Listed, WatchItem, infinite_watch, list_objects
from gpulens.producers.publishing import EventPublisher
from gpulens.schemas.model.models import Event

log = logging.getLogger(__name__)

_POLL_S = 0.1
_Items = queue.Queue[WatchItem | Exception]


def _now() -> datetime:
    return datetime.now(UTC)


class Watcher:
    """Watches one cluster and publishes every relevant change once."""

    def __init__(
        self,
        *,
        api: KubeApi,
        settings: WatcherSettings,
        translator: Translator,
        publisher: EventPublisher,
        restore: Callable[[], PublishedState],
        elector: LeaseElector | None = None,
    ) -> None:
        self._api = api
        self._settings = settings
        self._translator = translator
        self._publisher = publisher
        self._restore = restore
        self._elector = elector
        self._workloads = workload_kinds(settings)

    def run(self, stop: threading.Event) -> None:
        """Watch and publish while leading, until ``stop`` is set; then flush and release the lease."""
        elector = self._elector
        if elector is None:
            self._session(stop, lambda: not stop.is_set())
            return
        electing = threading.Thread(target=self._elect, args=(elector, stop), name="lease")
        electing.start()
        try:
            while not stop.is_set():
                if elector.leading:
                    log.info("%s leads: watching", elector.identity)
                    self._session(stop, lambda: elector.leading and not stop.is_set())
                else:
                    stop.wait(_POLL_S)
        finally:
            stop.set()
            electing.join()
            elector.release()

    def run_once(self) -> None:
        """Restore, list every resource once, publish the differences, flush: ``watch --once``."""
        reconciler = Reconciler(self._translator, self._restore(), clock=_now)
        backoff = Backoff(self._settings, threading.Event())
        for resource in (*self._workloads, NODES, PODS):
            listed = list_objects(self._api, resource, settings=self._settings, backoff=backoff)
            if listed is not None:
                self._publish(reconciler.handle(listed))
        self._publisher.flush()

    def _elect(self, elector: LeaseElector, stop: threading.Event) -> None:
        interval = self._settings.lease.renew_interval_s
        while True:
            try:
                elector.try_acquire_or_renew()
            except Exception as err:  # leadership lapses by itself if renewals keep failing
                log.warning("lease renewal failed: %s", err)
            if stop.wait(interval):
                return

    def _session(self, stop: threading.Event, active: Callable[[], bool]) -> None:
        reconciler = Reconciler(self._translator, self._restore(), clock=_now)
        items: _Items = queue.Queue(maxsize=10_000)
        ending = threading.Event()
        threads: list[threading.Thread] = []

        def start(resources: Iterable[ResourceKind]) -> None:
            for resource in resources:
                thread = threading.Thread(
                    target=self._pump, args=(resource, items, ending), name=f"watch-{resource.key}"
                )
                thread.start()
                threads.append(thread)

        unlisted = {r.key for r in self._workloads}
        start(self._workloads)
        try:
            while active():
                try:
                    item = items.get(timeout=_POLL_S)
                except queue.Empty:
                    continue
                if isinstance(item, Exception):
                    raise item
                self._publish(reconciler.handle(item))
                if isinstance(item, Listed) and item.resource.key in unlisted:
                    unlisted.discard(item.resource.key)
                    if not unlisted:
                        start((NODES, PODS))
        finally:
            ending.set()
            while any(t.is_alive() for t in threads):  # interrupt again: a stream may open late
                self._api.interrupt()
                for thread in threads:
                    thread.join(_POLL_S)
            self._publisher.flush()

    def _publish(self, events: Iterable[Event]) -> None:
        for event in events:
            self._publisher.publish(TOPICS[type(event)], event)

    def _pump(self, resource: ResourceKind, items: _Items, ending: threading.Event) -> None:
        def put(item: WatchItem | Exception) -> None:
            while not ending.is_set():
                try:
                    items.put(item, timeout=_POLL_S)
                    return
                except queue.Full:
                    continue

        try:
            for item in infinite_watch(self._api, resource, settings=self._settings, stop=ending):
                put(item)
        except Exception as err:  # surfaces in the session's thread, which stops everything
            put(err)
