"""Decide what to publish: compare each observation with the last state published for its entity.

The comparison is on a fingerprint of the translated event without its volatile fields
(event id and time, resourceVersion, change type), so an update that changes nothing we
publish (a node heartbeat, managedFields, a new resourceVersion) publishes nothing, and a
relist publishes only what differs: new objects, changed ones, and a DELETED event for every
known entity the relist no longer has. The state starts from what was published before (read
back from the topics), which is what makes a restart or a new leader continue without
duplicates or gaps.
"""

from __future__ import annotations

import hashlib
import json
from collections import ChainMap, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

from gpulens.producers.kubernetes._types import RawObject
from gpulens.producers.kubernetes.resources import ResourceKind, Role
from gpulens.producers.kubernetes.translating import Translator, as_deleted, controller_of, parse_time
from gpulens.producers.kubernetes.watching import Changed, Listed, WatchItem
from gpulens.schemas.model.models import ChangeType, Event, OwnerReference

PublishedState = Mapping[str, Mapping[str, Event]]
"""Resource key (``Pod``, ``Deployment.apps``) -> entity key (node name or uid) -> last event."""

_VOLATILE = frozenset({"event_id", "event_time", "resource_version", "type"})


def fingerprint(event: Event) -> str:
    """A digest of what the event says about its entity, whatever its id, time and version."""
    body = json.dumps(event.model_dump(mode="json", exclude=set(_VOLATILE)), sort_keys=True)
    return hashlib.blake2b(body.encode(), digest_size=16).hexdigest()


def entity_key(resource: ResourceKind, obj: RawObject) -> str:
    """The entity an object is (as in the topic key): node name, else uid."""
    metadata = obj["metadata"]
    return str(metadata["name"] if resource.role is Role.NODE else metadata["uid"])


@dataclass(frozen=True, slots=True)
class _Known:
    event: Event
    fingerprint: str


class Reconciler:
    """Turns watch items into the events worth publishing; keeps the last published state."""

    def __init__(
        self, translator: Translator, published: PublishedState, *, clock: Callable[[], datetime]
    ) -> None:
        self._translator = translator
        self._clock = clock
        self._known: defaultdict[str, dict[str, _Known]] = defaultdict(dict)
        for resource_key, events in published.items():
            self._known[resource_key] = {k: _Known(e, fingerprint(e)) for k, e in events.items()}
        self._parents: defaultdict[str, dict[str, OwnerReference]] = defaultdict(dict)

    def handle(self, item: WatchItem) -> list[Event]:
        """The events ``item`` calls for, in order (often none)."""
        if isinstance(item, Changed):
            event = self._observe(item.resource, item.object, item.type)
            return [] if event is None else [event]
        return self._relisted(item)

    def _relisted(self, listed: Listed) -> list[Event]:
        resource = listed.resource
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
        return self._translator.workload(resource, obj, change=change, at=at)

    def _remember_parent(self, resource: ResourceKind, uid: str, obj: RawObject, *, deleted: bool) -> None:
        parents = self._parents[resource.key]
        parent = None if deleted else controller_of(obj)
        if parent is None:
            parents.pop(uid, None)
        else:
            parents[uid] = parent
