"""Creating and listing the catalog's topics (idempotent)."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterable
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from gpulens.schemas.kafka.settings import KafkaSettings
from gpulens.schemas.model.exceptions import GPULensError
from gpulens.schemas.model.topics import CATALOG, TopicSpec


class TopicAdminError(GPULensError):
    """The broker refused to create or describe a topic."""


class BrokerUnreachable(TopicAdminError):
    """No broker answered at ``kafka.bootstrap_servers`` in time."""


_QUIET = logging.getLogger("gpulens.librdkafka.admin")
"""Where the admin client's librdkafka logs go: nowhere. Unanswered, it logs every failed
connection attempt (hundreds of lines) before the one error that says what is wrong."""
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False

REACH_TIMEOUT_S = 5.0


def reach_broker(kafka: KafkaSettings, *, timeout: float = REACH_TIMEOUT_S) -> AdminClient:
    """An admin client of the broker, once it answered a metadata request within ``timeout``.

    Every command that needs the broker starts here, so an unreachable one is a single clear
    error within seconds (:class:`BrokerUnreachable`), not librdkafka's retries. When no
    bootstrap server accepts a TCP connection at all, it says so at once.
    """
    servers = kafka.bootstrap_servers.split(",")
    if not any(_accepts(server, timeout) for server in servers):
        raise _unreachable(kafka, "no bootstrap server accepts connections")
    admin = AdminClient(kafka.librdkafka(logger=_QUIET))
    try:
        admin.list_topics(timeout=timeout)
    except KafkaException as err:
        raise _unreachable(kafka, f"no metadata within {timeout:.0f} s: {err.args[0].str()}") from err
    return admin


def _accepts(server: str, timeout: float) -> bool:
    host, _, port = server.strip().rpartition(":")
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def _unreachable(kafka: KafkaSettings, why: str) -> BrokerUnreachable:
    return BrokerUnreachable(
        f"no Kafka broker answered at {kafka.bootstrap_servers} ({why}); start the embedded one "
        "with `gpulens infra up`, or point GPULENS_KAFKA__BOOTSTRAP_SERVERS at yours"
    )


@dataclass(frozen=True, slots=True)
class TopicState:
    """A catalog topic as the broker has it."""

    spec: TopicSpec
    exists: bool
    partitions: int | None


def create_topics(
    kafka: KafkaSettings, topics: Iterable[TopicSpec] = CATALOG, *, timeout: float = 30.0
) -> list[str]:
    """Create the topics that do not exist yet; the names created now."""
    admin = reach_broker(kafka)
    wanted = list(topics)
    try:
        existing = set(admin.list_topics(timeout=timeout).topics)
    except KafkaException as err:
        raise TopicAdminError(f"cannot reach Kafka at {kafka.bootstrap_servers}: {err}") from err
    missing = [t for t in wanted if t.name not in existing]
    if not missing:
        return []
    futures = admin.create_topics(
        [NewTopic(t.name, t.partitions, 1, config=t.config()) for t in missing], operation_timeout=timeout
    )
    created = []
    for name, future in futures.items():
        try:
            future.result(timeout)
            created.append(name)
        except KafkaException as err:
            if err.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # a concurrent creator won
                raise TopicAdminError(f"cannot create {name}: {err.args[0].str()}") from err
    return sorted(created)


def describe_topics(kafka: KafkaSettings, *, timeout: float = 30.0) -> list[TopicState]:
    """Every catalog topic and whether the broker has it."""
    admin = reach_broker(kafka)
    try:
        metadata = admin.list_topics(timeout=timeout).topics
    except KafkaException as err:
        raise TopicAdminError(f"cannot reach Kafka at {kafka.bootstrap_servers}: {err}") from err
    return [
        TopicState(
            spec,
            spec.name in metadata,
            len(metadata[spec.name].partitions) if spec.name in metadata else None,
        )
        for spec in CATALOG
    ]


def topic_partitions(
    kafka: KafkaSettings, topics: Iterable[TopicSpec], *, offset: int, timeout: float = 30.0
) -> list[TopicPartition]:
    """Every partition of ``topics`` as the broker has them, each starting at ``offset``
    (``OFFSET_BEGINNING``, ``OFFSET_STORED``, ...): what a reader that assigns itself every
    partition, instead of sharing them in a group, passes to ``assign``."""
    admin = AdminClient(kafka.librdkafka())
    wanted = list(topics)
    try:
        metadata = admin.list_topics(timeout=timeout).topics
    except KafkaException as err:
        raise TopicAdminError(f"cannot reach Kafka at {kafka.bootstrap_servers}: {err}") from err
    missing = [t.name for t in wanted if t.name not in metadata]
    if missing:
        raise TopicAdminError(f"topics missing: {', '.join(missing)}; run `gpulens topics create`")
    return [TopicPartition(t.name, p, offset) for t in wanted for p in sorted(metadata[t.name].partitions)]
