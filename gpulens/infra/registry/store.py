"""The registry's state, kept in a compacted Kafka topic as Confluent's own ``_schemas`` is.

Schemas, compatibility levels and modes: every change is a keyed JSON record; on start the
whole topic is read back, so ids are shared by every process that asks the registry and
survive restarts. Writes go to the topic first and into memory only once the broker
acknowledged them.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from gpulens.infra.registry.compatibility import check
from gpulens.schemas.kafka.producing import produce_with_backpressure
from gpulens.schemas.kafka.settings import KafkaSettings
from gpulens.schemas.model.exceptions import IncompatibleSchemaError, RegistryError

log = logging.getLogger(__name__)

READWRITE, READONLY = "READWRITE", "READONLY"
MODES = (READWRITE, READONLY)
"""The modes served; Confluent's IMPORT (registering with given ids) is not."""


@dataclass(frozen=True, slots=True)
class SchemaVersion:
    """One version of one subject."""

    subject: str
    version: int
    id: int
    schema: str
    deleted: bool = False

    def as_json(self) -> dict[str, Any]:
        """The REST representation (Confluent omits schemaType for AVRO)."""
        return {"subject": self.subject, "version": self.version, "id": self.id, "schema": self.schema}


def _identity(text: str) -> str:
    # Same schema, same id, whatever the whitespace or key order of the text sent.
    return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))


