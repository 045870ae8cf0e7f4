"""Every record type lands in its tables with its values; a record delivered twice is stored once;
the "as of" queries answer what the published events say."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from confluent_kafka import Consumer, TopicPartition

from consumers.clickhouse import queries
from consumers.clickhouse.migrating import migrate
from consumers.clickhouse.rows import GPU_SAMPLES, Table
from consumers.clickhouse.writing import TableWriter
from schemas.examples import JOB_UID, NODE, POD_UID, example_events
from schemas.ids import event_id
from schemas.models import ChangeType, ClusterGpuAllocation, DeadLetter, NodeEvent, NodeGpuAllocation, PodEvent
from schemas.topics import CLUSTER_ALLOCATION, DLQ, NODE_ALLOCATION, NODES, PODS, STORAGE
from sink_support import SinkThread, wait_for
from tests_paths import TABLES_MD


@pytest.fixture
def sink(platform, codec, unique):
    running = SinkThread(platform, codec, unique).start()
    yield running
    running.stop()


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)
