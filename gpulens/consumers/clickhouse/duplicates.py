"""Conflicting duplicates: a second record under an existing ``event_id`` with other content.

Event ids are deterministic (:func:`gpulens.schemas.model.ids.event_id`): the same observation sent twice
(a producer's retry, a replay, a redelivery after a crash) has the same id and the same
bytes, and the tables' ReplacingMergeTree stores it once. The same id with other content is
a producer bug; stored, it would silently replace the first row. The sink dead-letters it as
``conflicting-duplicate`` instead, so the first stays.

Detection horizon: the ids this sink process has seen most recently, between ``horizon // 2``
and ``horizon`` of them (two generations of a dict: when the young one is full it becomes the
old one and the previous old one is dropped). A conflict with an id older than that, or seen
before the sink restarted, is not detected (the newer row replaces the older one, as before).
Content is compared by a 64-bit hash of the record's bytes, under the same writer schema id
only: a record re-encoded under another schema version is not called a conflict, since its
bytes differ for a reason that is not the producer's.

An id is remembered by its 64-bit hash, not its text: 113 bytes an id against 147 with the
text kept (500,000 ids made and dropped one by one, as the sink's are: 56 MB at most against
73). Two ids of one horizon with the same hash (odds about 1 in 10^8 for a full horizon) would
be compared as one: a false conflict only where their contents differ too.
"""

from __future__ import annotations

from gpulens.schemas.model.models import EVENT_TYPES, Event, Record

__all__ = ["CONFLICTING_DUPLICATE", "DuplicateGuard"]

CONFLICTING_DUPLICATE = "conflicting-duplicate"
"""The dead-letter reason of a record whose ``event_id`` was seen with other content."""

_HEADER = 5
"""Bytes of the Confluent header (magic byte, schema id) before the Avro body."""
_HASH_BITS = 64
_HASH_MASK = (1 << _HASH_BITS) - 1


class DuplicateGuard:
    """Remembers ``event_id`` → content of recent producer events; says which ones conflict."""

    def __init__(self, horizon: int) -> None:
        if horizon < 2:
            raise ValueError(f"a horizon of {horizon} ids remembers nothing")
        self._half = horizon // 2
        self._young: dict[int, int] = {}
        """hash(event_id) → writer schema id above the body's hash (ints: no id text kept)."""
        self._old: dict[int, int] = {}

    def conflict(self, record: Record, value: bytes) -> str | None:
        """Why ``record`` (decoded from ``value``) conflicts with an earlier one; None if it does
        not (first seen, the same content again, or not a producer event)."""
        if not isinstance(record, Event) or type(record) not in _GUARDED:
            return None
        return self.conflict_of(record.event_id, value)

    def conflict_of(self, key: str, value: bytes) -> str | None:
        """Why the producer event ``key`` in ``value`` (its wire bytes) conflicts with an earlier
        one; None if it does not."""
        schema_id = int.from_bytes(value[1:_HEADER])
        seen = schema_id << _HASH_BITS | hash(value) & _HASH_MASK  # the header too: no copy of the body
        name = hash(key)
        first = self._young.get(name)
        if first is None:
            first = self._old.get(name)
            self._remember(name, seen if first is None else first)
        if first is None or first == seen or first >> _HASH_BITS != schema_id:
            return None
        return f"event_id {key!r} was first seen with other content; the first is kept"

    def forget(self, key: str, value: bytes) -> None:
        """Forget ``key`` where ``value`` is the content remembered for it: a record checked
        before it was decoded and then found undecodable is not a first that later ones conflict with."""
        seen = int.from_bytes(value[1:_HEADER]) << _HASH_BITS | hash(value) & _HASH_MASK
        name = hash(key)
        for generation in (self._young, self._old):
            if generation.get(name) == seen:
                del generation[name]

    def _remember(self, name: int, content: int) -> None:
        if len(self._young) >= self._half:
            self._old, self._young = self._young, {}
        self._young[name] = content


_GUARDED = frozenset(EVENT_TYPES)
"""Producers' events; the pipeline's own outputs replace rows on purpose (a window re-emitted)."""
