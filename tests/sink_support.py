"""What the sink tests share: a database and private topics per test, the sink in a thread, waits."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterable

from clickhouse_connect.driver.exceptions import DatabaseError
from confluent_kafka import Producer

from consumers.clickhouse.client import get_client
from consumers.clickhouse.exceptions import ClickHouseError
from consumers.clickhouse.rows import SINK_TOPICS
from consumers.clickhouse.settings import SinkSettings
from consumers.clickhouse.sinking import run_sink
from schemas.codec import AvroCodec
from schemas.models import Record
from schemas.topic_admin import create_topics
from schemas.topics import TopicSpec, record_key

FAST = SinkSettings(batch_rows=20_000, batch_seconds=0.3, retry_backoff_s=(0.1, 0.2, 0.5))


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Return as soon as ``condition()`` holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


class SinkThread:
    """The sink of one test: private topics, its own database, running in a thread."""

    def __init__(self, platform, codec: AvroCodec, unique: str, settings: SinkSettings = FAST) -> None:
        self.clickhouse = platform.clickhouse.model_copy(update={"database": f"sink_{unique}"})
        self.topics = {
            spec.name: dataclasses.replace(spec, name=f"{spec.name}.{unique}") for spec in SINK_TOPICS
        }
        create_topics(platform.kafka, list(self.topics.values()))
        self._kafka, self._codec, self._settings = platform.kafka, codec, settings
        self.group = f"sink-{unique}"
        self._producer = Producer(platform.kafka.librdkafka(**{"linger.ms": 5}))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self) -> SinkThread:
        def target() -> None:
            try:
                run_sink(
                    self._kafka,
                    self._codec,
                    self.clickhouse,
                    self._settings,
                    self._stop,
                    topics=list(self.topics.values()),
                    group_id=self.group,
                )
            except BaseException as err:
                self._error = err

        self._thread = threading.Thread(target=target, name="sink", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
            assert not self._thread.is_alive(), "the sink did not stop"
        if self._error is not None:
            raise self._error

    def publish(self, spec: TopicSpec, records: Iterable[Record]) -> int:
        """Publish ``records`` on this test's copy of ``spec``; how many."""
        topic = self.topics[spec.name]
        count = 0
        for record in records:
            self._producer.produce(
                topic.name, key=record_key(topic, record), value=self._codec.encode(topic, record)
            )
            self._producer.poll(0)
            count += 1
        assert self._producer.flush(30) == 0
        return count

    def client(self):
        return get_client(self.clickhouse, database=self.clickhouse.database)

    def scalar(self, sql: str, parameters: dict | None = None):
        return self.client().query(sql, parameters=parameters).result_rows[0][0]

    def wait_rows(self, table: str, expected: int, where: str = "1", timeout: float = 30) -> None:
        """Wait until ``table`` holds ``expected`` rows (FINAL) matching ``where``."""
        wait_for(
            lambda: self._count(table, where) >= expected,
            timeout,
            f"{expected} rows in {table} where {where}",
        )

    def _count(self, table: str, where: str) -> int:
        try:
            return int(self.scalar(f"SELECT count() FROM {table} FINAL WHERE {where}"))
        except (ClickHouseError, DatabaseError):  # no database yet: the sink is still migrating
            return -1
