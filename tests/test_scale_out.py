"""Scale-out on one machine: sinks of one group split the partitions, by static shard.

Two ``gpulens sink`` processes, shards 0/2 and 1/2 of one group and database, read a load of
GPU sample batches spread over every partition. With one shard killed (SIGKILL), the other
stores its own partitions and nothing of the killed one's; restarted with its shard, the
killed one resumes where it committed, and every sample is stored exactly once.
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from sink_support import (
    SinkProcesses,
    committed_lag,
    wait_for,
)

from gpulens.schemas.kafka.sharding import Shard
from gpulens.schemas.model.topics import GPU_SAMPLES

LOAD = 30_000
"""GpuSampleBatch records (x 8 GPUs = 240,000 sample rows), keyed by 64 nodes over 6 partitions."""


def test_two_sink_shards_split_the_partitions_and_store_every_sample_once(
    platform, codec, config_file, unique, spawned
) -> None:
    cluster, group, database = f"shards-{unique}", f"sink-{unique}", f"shards_{unique}"
    sinks = SinkProcesses(platform, config_file, spawned, group=group, database=database)
    expected = sinks.load(codec, cluster, LOAD)

    def start(shard: Shard) -> subprocess.Popen[bytes]:
        return sinks.start("--shard", str(shard), "--batch-rows", "20000", "--batch-seconds", "0.5")

    first, second = Shard(0, 2), Shard(1, 2)
    assert committed_lag(platform, group, GPU_SAMPLES.name, first) > 0
    assert committed_lag(platform, group, GPU_SAMPLES.name, second) > 0, "the load must reach both shards"
    start(first)
    killed = start(second)
    wait_for(lambda: sinks.stored() >= expected // 8, 180, "both shards storing")
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait()

    wait_for(lambda: committed_lag(platform, group, GPU_SAMPLES.name, first) == 0, 300, "shard 0/2 done")
    alone = sinks.stored("FINAL")
    assert alone < expected, "the killed shard's partitions are nobody else's"
    assert committed_lag(platform, group, GPU_SAMPLES.name, second) > 0

    start(second)
    wait_for(lambda: committed_lag(platform, group, GPU_SAMPLES.name, second) == 0, 300, "shard 1/2 done")
    assert sinks.distinct() == [(expected, expected)], f"{alone:,} rows stored by shard 0/2 alone"


def test_the_shards_of_a_group_own_every_partition_exactly_once() -> None:
    shards = [Shard.parse(f"{i}/3") for i in range(3)]
    for partition in range(12):
        assert sum(shard.owns(partition) for shard in shards) == 1


@pytest.mark.parametrize("text", ["2/2", "1", "a/b", "-1/2", "0/0"])
def test_a_shard_that_cannot_be_is_refused_with_what_to_write(text: str) -> None:
    with pytest.raises(ValueError, match="want I/N"):
        Shard.parse(text)
