"""The allocation worker as a process, for the tests that run it: start it and a replay of the
Alibaba trace (or of a slice of it), read the rows it commits, and compare them with the oracle
of the CSV replayed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import pytest
from allocation_oracle import expected_rows
from confluent_kafka import Consumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families
from sink_support import wait_for

from gpulens.producers.replay.locating import traces_dir
from gpulens.schemas.model.models import ClusterGpuAllocation
from gpulens.schemas.model.topics import CLUSTER_ALLOCATION
from gpulens.schemas.wire.codec import AvroCodec

TRACE = traces_dir() / "alibaba-gpu-v2023"
EPOCH = datetime(2023, 1, 1, tzinfo=UTC)
PODS_CSV = TRACE / "openb_pod_list_default.csv"


def gpulens(config: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "gpulens", "--config", str(config), *args]


def spawn(command: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``command`` with its stderr in ``log`` (the child keeps its own copy of the file)."""
    with log.open("ab") as stderr:
        return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, env=env)


READING = ("reading the inputs from the beginning", "reading on from the checkpointed offsets")
"""What a worker logs once it holds its transactional id and reads: from then on it keeps up with
a paced replay, however slowly the machine started it."""


def wait_reading(worker: subprocess.Popen[bytes], log: Path, timeout: float = 120) -> None:
    """Return once ``worker`` has logged to ``log`` that it reads its inputs. A replay started
    before could be over before a worker slowed by a busy machine wrote its first rows, so a
    test that kills the worker "mid-stream" starts the replay after this."""
    wait_for(
        lambda: worker.poll() is not None or any(line in log.read_text(errors="replace") for line in READING),
        timeout,
        f"the worker to read its inputs (see {log})",
    )
    assert worker.poll() is None, f"the worker exited ({worker.returncode}) before reading: see {log}"


def stat_fields(pid: int, thread: int | str | None = None) -> list[str]:
    """A process's (or one of its threads') /proc stat from field 3 on: what follows the
    command's parentheses (a command may hold spaces and parentheses itself)."""
    stat = Path(f"/proc/{pid}" + (f"/task/{thread}" if thread is not None else "") + "/stat").read_text()
    return stat[stat.rindex(")") + 2 :].split()


def nice_of(pid: int, thread: int | str | None = None) -> int:
    """A process's (or one of its threads') nice value: field 19 of its /proc stat."""
    return int(stat_fields(pid, thread)[16])


def thread_nices(pid: int) -> list[tuple[str, int]]:
    """(name, nice value) of each thread of a process: a thread that ends while they are read is
    left out (librdkafka ends some of its own threads as connections come and go)."""
    nices: list[tuple[str, int]] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            nices.append(((task / "comm").read_text().strip(), nice_of(pid, task.name)))
        except FileNotFoundError:
            continue
    return nices


def cpu_s_of(pid: int, thread: int | str | None = None) -> float:
    """CPU seconds (user and system) a process, or one of its threads, has used: fields 14 and 15."""
    fields = stat_fields(pid, thread)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_named(pid: int, name: str) -> str | None:
    """The id of a thread of ``pid`` named ``name`` (its comm), or None."""
    tasks = Path(f"/proc/{pid}/task").iterdir()
    return next((task.name for task in tasks if (task / "comm").read_text().strip() == name), None)


def worker_log(config: Path, group: str, *extra: str) -> Path:
    return config.parent / f"worker-{group}{''.join(extra).replace('/', '-')}.log"


def start_worker(config: Path, group: str, *extra: str) -> subprocess.Popen[bytes]:
    """A worker writing hourly cluster rows only (the rows these tests read). A replay is its
    cluster's only source, so the worker waits 1 s, not the default 10, for other sources of a
    cluster new to it to speak: no other source exists, and each test's worker would sit idle."""
    command = gpulens(
        config, "worker", "--window", "3600", "--no-nodes", "--no-overview", "--processors", "allocation",
        "--group", group, "--idle-ms", "3000", "--source-timeout", "1", *extra,
    )  # fmt: skip
    return spawn(command, worker_log(config, group, *extra))


def replay(config: Path, cluster: str, *extra: str, pods: Path = PODS_CSV) -> subprocess.Popen[bytes]:
    """A replay of the pods CSV ``pods`` (the whole trace, or a slice of it) into ``cluster``."""
    command = gpulens(config, "replay", "alibaba-v2023", "--pods", str(pods), *extra)
    return spawn(
        command, config.parent / f"replay-{cluster}.log", env={**os.environ, "GPULENS_CLUSTER": cluster}
    )


class RowReader:
    """Reads committed cluster rows of one cluster as they arrive."""

    def __init__(self, platform, codec: AvroCodec, cluster: str) -> None:
        self._consumer = Consumer(
            platform.kafka.librdkafka(**{"group.id": f"rows-{cluster}", "isolation.level": "read_committed"})
        )
        self._consumer.assign([TopicPartition(CLUSTER_ALLOCATION.name, 0, 0)])
        self._codec, self._cluster = codec, cluster
        self.rows: list[ClusterGpuAllocation] = []

    def read_until(self, count: int, deadline_s: float) -> list[ClusterGpuAllocation]:
        deadline = time.monotonic() + deadline_s
        while len(self.rows) < count and time.monotonic() < deadline:
            for message in self._consumer.consume(10_000, 0.5):
                if message.error() is None and message.key() == self._cluster.encode():
                    self.rows.append(self._codec.decode(CLUSTER_ALLOCATION, message.value()))
        return self.rows

    def close(self) -> None:
        self._consumer.close()


def assert_rows_equal_the_csv(rows: list[ClusterGpuAllocation], pods: Path = PODS_CSV) -> None:
    """``rows`` are the hourly rows the oracle computes from the pods CSV ``pods``, each once."""
    expected = expected_rows(pods, 3600)
    assert len({r.event_id for r in rows}) == len(rows), "a window was published twice"
    assert [int((r.window_start - EPOCH).total_seconds()) for r in rows] == [e.window_start for e in expected]
    assert [r.gpus_allocated_avg for r in rows] == pytest.approx(
        [e.gpus_allocated_avg for e in expected], abs=1e-6
    )
    assert [r.gpus_allocated_max for r in rows] == pytest.approx(
        [e.gpus_allocated_max for e in expected], abs=1e-6
    )
    assert [r.gpus_allocated_end for r in rows] == pytest.approx(
        [e.gpus_allocated_end for e in expected], abs=1e-6
    )
    assert [r.pods_running_end for r in rows] == [e.pods_running_end for e in expected]
    assert [r.pods_pending_end for r in rows] == [e.pods_pending_end for e in expected]


def worker_metrics(port: int) -> dict[str, float]:
    """Sums of the worker's samples by name (0 when absent)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals
