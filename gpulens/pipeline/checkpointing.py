"""Checkpoints: a cycle's outputs, state changes and input positions as one Kafka transaction.

Every stateful part of the worker (each operator, and the worker's own input positions)
implements :class:`Stateful`: it names the keys it changed since the last checkpoint and can
dump and load one key's value. A :class:`Checkpoint` owns the transactional producer and one
state log per part, ``gpulens.worker.<group>.<part>.changelog`` (see
:mod:`gpulens.schemas.kafka.state_log`; a part's hot kinds of keys have a second one,
:class:`SplitsHotState`), and commits, in one transaction, the rows the cycle produced, the
changed keys of every part and the input offsets. A crash, kill -9 included, therefore leaves
state, outputs and offsets of the same cycle or of none.

Changelog format (documented, language-neutral). An entry's key is the JSON array of the state
key (``["pod", "cluster-a", "uid-1"]``), its value the JSON of what the part dumps for it, or
null when the key is gone. Each part documents its keys beside its ``dump``. A cycle's entries
are written packed (:mod:`gpulens.schemas.kafka.state_log`'s batch records): the value of a
batch record is the version byte ``0x01`` and the UTF-8 JSON array of ``[key, value]`` pairs,
applied in order. At 10,000 GPUs a cycle changes thousands of keys; one record and one JSON
encoding per part instead of one per key cut the checkpoint's cost several times. Logs written
before (one plain record per key: key = the UTF-8 JSON array, value = the UTF-8 JSON) restore
as they are, mixed with batches in log order; a batch of an unknown version (written by a newer
GPULens) stops the restore with :class:`~gpulens.schemas.kafka.state_log.StateLogError`.

A broker away (stopped, restarting, slower than the call's timeout) fails the transactional
calls with retriable errors; librdkafka documents that such a call is to be repeated, and the
commit waits that way until the broker answers (a commit timed out at 30 s once ended the
worker). Only where librdkafka says the transaction must be aborted (``txn_requires_abort``:
e.g. its messages timed out) is it aborted and :class:`~gpulens.pipeline.exceptions.CycleAborted`
raised; fatal errors (a fenced producer) are raised as they are.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import Any, Protocol, runtime_checkable

import orjson
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from gpulens.pipeline.exceptions import CycleAborted
from gpulens.pipeline.hanging_transactions import StableOffsets
from gpulens.schemas.kafka.retrying import is_transient, retry_transient
from gpulens.schemas.kafka.settings import KafkaSettings
from gpulens.schemas.kafka.state_log import Packed, StateLog, StateLogError

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 5.0
"""Each transactional call's own timeout: a call timed out is repeated (it resumes where it
was), so this bounds only how long a stop waits for the broker, not how long a commit may take."""
WEDGED_S = 60.0
"""A transactional call still blocked this long (or for 80 % of the worker's
``hanging_transaction_s``, when that is shorter) ignored its timeout: librdkafka's
``send_offsets_to_transaction`` can wait forever for a group coordinator (librdkafka#5456; seen
after a SIGKILL and restart of noida-db). Nothing in the process can end that call, and SIGTERM
is no longer honoured, so the process exits (code :data:`WEDGED_EXIT`): a restart fences the
wedged producer and redoes the cycle from the last checkpoint. Below the worker's
``hanging_transaction_s``, so the worker exits before its own open transaction counts as hanging."""
WEDGED_EXIT = 75
"""Exit status of a process whose transactional call wedged (EX_TEMPFAIL: run it again)."""


PACKED_V1 = b"\x01"
"""Version byte of a batch record's value (module docstring)."""
BATCH_ENTRIES = 4_096
"""Entries packed in one batch record at most."""
BATCH_BYTES = 512 * 1024
"""Bytes of one batch record at most (librdkafka's ``message.max.bytes`` is 1 MB): a larger
one is split."""


class JsonText:
    """A dumped value a part keeps as JSON text already (:meth:`Stateful.dump`): written as it
    is, not parsed and written again."""

    __slots__ = ("text",)

    def __init__(self, text: bytes) -> None:
        self.text = text


def _fragment(value: object) -> orjson.Fragment:
    if isinstance(value, JsonText):
        return orjson.Fragment(value.text)
    raise TypeError(f"{type(value).__name__} is not JSON-able")


def _parsed(value: object) -> Any:
    if isinstance(value, JsonText):
        return json.loads(value.text)
    raise TypeError(f"{type(value).__name__} is not JSON-able")