class SchemaStore:
    """Subjects, versions, ids and compatibility levels; thread-safe."""

    def __init__(self, kafka: KafkaSettings, *, topic: str, default_compatibility: str) -> None:
        self._kafka = kafka
        self._topic = topic
        self._lock = threading.Lock()
        self._versions: dict[str, list[SchemaVersion]] = {}
        self._by_id: dict[int, str] = {}
        self._id_of: dict[str, int] = {}
        self._default_compatibility = default_compatibility
        self._config: dict[str | None, str] = {}
        self._modes: dict[str | None, str] = {}
        self._producer: Producer | None = None

    # --- lifecycle -------------------------------------------------------------------------

    def load(self, timeout: float = 30.0) -> None:
        """Create the store topic if missing, then replay it into memory."""
        self._ensure_topic(timeout)
        consumer = Consumer(
            self._kafka.librdkafka(**{"group.id": "gpulens-registry-loader", "enable.auto.commit": False})
        )
        try:
            partition = TopicPartition(self._topic, 0)
            _, high = consumer.get_watermark_offsets(partition, timeout=timeout)
            consumer.assign([TopicPartition(self._topic, 0, 0)])
            position = 0
            while position < high:
                message = consumer.poll(timeout)
                if message is None:
                    raise RegistryError(f"timed out replaying {self._topic} at offset {position} of {high}")
                if message.error():
                    raise RegistryError(f"replaying {self._topic}: {message.error()}")
                self._apply(message.key(), message.value())
                position = (message.offset() or 0) + 1
        finally:
            consumer.close()
        self._producer = Producer(self._kafka.producer(**{"acks": "all", "linger.ms": 0}))
        log.info("schema store loaded: %d subjects, %d schemas", len(self._versions), len(self._by_id))

    def _ensure_topic(self, timeout: float) -> None:
        admin = AdminClient(self._kafka.librdkafka())
        topic = NewTopic(self._topic, 1, 1, config={"cleanup.policy": "compact"})
        try:
            admin.create_topics([topic], operation_timeout=timeout)[self._topic].result(timeout)
        except KafkaException as err:
            if err.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise RegistryError(f"cannot create the store topic {self._topic}: {err}") from err

    def close(self) -> None:
        """Flush and drop the producer."""
        if self._producer is not None:
            self._producer.flush(10)
            self._producer = None

    # --- reading ---------------------------------------------------------------------------

    def subjects(self) -> list[str]:
        """Subjects with at least one live version."""
        return sorted(s for s, vs in self._versions.items() if any(not v.deleted for v in vs))

    def versions(self, subject: str) -> list[SchemaVersion]:
        """Live versions of ``subject``, oldest first."""
        return [v for v in self._versions.get(subject, []) if not v.deleted]

    def all_versions(self, *, deleted: bool = False) -> list[SchemaVersion]:
        """Every live version of every subject (soft-deleted ones too with ``deleted``)."""
        return [v for s in sorted(self._versions) for v in self._versions[s] if deleted or not v.deleted]

    def schema_by_id(self, schema_id: int) -> str | None:
        """The schema text with ``schema_id``."""
        return self._by_id.get(schema_id)

    def usages(self, schema_id: int) -> list[SchemaVersion]:
        """Every live subject version that has ``schema_id``."""
        return [v for vs in self._versions.values() for v in vs if v.id == schema_id and not v.deleted]

    def lookup(self, subject: str, text: str) -> SchemaVersion | None:
        """The live version of ``subject`` with this schema."""
        schema_id = self._id_of.get(_identity(text))
        return next((v for v in self.versions(subject) if v.id == schema_id), None)

    def compatibility(self, subject: str | None) -> str:
        """The level of ``subject``, else the global level."""
        return self._config.get(subject) or self._config.get(None) or self._default_compatibility

    def own_compatibility(self, subject: str) -> str | None:
        """The level set on ``subject`` itself (None: it follows the global level)."""
        return self._config.get(subject)

    def mode(self, subject: str | None) -> str:
        """The mode of ``subject``, else the global mode (READWRITE unless set)."""
        return self._modes.get(subject) or self._modes.get(None) or READWRITE

    def own_mode(self, subject: str) -> str | None:
        """The mode set on ``subject`` itself (None: it follows the global mode)."""
        return self._modes.get(subject)

    def problems(self, subject: str, text: str, *, against: list[SchemaVersion] | None = None) -> list[str]:
        """Why ``text`` would break the subject's level (empty when compatible)."""
        existing = self.versions(subject) if against is None else against
        return check(self.compatibility(subject), text, [v.schema for v in existing])

    # --- writing ---------------------------------------------------------------------------

    def register(self, subject: str, text: str) -> SchemaVersion:
        """Add ``text`` as the next version of ``subject`` (or return the version it already is)."""
        with self._lock:
            existing = self.lookup(subject, text)
            if existing is not None:
                return existing
            problems = self.problems(subject, text)
            if problems:
                raise IncompatibleSchemaError(
                    f"schema is incompatible with subject {subject!r} "
                    f"({self.compatibility(subject)}): " + "; ".join(problems)
                )
            schema_id = self._id_of.get(_identity(text)) or max(self._by_id, default=0) + 1
            all_versions = self._versions.get(subject, [])
            version = max((v.version for v in all_versions), default=0) + 1
            entry = SchemaVersion(subject, version, schema_id, text)
            self._write(_schema_key(subject, version), {**entry.as_json(), "deleted": False})
            return entry

    def delete(self, subject: str, version: int | None = None) -> list[int]:
        """Soft-delete one version, or every version when ``version`` is None."""
        with self._lock:
            doomed = [v for v in self.versions(subject) if version is None or v.version == version]
            for v in doomed:
                self._write(_schema_key(subject, v.version), {**v.as_json(), "deleted": True})
            return [v.version for v in doomed]

    def set_compatibility(self, subject: str | None, level: str | None) -> None:
        """Set (or with None, clear) the level of ``subject`` or, with subject None, the global one
        (cleared, it is the configured default again)."""
        with self._lock:
            self._write(_config_key(subject), None if level is None else {"compatibilityLevel": level})

    def set_mode(self, subject: str | None, mode: str | None) -> None:
        """Set (or with None, clear) the mode of ``subject`` or, with subject None, the global one."""
        with self._lock:
            self._write(_mode_key(subject), None if mode is None else {"mode": mode})

    def _write(self, key: dict[str, Any], value: dict[str, Any] | None) -> None:
        if self._producer is None:
            raise RegistryError("schema store is not loaded")
        key_bytes = json.dumps(key, sort_keys=True).encode()
        value_bytes = None if value is None else json.dumps(value).encode()
        failures: list[KafkaError] = []

        def delivered(err: KafkaError | None, _msg: object) -> None:
            if err is not None:
                failures.append(err)

        produce_with_backpressure(
            self._producer, self._topic, key=key_bytes, value=value_bytes, on_delivery=delivered
        )
        if self._producer.flush(30) or failures:
            raise RegistryError(f"could not persist to {self._topic}: {failures or 'flush timed out'}")
        self._apply(key_bytes, value_bytes)

    def _apply(self, key_bytes: bytes | None, value_bytes: bytes | None) -> None:
        if key_bytes is None:
            return
        key = json.loads(key_bytes)
        settings = {"CONFIG": (self._config, "compatibilityLevel"), "MODE": (self._modes, "mode")}
        if key.get("keytype") in settings:
            table, field = settings[key["keytype"]]
            if value_bytes is None:
                table.pop(key.get("subject"), None)
            else:
                table[key.get("subject")] = json.loads(value_bytes)[field]
            return
        if key.get("keytype") != "SCHEMA" or value_bytes is None:
            return
        value = json.loads(value_bytes)
        entry = SchemaVersion(
            value["subject"], value["version"], value["id"], value["schema"], value.get("deleted", False)
        )
        self._by_id[entry.id] = entry.schema
        self._id_of.setdefault(_identity(entry.schema), entry.id)
        versions = [v for v in self._versions.get(entry.subject, []) if v.version != entry.version]
        self._versions[entry.subject] = sorted([*versions, entry], key=lambda v: v.version)


def _schema_key(subject: str, version: int) -> dict[str, Any]:
    return {"keytype": "SCHEMA", "subject": subject, "version": version, "magic": 1}


def _config_key(subject: str | None) -> dict[str, Any]:
    return {"keytype": "CONFIG", "subject": subject, "magic": 0}


def _mode_key(subject: str | None) -> dict[str, Any]:
    return {"keytype": "MODE", "subject": subject, "magic": 0}
