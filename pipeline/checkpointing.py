"""Checkpoints: a cycle's outputs, state changes and input positions as one Kafka transaction.

Every stateful part of the worker (each operator, and the worker's own input positions)
implements :class:`Stateful`: it names the keys it changed since the last checkpoint and can
dump and load one key's value. A :class:`Checkpoint` owns the transactional producer and one
state log per part, ``gpulens.worker.<group>.<part>.changelog`` (see
:mod:`schemas.state_log`), and commits, in one transaction, the rows the cycle produced, the
changed keys of every part and the input offsets. A crash, kill -9 included, therefore leaves
state, outputs and offsets of the same cycle or of none.

Changelog format (documented, language-neutral): key = the UTF-8 JSON array of the state key
(``["pod", "cluster-a", "uid-1"]``), value = the UTF-8 JSON of what the part dumps for it, or
null when the key is gone. Each part documents its keys beside its ``dump``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from confluent_kafka import Consumer, Producer, TopicPartition

from schemas.settings import KafkaSettings
from schemas.state_log import StateLog

log = logging.getLogger(__name__)

StateKey = tuple[Any, ...]
"""A state key: strings and integers, the first naming what kind of entry it is."""


class Stateful(Protocol):
    """Something whose state is checkpointed key by key."""

    def changed(self) -> set[StateKey]:
        """Keys changed since the last call (the caller takes the set; a fresh one starts)."""
        ...

    def live(self) -> Iterable[StateKey]:
        """Every key that has a value now."""
        ...

    def dump(self, key: StateKey) -> Any:
        """The JSON-able value of ``key`` now, or None if it has none any more."""
        ...

    def load(self, key: StateKey, value: Any) -> None:
        """Take ``value`` for ``key`` back from a checkpoint (before anything is processed)."""
        ...


def encode_key(key: StateKey) -> bytes:
    return json.dumps(key, separators=(",", ":")).encode()


def decode_key(raw: bytes) -> StateKey:
    return tuple(json.loads(raw))


class Checkpoint:
    """The transaction of the current cycle and the state logs it writes."""

    def __init__(
        self,
        kafka: KafkaSettings,
        producer: Producer,
        consumer: Consumer,
        *,
        group_id: str,
        parts: dict[str, Stateful],
    ) -> None:
        self._producer, self._consumer = producer, consumer
        self._parts = parts
        self._logs = {name: StateLog(kafka, f"gpulens.worker.{group_id}.{name}.changelog") for name in parts}
        self.written = 0
        """State records written since start."""

    def restore(self) -> int:
        """Load every part from its state log; the number of live keys loaded."""
        loaded = 0
        for name, part in self._parts.items():
            state_log = self._logs[name]
            state_log.create()
            for raw, value in state_log.restore().entries.items():
                part.load(decode_key(raw), json.loads(value))
                loaded += 1
        return loaded

    def begin(self) -> None:
        self._producer.begin_transaction()

    def commit(self, offsets: list[TopicPartition]) -> None:
        """Commit the cycle: its produced rows, every part's changes, and ``offsets``."""
        for name, part in self._parts.items():
            state_log = self._logs[name]
            self.written += state_log.append(self._producer, _entries(part, part.changed()))
            if state_log.snapshot_possible():  # listing every live key each cycle would cost
                live = list(part.live())
                if state_log.snapshot_due(len(live)):
                    state_log.snapshot(self._producer, lambda p=part, k=live: _entries(p, k), len(live))
                    self.written += len(live)
        if offsets:
            self._producer.send_offsets_to_transaction(offsets, self._consumer.consumer_group_metadata(), 30)
        self._producer.commit_transaction(30)

    def abort(self) -> None:
        """Drop the cycle: its rows, state changes and offsets never become visible."""
        self._producer.abort_transaction(30)


def _entries(part: Stateful, keys: Iterable[StateKey]) -> Iterator[tuple[bytes, bytes | None]]:
    for key in keys:
        value = part.dump(key)
        yield encode_key(key), None if value is None else json.dumps(value, separators=(",", ":")).encode()
