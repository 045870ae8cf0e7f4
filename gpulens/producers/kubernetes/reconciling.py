"""Decide what to publish: compare each observation with the last state published for its entity.

The comparison is on a fingerprint of the translated event without its volatile fields
(event id and time, resourceVersion, change type), so an update that changes nothing we
publish (a node heartbeat, managedFields, a new resourceVersion) publishes nothing, and a
relist publishes only what differs: new objects, changed ones, and a DELETED event for every
known entity the relist no longer has. The state starts from what was published before (read
back from the topics), which is what makes a restart or a new leader continue without
duplicates or gaps.

Volumes join their context (claims, StorageClasses, kubelet usage; see
:mod:`~gpulens.producers.kubernetes.volumes`): a change of the context observes again the
volumes it touches, which publishes those whose event changed. The usage last published is
the usage known at start, so a restart does not publish every volume again without usage
until the kubelets have been read.
"""

from __future__ import annotations

import hashlib
import json
from collections import ChainMap, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

from gpulens.producers.kubernetes._types import RawObject
from gpulens.producers.kubernetes.resources import PERSISTENT_VOLUMES, ResourceKind, Role
from gpulens.producers.kubernetes.translating import Translator, as_deleted, controller_of, parse_time
from gpulens.producers.kubernetes.usage import Measured
from gpulens.producers.kubernetes.volumes import (
    ClaimKey,
    StorageContext,
    VolumeTranslator,
    VolumeUsage,
    claim_of,
)
from gpulens.producers.kubernetes.watching import Changed, Listed, WatchItem
from gpulens.schemas.model.models import ChangeType, Event, OwnerReference, StorageEvent

PublishedState = Mapping[str, Mapping[str, Event]]
"""Resource key (``Pod``, ``Deployment.apps``) -> entity key (node name or uid) -> last event."""

_BEFORE_ANY_MEASUREMENT = datetime.min.replace(tzinfo=UTC)
_VOLATILE = frozenset({"event_id", "event_time", "resource_version", "type"})


def fingerprint(event: Event) -> str:
    """A digest of what the event says about its entity, whatever its id, time and version."""
    body = json.dumps(event.model_dump(mode="json", exclude=set(_VOLATILE)), sort_keys=True)
    return hashlib.blake2b(body.encode(), digest_size=16).hexdigest()


def entity_key(resource: ResourceKind, obj: RawObject) -> str:
    """The entity an object is (as in the topic key): node name, else uid."""
    metadata = obj["metadata"]
    return str(metadata["name"] if resource.role in (Role.NODE, Role.VOLUME) else metadata["uid"])


@dataclass(frozen=True, slots=True)
class _Known:
    event: Event
    fingerprint: str