_JSON = json.JSONEncoder(separators=(",", ":"), default=_parsed)
"""The reference encoding (``json.dumps`` with options builds a new encoder per call): orjson,
which writes the same compact JSON 6x faster (a cycle's packed changes were 11 % of the worker),
falls back to it for what it does not take (integers beyond 64 bits, keys that are not strings),
fragments of JSON text included. Dumped values are finite: orjson writes a NaN as null where
``json`` writes ``NaN``."""

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
        """The JSON-able value of ``key`` now, or None if it has none any more; a part that keeps
        a value as JSON text already gives it as :class:`JsonText`."""
        ...

    def load(self, key: StateKey, value: Any) -> None:
        """Take ``value`` for ``key`` back from a checkpoint (before anything is processed)."""
        ...


@runtime_checkable
class SplitsHotState(Protocol):
    """A part some of whose kinds of keys change at nearly every cycle (a workload's usage, a
    node's last sample) while the rest change seldom (holders, pods, names).

    Its hot kinds get a state log of their own, ``<part>.hot.changelog``: a snapshot rewrites
    only its own log's live keys, and one mixing both kinds was due every few cycles, rewriting
    every cold key with it (at 50,000 GPUs the GPU holders' entries alone were 5.9 % of the
    worker)."""

    hot_kinds: frozenset[str]
    """The kinds (a key's first element) checkpointed in the hot log."""


@runtime_checkable
class GroupsSnapshot(Protocol):
    """A part whose entries about one thing repeat the same ids: a node's GPU names, the GPUs of
    its containers and its GPU list each spell out its GPUs' UUIDs. Its snapshots list the
    entries of one group together, so that each UUID is compressed once in the batch that holds
    them all, instead of once per kind in batches megabytes apart (the alerts' snapshot at 100,000
    GPUs: 8.3 MB compressed by kind, 5.1 MB by node; the broker holds and saves every byte)."""

    def snapshot_group(self, key: StateKey) -> tuple[str, ...]:
        """What ``key`` is about (a snapshot sorts its keys by this, stably)."""
        ...


def encode_key(key: StateKey) -> bytes:
    """The key's bytes, as ``json`` writes them (ASCII, DEL escaped): they name an entry in the
    logs (plain records of older logs included), so they never change with the encoder."""
    raw = _dumps(key)
    return raw if raw.isascii() and b"\x7f" not in raw else _JSON.encode(key).encode()


def encode_value(value: Any) -> bytes:
    """A dumped value (:meth:`Stateful.dump`) as a state log writes it: JSON text."""
    return _dumps(value)


def decode_key(raw: bytes) -> StateKey:
    return tuple(_loads(raw))


def _dumps(value: Any) -> bytes:
    try:
        return orjson.dumps(value, default=_fragment)
    except orjson.JSONEncodeError:
        return _JSON.encode(value).encode()


def _loads(raw: bytes | memoryview) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:  # NaN or Infinity, as ``json`` writes them
        return json.loads(bytes(raw))


def pack(pairs: list[tuple[StateKey, Any]]) -> Iterator[Packed]:
    """Batch records of ``(key, dumped value)`` pairs, in order (module docstring)."""
    for start in range(0, len(pairs), BATCH_ENTRIES):
        yield from _sized(pairs[start : start + BATCH_ENTRIES])


