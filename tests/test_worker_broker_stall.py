"""A worker whose broker stops answering for longer than a commit's timeout waits it out.

The broker is SIGSTOPped for 15 s while a replay flows and the worker has cycles to commit: three
times the 5 s each transactional call waits (``CALL_TIMEOUT_S``), so a call times out and is
repeated several times over, and a quarter of the 60 s after which a call counts as wedged and the
worker exits (``WEDGED_S``). Afterwards the worker is the same process, every window row is there
once with the CSV's values, and the offsets it committed are the inputs' ends: nothing skipped,
nothing read twice.
"""

from __future__ import annotations

import operator
import os
import signal
import time

from allocation_oracle import expected_rows
from confluent_kafka import Consumer, TopicPartition
from hostile_support import metric, wait
from worker_support import PODS_CSV, RowReader, assert_rows_equal_the_csv, replay, start_worker

from gpulens.config import GPULensSettings
from gpulens.pipeline.checkpointing import CALL_TIMEOUT_S
from gpulens.pipeline.operators import AllocationOperator
from gpulens.pipeline.windows import TumblingWindows
from gpulens.platform import BROKER, free_port, manager

STALL_S = 3 * CALL_TIMEOUT_S
"""Several per-call timeouts, well under ``WEDGED_S`` (the module's docstring)."""
PACED_SPEED = "250000"
"""The trace's months in about a minute: records keep coming through the stall."""


def committed_and_ends(settings: GPULensSettings, group: str) -> tuple[dict[str, int], dict[str, int]]:
    """The offsets ``group`` committed on the allocation operator's inputs, and the inputs' ends."""
    inputs = AllocationOperator(TumblingWindows(3_600_000), per_node=False).inputs
    consumer = Consumer(settings.kafka.librdkafka(**{"group.id": group, "enable.auto.commit": False}))
    try:
        topics = consumer.list_topics(timeout=30).topics
        partitions = [TopicPartition(s.name, p) for s in inputs for p in sorted(topics[s.name].partitions)]
        committed = {
            f"{tp.topic}/{tp.partition}": max(tp.offset, 0)
            for tp in consumer.committed(partitions, timeout=30)
        }
        ends = {
            f"{tp.topic}/{tp.partition}": consumer.get_watermark_offsets(tp, timeout=30)[1]
            for tp in partitions
        }
    finally:
        consumer.close()
    return committed, ends


def test_a_worker_commits_through_a_broker_stopped_longer_than_a_commit_timeout(
    own_platform, own_codec, unique, spawned
) -> None:
    settings, config = own_platform
    cluster, group, port = f"stall-{unique}", f"stall-{unique}", free_port()
    reader = RowReader(settings, own_codec, cluster)
    worker = start_worker(config, group, "--metrics-port", str(port))
    spawned.append(worker)
    replaying = replay(config, cluster, "--speed", PACED_SPEED)
    spawned.append(replaying)
    expected = len(expected_rows(PODS_CSV, 3600))
    try:
        # Stopped once the worker has the replay's first records, while the paced replay still
        # publishes: the worker has cycles to commit. Unpaced, the replay could be over and the
        # worker's last cycle committed by then (CI stopped it there twice: no call waited).
        wait(lambda: metric(port, "gpulens_worker_records_in_total") > 0, 180, "the first records", worker)
        assert replaying.poll() is None, "the stall came mid-stream: the replay was still publishing"
        broker = manager(settings).status(BROKER).pid
        assert broker is not None
        os.killpg(broker, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            wait(
                lambda: time.monotonic() - stopped >= STALL_S, STALL_S + 5, "the stall to last", worker
            )  # the fault itself lasts this long; the worker must not exit meanwhile
        finally:
            os.killpg(broker, signal.SIGCONT)
        rows = reader.read_until(expected, 240)
        rows = reader.read_until(len(rows) + 1, 3)  # one more row would be a duplicate: look for it
        wait(
            lambda: operator.eq(*committed_and_ends(settings, group)),
            60,
            "the worker's offsets at the inputs' ends",
            worker,
        )
        failed = sum(
            metric(port, "gpulens_kafka_transient_errors_total", operation=f"transaction {call}")
            for call in ("offsets", "commit")
        )  # counted when the call answers: once the broker is back
    finally:
        reader.close()
    assert worker.poll() is None, "the worker exited"
    assert failed > 0, "no commit waited for the broker: the stall missed every cycle"
    assert_rows_equal_the_csv(rows)
