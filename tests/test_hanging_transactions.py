"""A transaction the embedded broker forgot in a SIGKILL is aborted; nothing else is.

The case, on a broker of the test's own: a transactional producer commits on partitions 0 and
1 and the broker saves; the producer opens a transaction on partition 0 and the broker is
SIGKILLed before a save holds it. Restarted, the broker takes the producer's next batch on
partition 1 (its sequence there is in step), which opens a transaction it has no coordinator
state for, and fails the batch on partition 0 for good (out of sequence): the producer is dead
and partition 1's last stable offset stays put, hiding everything after it from read_committed
readers. The broker does not abort it by itself, nor when a producer of the same transactional
id calls init_transactions; :mod:`gpulens.pipeline.hanging_transactions` does.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from hostile_support import wait

from gpulens.infra.broker import noida_argv
from gpulens.infra.launching import ServiceManager, ServiceSpec, State
from gpulens.pipeline.hanging_transactions import HangingTransactionReaper, StableOffsets
from gpulens.platform import free_port
from gpulens.schemas.kafka.settings import KafkaSettings

TOPIC = "hanging"


@dataclass
class Broker:
    services: ServiceManager
    spec: ServiceSpec
    kafka: KafkaSettings
    snapshot: Path

    def kill_and_restart(self) -> None:
        pid = self.services.status(self.spec.name).pid
        assert pid is not None
        os.killpg(pid, signal.SIGKILL)
        wait(lambda: self.services.status(self.spec.name).state is not State.RUNNING, 10, "the broker gone")
        self.services.reap(self.spec.name)
        self.services.start(self.spec)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    """A noida-db of the test's own: it is SIGKILLed here."""
    port = free_port()
    services = ServiceManager(tmp_path / "state")
    spec = ServiceSpec("kafka", noida_argv("127.0.0.1", port, tmp_path / "kafka"), "127.0.0.1", port)
    services.start(spec)
    try:
        yield Broker(
            services,
            spec,
            KafkaSettings(bootstrap_servers=f"127.0.0.1:{port}"),
            tmp_path / "kafka" / "kafka.json",
        )
    finally:
        services.stop("kafka")


def _saved(snapshot: Path) -> int:
    return snapshot.stat().st_mtime_ns if snapshot.exists() else 0


def _forgotten_transaction(broker: Broker) -> int:
    """Leave a transaction open on partition 1 that the restarted broker forgot; its offset."""
    admin = AdminClient(broker.kafka.librdkafka())
    for future in admin.create_topics([NewTopic(TOPIC, 2)]).values():
        future.result()
    producer = Producer(broker.kafka.librdkafka(**{"transactional.id": "incarnation-a", "linger.ms": 0}))
    producer.init_transactions(30)
    producer.begin_transaction()
    for partition in (0, 1):
        for n in range(5):
            producer.produce(TOPIC, value=b"committed-%d" % n, partition=partition)
    producer.commit_transaction(30)
    before = _saved(broker.snapshot)
    wait(lambda: _saved(broker.snapshot) > before, 30, "a save holding the first transaction")
    producer.begin_transaction()
    for n in range(5):
        producer.produce(TOPIC, value=b"lost-%d" % n, partition=0)
    assert producer.flush(10) == 0
    broker.kill_and_restart()
    for n in range(5):
        producer.produce(TOPIC, value=b"forgotten-%d" % n, partition=1)
    producer.flush(10)  # taken: the producer's sequence on partition 1 is in step
    try:
        for n in range(5):
            producer.produce(TOPIC, value=b"out-of-sequence-%d" % n, partition=0)
        producer.commit_transaction(10)
    except KafkaException as err:
        # produce() itself may be the call that finds the producer dead: code _FATAL, flag unset
        assert err.args[0].fatal() or err.args[0].code() == KafkaError._FATAL, err
    else:
        pytest.fail("the producer outlived the lost records")
    return 6  # the five committed records and their commit marker


def test_a_forgotten_transaction_holds_read_committed_until_aborted(broker: Broker) -> None:
    first = _forgotten_transaction(broker)
    offsets = StableOffsets(broker.kafka, "hanging-test")
    try:
        wait(
            lambda: offsets.behind(TOPIC, 1) == first,
            10,
            "partition 1 held back at the forgotten transaction",
        )
        # what the worker did before: fence the transactional id by a new producer of it
        fencer = Producer(broker.kafka.librdkafka(**{"transactional.id": "incarnation-a"}))
        fencer.init_transactions(30)
        fencer.begin_transaction()
        fencer.produce(TOPIC, value=b"after", partition=1)
        fencer.commit_transaction(30)
        assert offsets.behind(TOPIC, 1) == first, "init_transactions of the same id does not abort it"
        assert offsets.abort_open([(TOPIC, 0), (TOPIC, 1)]) == 1
        assert offsets.behind(TOPIC, 1) is None, "nothing held back any more"
        assert offsets.behind(TOPIC, 0) is None
    finally:
        offsets.close()


def test_the_reaper_aborts_only_a_transaction_that_stays_open(broker: Broker) -> None:
    """A live producer's transactions come and go on partition 0 while the reaper runs with a
    2 s limit; the forgotten one on partition 1 stays and is aborted, the live ones commit."""
    first = _forgotten_transaction(broker)
    reaper = HangingTransactionReaper(broker.kafka, "reaper-test", after_s=2.0, interval_s=0.2)
    reaper.watch([TOPIC])
    live = Producer(broker.kafka.librdkafka(**{"transactional.id": "live", "linger.ms": 0}))
    live.init_transactions(30)
    offsets = StableOffsets(broker.kafka, "reaper-check")
    reaper.start()
    try:
        assert offsets.behind(TOPIC, 1) == first
        committed, deadline = 0, time.monotonic() + 30
        while offsets.behind(TOPIC, 1) is not None:
            assert time.monotonic() < deadline, "the forgotten transaction is still open after 30 s"
            live.begin_transaction()
            live.produce(TOPIC, value=b"live", partition=0)
            live.commit_transaction(30)  # an aborted live transaction would fail here
            committed += 1
    finally:
        reaper.stop()
        offsets.close()
    assert committed > 0