def _sized(pairs: list[tuple[StateKey, Any]]) -> Iterator[Packed]:
    """One record, or, past :data:`BATCH_BYTES`, parts aimed at half of it (each mostly encoded
    once more: splitting in halves encoded 5 KB inventories five times)."""
    value = PACKED_V1 + _dumps(pairs)
    if len(value) <= BATCH_BYTES or len(pairs) == 1:
        yield value, len(pairs)
        return
    size = -(-len(pairs) // -(-len(value) // (BATCH_BYTES // 2)))
    for start in range(0, len(pairs), size):
        yield from _sized(pairs[start : start + size])


def unpack(value: bytes) -> Iterator[tuple[bytes, Any]]:
    """The entries of a batch record: each key as a plain record's, and its value read."""
    if value[:1] != PACKED_V1:
        raise StateLogError(f"checkpoint batch of format version {value[:1]!r}: written by a newer GPULens?")
    for key, dumped in _loads(memoryview(value)[1:]):
        yield encode_key(key), dumped


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
        hanging_transaction_s: float | None = None,
    ) -> None:
        self._kafka, self._producer, self._consumer = kafka, producer, consumer
        self._parts = parts
        self._abort_forgotten = hanging_transaction_s is not None
        """Abort transactions still open on the state logs at restore (a broker that forgets them)."""
        self._wedged_s = (
            WEDGED_S if hanging_transaction_s is None else min(WEDGED_S, 0.8 * hanging_transaction_s)
        )
        """Below the reaper's ``hanging_transaction_s``: this worker exits before its own open
        transaction counts as forgotten."""
        self._logs = {name: StateLog(kafka, f"gpulens.worker.{group_id}.{name}.changelog") for name in parts}
        self._hot = {
            name: (StateLog(kafka, f"gpulens.worker.{group_id}.{name}.hot.changelog"), part.hot_kinds)
            for name, part in parts.items()
            if isinstance(part, SplitsHotState)
        }
        """The hot log and kinds of each part that splits them off (:class:`SplitsHotState`)."""
        self._admin = AdminClient(kafka.librdkafka())
        """Cuts the state logs behind their newest committed snapshots."""
        self.written = 0
        """State records written since start."""

    @property
    def topics(self) -> list[str]:
        """The state logs' topics."""
        return [state_log.topic for state_log in self._every_log()]

    def _every_log(self) -> list[StateLog]:
        return [*self._logs.values(), *(hot_log for hot_log, _ in self._hot.values())]

    def restore(self) -> int:
        """Load every part from its state log; the number of live keys loaded.

        Call it after fencing the earlier incarnations: a transaction still open on a state log
        then has no live owner (a broker restart made it forget the transaction), and it would
        hide every later write from the restore; it is aborted first
        (:mod:`gpulens.pipeline.hanging_transactions`)."""
        for state_log in self._every_log():
            state_log.create()
        if self._abort_forgotten:
            offsets = StableOffsets(self._kafka, f"{self.topics[0]}-restore")
            try:
                offsets.abort_open((topic, 0) for topic in self.topics)
            finally:
                offsets.close()
        loaded = 0
        for name, part in self._parts.items():
            restored = self._logs[name].restore(unpack=unpack)
            entries = {decode_key(raw): value for raw, value in restored.entries.items()}
            if name in self._hot:
                self._restore_hot(name, entries)
            for key, value in entries.items():
                part.load(key, _loads(value) if isinstance(value, bytes) else value)
                loaded += 1
        return loaded

    def _restore_hot(self, name: str, entries: dict[StateKey, Any]) -> None:
        """Add the hot log's entries to the cold log's ``entries``.

        A cold log written before the split holds hot keys too. Once the hot log has a
        snapshot, that snapshot holds every hot key, so the cold log's are older and dropped.
        Until then they stand, and the next commit writes a hot snapshot in any case: the cold
        log's next snapshot leaves them out, and a key deleted since is only gone for sure in a
        snapshot (a deletion in the hot log's tail would not remove the cold log's entry)."""
        hot_log, kinds = self._hot[name]
        restored = hot_log.restore(unpack=unpack)
        moved = [key for key in entries if key[0] in kinds]
        if moved and not restored.from_snapshot:
            hot_log.snapshot_next()
        elif moved:
            for key in moved:
                del entries[key]
        entries.update((decode_key(raw), value) for raw, value in restored.entries.items())

    def begin(self) -> None:
        try:
            self._producer.begin_transaction()
        except KafkaException as err:
            _raise_if_failed_producer(err, "transaction begin")
            raise

    def commit(self, offsets: list[TopicPartition], *, stop: threading.Event | None = None) -> None:
        """Commit the cycle: its produced rows, every part's changes, and ``offsets``.

        Waits while the broker is away; once ``stop`` is set, a transient failure is raised
        instead (the transaction is left open: the broker aborts it, a restart fences it).
        Raises :class:`CycleAborted` when the transaction had to be aborted.
        """
        for name, part in self._parts.items():
            changed = part.changed()
            if name not in self._hot:
                self._write(self._logs[name], part, changed, _Live(part).all)
                continue
            hot_log, kinds = self._hot[name]
            hot = {key for key in changed if key[0] in kinds}
            live = _Live(part, kinds)
            self._write(self._logs[name], part, changed - hot, live.cold)
            self._write(hot_log, part, hot, live.hot, grouped=False)
        if offsets:
            group = self._consumer.consumer_group_metadata()
            self._transactional(
                lambda: self._producer.send_offsets_to_transaction(offsets, group, CALL_TIMEOUT_S),
                "transaction offsets",
                stop,
            )
        self._transactional(
            lambda: self._producer.commit_transaction(CALL_TIMEOUT_S), "transaction commit", stop
        )
        for state_log in self._every_log():
            state_log.cut(self._admin)

    def _write(
        self,
        state_log: StateLog,
        part: Stateful,
        changed: set[StateKey],
        live: Callable[[], list[StateKey]],
        *,
        grouped: bool = True,
    ) -> None:
        """``part``'s ``changed`` keys on ``state_log``, or a snapshot of its ``live`` keys instead,
        grouped where the part groups them (:class:`GroupsSnapshot`) unless ``grouped`` is False
        (hot kinds: they change at every cycle, and keep their order)."""
        if state_log.snapshot_possible(len(changed)):  # listing every live key each cycle would cost
            keys = live()
            if state_log.snapshot_due(len(keys), len(changed)):  # it holds the changes too
                if grouped and isinstance(part, GroupsSnapshot):  # sorted only for a snapshot written
                    keys = sorted(keys, key=part.snapshot_group)
                state_log.snapshot_packed(self._producer, partial(_packed_live, part, keys), len(keys))
                self.written += len(keys)
                return
        self.written += state_log.append_packed(self._producer, pack(_dumped(part, changed)))

    def abort(self, *, stop: threading.Event | None = None) -> None:
        """Drop the cycle: its rows, state changes and offsets never become visible."""
        for state_log in self._every_log():
            state_log.forget_snapshot()
        retry_transient(
            lambda: self._producer.abort_transaction(CALL_TIMEOUT_S), operation="transaction abort", stop=stop
        )

    def _transactional(self, call: Callable[[], None], operation: str, stop: threading.Event | None) -> None:
        try:
            watched = _watched(call, operation, self._wedged_s)
            retry_transient(watched, operation=operation, stop=stop, transient=_retriable)
        except KafkaException as err:
            _raise_if_failed_producer(err, operation)
            error: KafkaError = err.args[0]
            if error.fatal() or not error.txn_requires_abort():
                raise
            log.warning("%s failed, the transaction must be aborted: %s", operation, error)
            self.abort(stop=stop)
            raise CycleAborted(f"{operation}: {error.str()}; the cycle was aborted") from err


