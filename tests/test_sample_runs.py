"""Runs of GPU sample batches read by column, applied at once, give what one by one gives.

The worker hands a run of one cluster's consecutive batches to each operator that takes runs
(:class:`~gpulens.pipeline.operators.TakesSampleRuns`); an operator that cannot take a run (a
window closes within it, the run is late, ...) says so with None, applies nothing, and gets the
batches one by one. The reference is every event given one by one, windows first, as the
worker gives events outside runs.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

from alert_oracle import SAMPLES
from test_sample_columns import read_by_column

from gpulens.pipeline.alerting import AlertRules
from gpulens.pipeline.operators import (
    INPUT_ORDER,
    AlertOperator,
    AllocationOperator,
    Given,
    Operator,
    TakesSampleRuns,
    WorkloadUsageOperator,
)
from gpulens.pipeline.windows import TumblingWindows
from gpulens.producers.replay import genai_duty
from gpulens.producers.simulate import ClusterSimulation, SimulationSpec
from gpulens.schemas.model.models import Alert
from gpulens.schemas.model.topics import GPU_SAMPLES
from gpulens.schemas.wire.codec import AvroCodec
from gpulens.schemas.wire.sample_columns import SampleColumns

TOPIC_OF = {spec.record: spec for spec in INPUT_ORDER}
Rows = dict[str, list[Any]]


def operators(rules: AlertRules) -> list[Operator]:
    """Every operator that takes runs."""
    windows = TumblingWindows(30_000)
    made: list[Operator] = [
        AllocationOperator(windows, per_node=True, overview=True),
        WorkloadUsageOperator(windows),
        AlertOperator(rules),
    ]
    assert all(isinstance(op, TakesSampleRuns) for op in made)
    return made


def one_at_a_time(operator: Operator, event: Given) -> list[Any]:
    return [row for window in operator.advance(event) for row in window] + list(operator.process(event))


def one_by_one(given: list[Given], made: list[Operator]) -> Rows:
    rows: Rows = {op.name: [] for op in made}
    for event in given:
        topic = GPU_SAMPLES if isinstance(event, SampleColumns) else TOPIC_OF[type(event)]
        for operator in (op for op in made if topic in op.inputs):
            rows[operator.name] += one_at_a_time(operator, event)
    return rows


def in_runs(given: list[Given], made: list[Operator], sizes: random.Random) -> tuple[Rows, int, int]:
    """The rows with the batches in runs of random sizes; how many runs were taken, how many refused."""
    rows: Rows = {op.name: [] for op in made}
    taken = refused = index = 0
    while index < len(given):
        event = given[index]
        if not isinstance(event, SampleColumns):
            for operator in (op for op in made if TOPIC_OF[type(event)] in op.inputs):
                rows[operator.name] += one_at_a_time(operator, event)
            index += 1
            continue
        end, most = index + 1, index + sizes.randint(1, 300)
        while end < min(most, len(given)) and isinstance(given[end], SampleColumns):
            end += 1
        run: list[SampleColumns] = given[index:end]  # type: ignore[assignment]
        for operator in made:
            assert isinstance(operator, TakesSampleRuns)
            result = operator.process_samples(run)
            if result is None:
                refused += 1
                for batch in run:
                    rows[operator.name] += one_at_a_time(operator, batch)
            else:
                taken += 1
                rows[operator.name] += result
        index = end
    return rows, taken, refused


def state(made: list[Operator]) -> dict[str, Any]:
    """What workloads and alerts hold (allocation's held series is settled at fewer instants in
    runs: the same integral, split otherwise, so its rows stand for it)."""
    return {
        op.name: sorted((key, repr(op.state.dump(key))) for key in op.state.live())
        for op in made
        if op.name != "allocation"
    }


def test_runs_of_a_simulated_fleet_give_the_rows_and_state_one_by_one_gives(codec: AvroCodec) -> None:
    spec = SimulationSpec(
        nodes=100, gpus_per_node=8, interval_s=2.0, start=datetime(2025, 1, 1, tzinfo=UTC),
        duration_s=150, cluster="runs", load=1.0, arrivals_per_min=300,  # pods wait
    )  # fmt: skip
    given = read_by_column(codec, (event for _, event in ClusterSimulation(spec).events()))
    rules = AlertRules(idle_for_s=20, pending_for_s=10)  # short enough for both to open
    reference, runs = operators(rules), operators(rules)
    expected = one_by_one(given, reference)
    rows, taken, refused = in_runs(given, runs, random.Random(5))
    assert rows == expected
    assert state(runs) == state(reference)
    assert taken and refused  # both paths ran
    assert {a.alert for a in expected["alerts"] if isinstance(a, Alert)} >= {"GpuIdle", "GpuPodPending"}


def test_runs_of_the_genai_trace_give_the_rows_and_state_one_by_one_gives(codec: AvroCodec) -> None:
    """The GenAI duty cycles: one-GPU batches, idle spells and silent gaps (GpuTelemetryStale)."""
    events = (event for _, event in genai_duty.plan(genai_duty.read_samples(SAMPLES), cluster="genai"))
    given = read_by_column(codec, events)
    rules = AlertRules(idle_for_s=60, stale_after_s=120)
    reference, runs = operators(rules), operators(rules)
    expected = one_by_one(given, reference)
    rows, taken, refused = in_runs(given, runs, random.Random(9))
    assert rows == expected
    assert state(runs) == state(reference)
    assert taken and refused
    assert {a.alert for a in expected["alerts"] if isinstance(a, Alert)} >= {"GpuIdle", "GpuTelemetryStale"}


def test_a_run_a_window_closes_within_is_refused_with_nothing_applied(codec: AvroCodec) -> None:
    spec = SimulationSpec(
        nodes=20, gpus_per_node=8, interval_s=2.0, start=datetime(2025, 1, 1, tzinfo=UTC),
        duration_s=70, cluster="refused",
    )  # fmt: skip
    given = read_by_column(codec, (event for _, event in ClusterSimulation(spec).events()))
    usage = operators(AlertRules())[1]
    first = next(i for i, event in enumerate(given) if isinstance(event, SampleColumns))
    for event in given[:first]:
        one_at_a_time(usage, event)
    batches: list[SampleColumns] = [event for event in given[first:] if isinstance(event, SampleColumns)]
    across = [batch for batch in batches if batch.event_ms < batches[0].event_ms + 40_000]
    before = sorted((key, repr(usage.state.dump(key))) for key in usage.state.live())
    assert isinstance(usage, TakesSampleRuns)
    assert usage.process_samples(across) is None  # 40 s of batches: a 30 s window ends within
    assert sorted((key, repr(usage.state.dump(key))) for key in usage.state.live()) == before
    assert usage.process_samples([batches[0]]) == []  # the first batch alone closes nothing
