"""Conflicting duplicates: a second record under an existing ``event_id`` with other content.

Event ids are deterministic (:func:`gpulens.schemas.model.ids.event_id`): the same observation sent twice
(a producer's retry, a replay, a redelivery after a crash) has the same id and the same
bytes, and the tables' ReplacingMergeTree stores it once. The same id with other content is
a producer bug; stored, it would silently replace the first row. The sink dead-letters it as
``conflicting-duplicate`` instead, so the first stays.

Detection horizon: the ids this sink process has seen most recently, between ``horizon`` less
a tenth of it and ``horizon`` of them. The newest tenth is a dict; each time it fills, it joins
the older ids, kept as sorted arrays (16 bytes of hashes and 8 of schema id and age an id) from
which the oldest tenth is dropped. A conflict with an id older than that, or seen before the
sink restarted, is not detected (the newer row replaces the older one, as before). Content is
compared by a 64-bit hash of the record's bytes, under the same writer schema id only: a record
re-encoded under another schema version is not called a conflict, since its bytes differ for a
reason that is not the producer's.

An id is remembered by its 64-bit hash, not its text. Two generations of dicts, before, held
113 bytes an id; now about 35 (``tracemalloc``, 500,000 ids made and dropped one by one, as
the sink's are: 69 at most while a tenth joins the arrays). Through a horizon of 500,000 (80 s
at 100,000 GPUs), 1.5 million such ids grew a process on jemalloc, as the sink runs, by 36-39
MB against 65-70, at 3.18-4.34 us a record against 3.15-3.71 (ids made included; the two codes
alternating, loop 1.98-2.83 CPU-s: ``python -m bench.machine_speed``); a tenth joining takes
35-76 ms, 92-99 where the filter is rebuilt.
Two ids of one horizon with the same hash (odds about 1 in 10^8 for a full horizon) would
be compared as one: a false conflict only where their contents differ too.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left

import numpy as np

from gpulens.schemas.model.models import EVENT_TYPES, Event, Record

__all__ = ["CONFLICTING_DUPLICATE", "DuplicateGuard"]

CONFLICTING_DUPLICATE = "conflicting-duplicate"
"""The dead-letter reason of a record whose ``event_id`` was seen with other content."""

_HEADER = 5
"""Bytes of the Confluent header (magic byte, schema id) before the Avro body."""
_HASH_BITS = 64
_HASH_MASK = (1 << _HASH_BITS) - 1


_GENERATIONS = 10
"""Parts of the horizon: the newest is a dict, the older ones arrays, the oldest dropped whole."""
_FORGOTTEN = -1
"""Age of an id in the arrays that :meth:`DuplicateGuard.forget` took back."""
_FILTER_BITS = 1 << 24
"""Bits of the filter telling an id the arrays do not hold (2 MB; at a full horizon of 500,000
about 3 % of new ids are searched for nothing): most ids are new, and a search of the arrays
costs a Python int per step."""
_FILTER_MASK = _FILTER_BITS - 1


class DuplicateGuard:
    """Remembers ``event_id`` → content of recent producer events; says which ones conflict."""

    def __init__(self, horizon: int) -> None:
        if horizon < 2:
            raise ValueError(f"a horizon of {horizon} ids remembers nothing")
        self._young_most = max(1, horizon // _GENERATIONS)
        self._kept = horizon // self._young_most - 1
        """Generations the arrays hold besides the young one."""
        self._young: dict[int, int] = {}
        """hash(event_id) → writer schema id above the body's hash (ints: no id text kept)."""
        self._generation = 0
        """The young generation's number; the arrays' ids are of the ones before it."""
        self._names = array("Q")
        """The older ids' hashes, sorted (searched in place: :func:`bisect.bisect_left`)."""
        self._hashes = array("Q")
        """Each older id's content hash."""
        self._schemas = array("I")
        """Each older id's writer schema id."""
        self._ages = array("i")
        """Each older id's generation (:data:`_FORGOTTEN` once forgotten)."""
        self._filter = bytearray(_FILTER_BITS // 8)
        """Bit ``hash & (_FILTER_BITS - 1)`` set for each id the arrays hold."""

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
        name = hash(key) & _HASH_MASK
        young = self._young
        first = young.get(name)
        if first is None:
            at = self._at(name)
            if at is not None:
                first = self._schemas[at] << _HASH_BITS | self._hashes[at]
            if len(young) >= self._young_most:
                young = self._age()
            young[name] = seen if first is None else first
        if first is None or first == seen or first >> _HASH_BITS != schema_id:
            return None
        return f"event_id {key!r} was first seen with other content; the first is kept"

    def forget(self, key: str, value: bytes) -> None:
        """Forget ``key`` where ``value`` is the content remembered for it: a record checked
        before it was decoded and then found undecodable is not a first that later ones conflict with."""
        seen = int.from_bytes(value[1:_HEADER]) << _HASH_BITS | hash(value) & _HASH_MASK
        name = hash(key) & _HASH_MASK
        if self._young.get(name) == seen:
            del self._young[name]
        at = self._at(name)
        if at is not None and self._schemas[at] << _HASH_BITS | self._hashes[at] == seen:
            self._ages[at] = _FORGOTTEN

    def _at(self, name: int) -> int | None:
        """Where the arrays hold ``name``, if they do and it is not forgotten."""
        bit = name & _FILTER_MASK
        if not self._filter[bit >> 3] >> (bit & 7) & 1:
            return None
        names = self._names
        at = bisect_left(names, name)
        return at if at < len(names) and names[at] == name and self._ages[at] != _FORGOTTEN else None

    def _age(self) -> dict[int, int]:
        """The young generation joins the arrays, the oldest one held there leaves; the new young one."""
        young, count = self._young, len(self._young)
        contents = list(young.values())
        joining = np.fromiter(young, np.uint64, count)
        order = np.argsort(joining)
        joining = joining[order]
        hashes = np.fromiter((c & _HASH_MASK for c in contents), np.uint64, count)[order]
        schemas = np.fromiter((c >> _HASH_BITS for c in contents), np.uint32, count)[order]
        held = np.frombuffer(self._names, dtype=np.uint64)
        ages = np.frombuffer(self._ages, dtype=np.int32)
        kept = (ages != _FORGOTTEN) & (ages > self._generation - self._kept)
        at = np.minimum(np.searchsorted(held, joining), max(len(held) - 1, 0))
        if len(held):  # an id the young generation remembered again leaves its older self
            kept[at[held[at] == joining]] = False
        names = held[kept]
        where = np.searchsorted(names, joining)
        self._names = array("Q", np.insert(names, where, joining).tobytes())
        self._hashes = array(
            "Q", np.insert(np.frombuffer(self._hashes, np.uint64)[kept], where, hashes).tobytes()
        )
        self._schemas = array(
            "I", np.insert(np.frombuffer(self._schemas, np.uint32)[kept], where, schemas).tobytes()
        )
        self._ages = array("i", np.insert(ages[kept], where, self._generation).tobytes())
        self._generation += 1
        if self._generation % (self._kept + 1):  # the young ids' bits join the filter
            _set_bits(self._filter, joining)
        else:  # every id held has joined since the last rebuild: the bits of those gone leave
            self._filter = bytearray(_FILTER_BITS // 8)
            _set_bits(self._filter, np.frombuffer(self._names, dtype=np.uint64))
        self._young = {}
        return self._young


def _set_bits(bits: bytearray, names: np.ndarray) -> None:
    """Set the filter's bit of each of ``names`` (by byte, each byte's bits ORed together first)."""
    at = np.sort((names & np.uint64(_FILTER_MASK)).astype(np.int64))
    if not len(at):
        return
    byte = at >> 3
    starts = np.flatnonzero(np.append(True, byte[1:] != byte[:-1]))
    view = np.frombuffer(bits, dtype=np.uint8)
    view[byte[starts]] |= np.bitwise_or.reduceat(np.left_shift(1, at & 7).astype(np.uint8), starts)


_GUARDED = frozenset(EVENT_TYPES)
"""Producers' events; the pipeline's own outputs replace rows on purpose (a window re-emitted)."""