class Reconciler:
    """Turns watch items into the events worth publishing; keeps the last published state."""

    def __init__(
        self,
        translator: Translator,
        published: PublishedState,
        *,
        clock: Callable[[], datetime],
        volumes: VolumeTranslator | None = None,
    ) -> None:
        self._translator = translator
        self._volume_translator = volumes
        self._clock = clock
        self._known: defaultdict[str, dict[str, _Known]] = defaultdict(dict)
        for resource_key, events in published.items():
            self._known[resource_key] = {k: _Known(e, fingerprint(e)) for k, e in events.items()}
        self._parents: defaultdict[str, dict[str, OwnerReference]] = defaultdict(dict)
        self._storage = StorageContext()
        self._volumes: dict[str, RawObject] = {}
        self._storage.measured(_published_usage(published.get(PERSISTENT_VOLUMES.key, {}).values()))

    def handle(self, item: WatchItem | Measured) -> list[Event]:
        """The events ``item`` calls for, in order (often none)."""
        if isinstance(item, Measured):
            return self._volumes_of(self._storage.measured(item.reports))
        if item.resource.role in (Role.CLAIM, Role.STORAGE_CLASS):
            return self._context_changed(item)
        if isinstance(item, Changed):
            event = self._observe(item.resource, item.object, item.type)
            return [] if event is None else [event]
        return self._relisted(item)

    def _context_changed(self, item: WatchItem) -> list[Event]:
        """Keep the claims or classes of ``item``; observe again the volumes whose context changed."""
        if item.resource.role is Role.CLAIM:
            claims = _apply(self._storage.claims, _claim_key, item)
            for gone in claims - self._storage.claims.keys():
                self._storage.usage.pop(gone, None)
            return self._volumes_of(claims)
        classes = _apply(self._storage.classes, lambda o: str(o["metadata"]["name"]), item)
        return self._observe_volumes(lambda v: (v.get("spec") or {}).get("storageClassName") in classes)

    def _volumes_of(self, claims: set[ClaimKey]) -> list[Event]:
        """Observe again the volumes bound to ``claims``."""
        return self._observe_volumes(lambda v: claim_of(v) in claims)

    def _observe_volumes(self, which: Callable[[RawObject], bool]) -> list[Event]:
        return [
            event
            for volume in list(self._volumes.values())
            if which(volume) and (event := self._observe(PERSISTENT_VOLUMES, volume, None)) is not None
        ]

    def _relisted(self, listed: Listed) -> list[Event]:
        resource = listed.resource
        if resource.role is Role.VOLUME:
            self._volumes = {entity_key(resource, o): o for o in listed.objects}
        if resource.role is Role.WORKLOAD:
            self._parents[resource.key] = {}
        events = []
        present = set()
        for obj in listed.objects:
            present.add(entity_key(resource, obj))
            event = self._observe(resource, obj, None)
            if event is not None:
                events.append(event)
        known = self._known[resource.key]
        now = self._clock()
        for key in sorted(set(known) - present):
            events.append(as_deleted(known.pop(key).event, at=now))
        return events

    def _observe(self, resource: ResourceKind, obj: RawObject, change: ChangeType | None) -> Event | None:
        """The event for one observation; ``change`` None: seen in a list, ADDED or MODIFIED by state."""
        key = entity_key(resource, obj)
        if resource.role is Role.WORKLOAD:
            self._remember_parent(resource, key, obj, deleted=change is ChangeType.DELETED)
        if resource.role is Role.VOLUME:
            if change is ChangeType.DELETED:
                self._volumes.pop(key, None)
            else:
                self._volumes[key] = obj
        known = self._known[resource.key].get(key)
        if change is ChangeType.DELETED:
            if known is None:  # never published (a pod without GPUs): nothing to retract
                return None
        else:
            change = ChangeType.ADDED if known is None else ChangeType.MODIFIED
        at = self._clock()
        if change is ChangeType.ADDED:  # first sight: the object's own birth is the event time
            at = parse_time(obj["metadata"].get("creationTimestamp")) or at
        event = self._translate(resource, obj, change, at)
        if event is None:
            return None
        if change is ChangeType.DELETED:
            del self._known[resource.key][key]
            return event
        digest = fingerprint(event)
        if known is not None and known.fingerprint == digest:
            return None
        self._known[resource.key][key] = _Known(event, digest)
        return event

    def _translate(
        self, resource: ResourceKind, obj: RawObject, change: ChangeType, at: datetime
    ) -> Event | None:
        if resource.role is Role.NODE:
            return self._translator.node(obj, change=change, at=at)
        if resource.role is Role.POD:
            return self._translator.pod(obj, change=change, at=at, parents=ChainMap(*self._parents.values()))
        if resource.role is Role.VOLUME:
            if self._volume_translator is None:
                return None
            return self._volume_translator.volume(obj, self._storage, change=change, at=at)
        return self._translator.workload(resource, obj, change=change, at=at)

    def _remember_parent(self, resource: ResourceKind, uid: str, obj: RawObject, *, deleted: bool) -> None:
        parents = self._parents[resource.key]
        parent = None if deleted else controller_of(obj)
        if parent is None:
            parents.pop(uid, None)
        else:
            parents[uid] = parent


K = TypeVar("K")


def _apply(store: dict[K, RawObject], key: Callable[[RawObject], K], item: WatchItem) -> set[K]:
    """A list (replaces ``store``) or a change applied to ``store``; the keys it touched."""
    if isinstance(item, Listed):
        touched = set(store) | {key(o) for o in item.objects}
        store.clear()
        store.update((key(o), o) for o in item.objects)
        return touched
    touched_key = key(item.object)
    if item.type is ChangeType.DELETED:
        store.pop(touched_key, None)
    else:
        store[touched_key] = item.object
    return {touched_key}


def _claim_key(obj: RawObject) -> ClaimKey:
    metadata = obj["metadata"]
    return (metadata.get("namespace", ""), metadata["name"])


def _published_usage(events: Iterable[Event]) -> Iterator[VolumeUsage]:
    """The usage each restored volume event carried, older than any measurement to come."""
    for event in events:
        if isinstance(event, StorageEvent) and event.claim and event.used_bytes is not None:
            yield VolumeUsage(
                claim=(event.namespace or "", event.claim),
                time=_BEFORE_ANY_MEASUREMENT,
                used_bytes=event.used_bytes,
                available_bytes=event.available_bytes,
            )