def _watched(call: Callable[[], None], operation: str, wedged_s: float) -> Callable[[], None]:
    """``call``, ending the process when it blocks past ``wedged_s`` (see :data:`WEDGED_S`)."""

    def wedged() -> None:
        log.critical("%s blocked for %.0f s past its timeout: exiting to be restarted", operation, wedged_s)
        logging.shutdown()
        os._exit(WEDGED_EXIT)

    def watched() -> None:
        watchdog = threading.Timer(wedged_s, wedged)
        watchdog.daemon = True
        watchdog.start()
        try:
            call()
        finally:
            watchdog.cancel()

    return watched


# Another incarnation holds the transactional id: starting again would fence it in turn.
_FENCED = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH})


def _raise_if_failed_producer(err: KafkaException, operation: str) -> None:
    """A fatal producer error other than fencing, as :class:`CycleAborted`.

    Seen after a broker's SIGKILL and restart: OUT_OF_ORDER_SEQUENCE_NUMBER. The producer is
    unusable and its transaction never commits, so nothing of the cycle is visible: a fresh
    worker (fresh producer, restored checkpoint) redoes it, in this process.
    """
    error: KafkaError = err.args[0]
    if error.fatal() and error.code() not in _FENCED:
        raise CycleAborted(f"{operation}: the producer failed ({error.str()})") from err


def _retriable(err: KafkaException) -> bool:
    """A transactional call to repeat as it is: transient, and the transaction still sound."""
    return is_transient(err) and not err.args[0].txn_requires_abort()


class _Live:
    """A part's live keys, listed at most once a commit and only when a snapshot may be due,
    split into its cold and hot kinds."""

    def __init__(self, part: Stateful, hot: frozenset[str] = frozenset()) -> None:
        self._part, self._hot = part, hot
        self._split: tuple[list[StateKey], list[StateKey]] | None = None

    def all(self) -> list[StateKey]:
        return list(self._part.live())

    def cold(self) -> list[StateKey]:
        return self._listed()[0]

    def hot(self) -> list[StateKey]:
        return self._listed()[1]

    def _listed(self) -> tuple[list[StateKey], list[StateKey]]:
        if self._split is None:
            cold: list[StateKey] = []
            hot: list[StateKey] = []
            for key in self._part.live():
                (hot if key[0] in self._hot else cold).append(key)
            self._split = cold, hot
        return self._split


def _dumped(part: Stateful, keys: Iterable[StateKey]) -> list[tuple[StateKey, Any]]:
    dump = part.dump
    return [(key, dump(key)) for key in keys]


def _packed_live(part: Stateful, live: list[StateKey]) -> Iterator[Packed]:
    return pack(_dumped(part, live))
