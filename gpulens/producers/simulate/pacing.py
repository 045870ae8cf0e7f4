"""Publishing a simulation, paced so that simulated time keeps step with the wall clock.

At ``speed`` 1 a record is published when the wall clock has advanced as far past the start
as its event time has (``speed`` N: N times faster; 0: as fast as the broker takes them).
While waiting the publisher serves delivery callbacks. A stop request ends the run at the
next record with a final watermark, exactly as the end of ``duration`` does.

Each instant's GPU samples come as one :class:`SampleRound`: given a
:class:`SampleBatchWriter`, its batches' bytes are written by column and produced as they are
(what keeps a 100,000-GPU fleet's load under a quarter of a core); without one, each batch is
built as a record and published like any other.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from gpulens.producers.publishing import BasePublisher
from gpulens.producers.simulate.batch_writing import SampleBatchWriter
from gpulens.producers.simulate.rounds import SampleRound
from gpulens.producers.simulate.simulating import ClusterSimulation
from gpulens.producers.simulate.specs import from_ms
from gpulens.producers.watermarking import WatermarkCadence
from gpulens.schemas.model.topics import WATERMARKS

_POLL_S = 0.1
"""Longest wait between two looks at the stop flag."""


@dataclass(frozen=True, slots=True)
class Progress:
    """Where a run stands."""

    records: int
    """Published so far (queued for the broker; all acknowledged once the run returns)."""
    simulated: datetime
    """Event time reached."""
    elapsed_s: float
    """Wall time since the run began."""
    rate: float
    """Records per second since the previous report."""
    behind_s: float
    """How far publishing trails the paced schedule (0 when on time or unpaced)."""


def publish_simulation(
    simulation: ClusterSimulation,
    publisher: BasePublisher,
    *,
    speed: float = 1.0,
    stop: threading.Event | None = None,
    report: Callable[[Progress], None] | None = None,
    report_every_s: float = 5.0,
    writer: SampleBatchWriter | None = None,
    freeze: bool = False,
) -> Progress:
    """Publish every record of ``simulation``, then flush; returns the final progress.

    ``report`` hears the progress every ``report_every_s`` wall seconds. The run always ends
    with a final watermark: the simulation's own at its end, or one at the current instant
    when ``stop`` is set first. ``writer`` writes the GPU sample batches' bytes (it must have
    the publisher's schema id of the samples topic). ``freeze``, for a process that runs one
    simulation: once the cluster's start is generated, every object alive is frozen out of the
    cyclic garbage collector's sight (``gc.freeze``). The cluster's state lives as long as the
    run, and full collections traversed it over and over: 40 % of the steady CPU at 100,000
    GPUs, measured at --speed 0.
    """
    if speed < 0:
        raise ValueError(f"speed must be 0 (unpaced) or more, got {speed}")
    began = last_report = time.monotonic()
    origin_ms = simulation.spec.start_ms
    count = reported = 0
    behind = 0.0
    ended = False

    def progress(now: float) -> Progress:
        nonlocal last_report, reported
        elapsed = max(now - last_report, 1e-9)
        state = Progress(count, from_ms(simulation.now_ms), now - began, (count - reported) / elapsed, behind)
        last_report, reported = now, count
        return state

    events = simulation.stream()
    cadence = WatermarkCadence(publisher)  # consumers see how far the run has come, every second
    try:
        for topic, item in events:
            if freeze:
                gc.freeze()
                freeze = False
            if stop is not None and stop.is_set():
                break
            now = time.monotonic()
            if speed > 0:
                wait = began + (simulation.now_ms - origin_ms) / 1000 / speed - now
                behind = max(0.0, -wait)
                if wait > 0 and _wait(publisher, wait, stop):
                    break
            if not isinstance(item, SampleRound):
                cadence.before(item)
                publisher.publish(topic, item)
                count += 1
            elif writer is None:
                for batch in item.batches():
                    cadence.before(batch)
                    publisher.publish(topic, batch)
                count += len(item.nodes)
            else:
                cadence.before_records(item.cluster, item.source, from_ms(item.at_ms), len(item.nodes))
                keys, values = writer.write(item)
                publisher.produce_many(topic.name, keys, values)
                count += len(values)
            if report is not None and now - last_report >= report_every_s:
                report(progress(now))
        else:
            ended = True
    finally:
        events.close()
    if not ended:
        publisher.publish(WATERMARKS, simulation.final_watermark())
        count += 1
    publisher.flush()
    elapsed = time.monotonic() - began
    final = Progress(count, from_ms(simulation.now_ms), elapsed, count / max(elapsed, 1e-9), behind)
    if report is not None:
        report(final)
    return final


def _wait(publisher: BasePublisher, seconds: float, stop: threading.Event | None) -> bool:
    """Serve delivery callbacks for ``seconds``; True when asked to stop meanwhile."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if stop is not None and stop.is_set():
            return True
        publisher.poll(min(left, _POLL_S))
    return False
