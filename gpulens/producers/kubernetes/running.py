"""The watcher process: lead (optionally), restore the published state, watch, publish.

One thread per watched resource pulls from its watch (:mod:`~gpulens.producers.kubernetes.watching`)
into one queue, as does the thread reading volume usage (:mod:`~gpulens.producers.kubernetes.usage`);
the calling thread alone reconciles and publishes, so the state needs no locks. Workloads are
listed before pods so that the first pod events carry full owner chains; claims, StorageClasses
and a first round of usage come before PersistentVolumes, so that a volume's first event is whole.
A session (restore, watch, publish) lasts while this replica leads; losing the lease ends it
after a flush, and a new session starts from the topics again when leadership comes back.
While it leads, the watcher vouches every ``watermark_interval_s`` that every change it
stamped before then is on the broker (:class:`~gpulens.producers.watermarking.WallClockWatermarks`):
the worker advances the cluster's event time by that, quiet stretches included.
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
from gpulens.producers.kubernetes.resources import (
    CLAIMS,
    KUEUE_WORKLOADS,
    NODES,
    PERSISTENT_VOLUMES,
    PODS,
    STORAGE_CLASSES,
    TOPICS,
    ResourceKind,
    workload_kinds,
)
from gpulens.producers.kubernetes.settings import WatcherSettings
from gpulens.producers.kubernetes.translating import Translator
from gpulens.producers.kubernetes.usage import KEY as USAGE_KEY
from gpulens.producers.kubernetes.usage import Measured, measure, poll
from gpulens.producers.kubernetes.volumes import VolumeTranslator
from gpulens.producers.kubernetes.watching import (
    Backoff,
    Listed,
    WatchItem,
    infinite_watch,
    list_objects,
    served,
)
from gpulens.producers.publishing import EventPublisher
from gpulens.producers.watermarking import WallClockWatermarks
from gpulens.schemas.model.models import Event

log = logging.getLogger(__name__)

_POLL_S = 0.1
_Item = WatchItem | Measured | Exception
_Items = queue.Queue[_Item]
_Stage = tuple[set[str], tuple[ResourceKind, ...]]
"""What a stage waits for (resource keys listed, or the first usage round) and what it starts."""


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
        self._workloads: tuple[ResourceKind, ...] = ()
        """The workload kinds watched: set by :meth:`_discover` at each session."""
        self._volumes = (
            VolumeTranslator(translator.cluster, translator.source, settings.storage_kinds)
            if settings.storage
            else None
        )
        self._measuring = settings.storage and settings.storage_usage_interval_s > 0

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

    def run_once(self) -> int:
        """Restore, list every resource once, publish the differences, flush, and vouch for the
        wall clock before the flush, less ``watermark_lag_s``: ``watch --once``. A cron of it keeps
        its cluster's event time moving as the live watcher does. The number of changes published."""
        reconciler = self._reconciler()
        backoff = Backoff(self._settings, threading.Event())
        self._discover(backoff)
        context = (CLAIMS, STORAGE_CLASSES) if self._volumes else ()
        for resource in (*self._workloads, *context, NODES, PODS):
            listed = list_objects(self._api, resource, settings=self._settings, backoff=backoff)
            if listed is not None:
                self._publish(reconciler.handle(listed))
        if self._measuring:
            self._publish(reconciler.handle(measure(self._api)))
        if self._volumes:
            listed = list_objects(self._api, PERSISTENT_VOLUMES, settings=self._settings, backoff=backoff)
            if listed is not None:
                self._publish(reconciler.handle(listed))
        self._publisher.flush()
        changes = self._publisher.published
        self._watermarks().tick()  # the first tick vouches at once
        self._publisher.flush()
        return changes

    def _watermarks(self) -> WallClockWatermarks:
        return WallClockWatermarks(
            self._publisher,
            cluster=self._translator.cluster,
            source=self._translator.source,
            every_s=self._settings.watermark_interval_s,
            lag_s=self._settings.watermark_lag_s,
            now=_now,
        )

    def _discover(self, backoff: Backoff) -> None:
        """The workload kinds to watch: Kueue's Workloads too where configured, or served when
        the setting is unset (an API server without Kueue answers 404 for them)."""
        kueue = self._settings.kueue
        if kueue is None:
            kueue = served(self._api, KUEUE_WORKLOADS, backoff=backoff)
            log.info("Kueue's Workloads %s", "are served: watching them" if kueue else "are not served")
        kinds = workload_kinds(self._settings)
        self._workloads = (*kinds, KUEUE_WORKLOADS) if kueue else kinds

    def _reconciler(self) -> Reconciler:
        return Reconciler(self._translator, self._restore(), clock=_now, volumes=self._volumes)

    def _stages(self) -> tuple[tuple[ResourceKind, ...], list[_Stage]]:
        """The resources watched at once, and the later stages."""
        first = self._workloads
        stages: list[_Stage] = [({r.key for r in self._workloads}, (NODES, PODS))]
        if self._volumes:
            first += (CLAIMS, STORAGE_CLASSES)
            waits = {CLAIMS.key, STORAGE_CLASSES.key} | ({USAGE_KEY} if self._measuring else set())
            stages.append((waits, (PERSISTENT_VOLUMES,)))
        return first, stages

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
        self._discover(Backoff(self._settings, stop))
        reconciler = self._reconciler()
        watermarks = self._watermarks()
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

        first, stages = self._stages()
        start(first)
        if self._measuring:
            thread = threading.Thread(target=self._measure, args=(items, ending), name="volume-usage")
            thread.start()
            threads.append(thread)
        try:
            while active():
                watermarks.tick()
                try:
                    item = items.get(timeout=_POLL_S)
                except queue.Empty:
                    continue
                if isinstance(item, Exception):
                    raise item
                self._publish(reconciler.handle(item))
                done = item.resource.key if isinstance(item, Listed) else USAGE_KEY
                for waits, resources in stages:
                    if done in waits:
                        waits.discard(done)
                        if not waits:
                            start(resources)
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
        try:
            for item in infinite_watch(self._api, resource, settings=self._settings, stop=ending):
                _put(items, ending, item)
        except Exception as err:  # surfaces in the session's thread, which stops everything
            _put(items, ending, err)

    def _measure(self, items: _Items, ending: threading.Event) -> None:
        try:
            poll(
                self._api,
                self._settings.storage_usage_interval_s,
                lambda measured: _put(items, ending, measured),
                ending,
            )
        except Exception as err:  # as in _pump
            _put(items, ending, err)


def _put(items: _Items, ending: threading.Event, item: _Item) -> None:
    """Queue ``item`` unless the session ends first."""
    while not ending.is_set():
        try:
            items.put(item, timeout=_POLL_S)
            return
        except queue.Full:
            continue
