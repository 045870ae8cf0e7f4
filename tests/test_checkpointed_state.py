"""Checkpointed operator state: an operator restored from its changelog goes on exactly as one
that never stopped.

Each operator runs over a simulated cluster with every kind of record (node churn, lost GPUs,
pending pods, workloads, containers, inventories, samples) and over a replayed trace. Every
few hundred records the keys it reports changed are dumped through JSON into a changelog, as
the worker's checkpoint does. At each cut a fresh operator is loaded from that changelog
alone and the rest of the stream goes through it: its rows must equal the uninterrupted run's.
A change the operator forgets to report leaves a stale key behind, and the rows differ.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import orjson
import pytest
from alert_oracle import SAMPLES

from gpulens.pipeline.alerting import AlertRules
from gpulens.pipeline.checkpointing import (
    PACKED_V1,
    JsonText,
    decode_key,
    encode_key,
    encode_value,
    pack,
    unpack,
)
from gpulens.pipeline.idle_owners import IdleRules
from gpulens.pipeline.operators import (
    AlertOperator,
    AllocationOperator,
    DeviceChangelogOperator,
    IdleOwnersOperator,
    Operator,
    PendingWaitsOperator,
    StateOperator,
    WorkloadUsageOperator,
)
from gpulens.pipeline.positions import InputPositions
from gpulens.pipeline.windows import TumblingWindows
from gpulens.producers.replay import alibaba_v2023, genai_duty
from gpulens.producers.replay.locating import traces_dir
from gpulens.producers.simulate import ClusterSimulation, SimulationSpec
from gpulens.schemas.model.models import ChangeType, Event, GpuSampleBatch, PodEvent

TRACE = traces_dir() / "alibaba-gpu-v2023"
CYCLE = 250
"""Records per checkpoint."""


def simulated() -> list[Event]:
    spec = SimulationSpec(
        nodes=12, gpus_per_node=4, interval_s=30.0, start=datetime(2025, 1, 1, tzinfo=UTC),
        duration_s=4 * 3600.0, cluster="sim", seed=7, churn=20.0, load=1.2,
    )  # fmt: skip
    return [event for _, event in ClusterSimulation(spec).events()]


def alibaba() -> list[Event]:
    events = alibaba_v2023.plan(
        alibaba_v2023.read_nodes(TRACE / "openb_node_list_gpu_node.csv"),
        alibaba_v2023.read_pods(TRACE / "openb_pod_list_gpushare100.csv"),
        cluster="alibaba",
        epoch=datetime(2023, 1, 1, tzinfo=UTC),
    )
    return [event for _, event in events][:8_000]  # days of churn: enough, and quick


def genai() -> list[Event]:
    events = genai_duty.plan(genai_duty.read_samples(SAMPLES), cluster="genai")
    return [event for _, event in events][:15_000]


OPERATORS: dict[str, Callable[[], Operator]] = {
    "allocation": lambda: AllocationOperator(TumblingWindows(600_000), per_node=True, overview=True),
    "workloads": lambda: WorkloadUsageOperator(TumblingWindows(600_000)),
    "idle": lambda: IdleOwnersOperator(
        TumblingWindows(600_000),
        IdleRules(
            idle_below=20.0, compute_idle_below=1.0, memory_floor_bytes=1 << 30, sample_valid_ms=120_000
        ),
    ),
    "alerts": lambda: AlertOperator(AlertRules(idle_below_pct=20.0, idle_for_s=300.0, pending_for_s=120.0)),
    "changelog": DeviceChangelogOperator,
    "state": StateOperator,
    "pending": lambda: PendingWaitsOperator(TumblingWindows(300_000)),
}
STREAMS: dict[str, Callable[[], list[Event]]] = {"simulated": simulated, "alibaba": alibaba, "genai": genai}


def save(operator: Operator, changelog: dict[bytes, str]) -> int:
    """Write the keys the operator changed into ``changelog``, as a checkpoint does; how many."""
    written = 0
    for key in operator.state.changed():
        value = operator.state.dump(key)
        written += 1
        if value is None:
            changelog.pop(encode_key(key), None)
        else:
            changelog[encode_key(key)] = encode_value(value).decode()
    return written


def restored(make: Callable[[], Operator], changelog: dict[bytes, str]) -> Operator:
    operator = make()
    for raw, value in changelog.items():
        operator.state.load(decode_key(raw), json.loads(value))
    return operator


def run(make: Callable[[], Operator], events: list[Event], cuts: set[int]) -> tuple[list, int]:
    """Rows of ``events``, restarting from the changelog at every cut; changelog records written."""
    operator, changelog, written = make(), {}, 0
    rows: list = []
    for index, event in enumerate(events):
        if index in cuts:
            operator = restored(make, changelog)
        if any(isinstance(event, spec.record) for spec in operator.inputs):
            rows += operator.process(event)
        if index % CYCLE == CYCLE - 1 or index + 1 in cuts:
            written += save(operator, changelog)
    return rows, written


@pytest.fixture(scope="module", params=sorted(STREAMS))
def stream(request: pytest.FixtureRequest) -> list[Event]:
    return STREAMS[request.param]()


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_an_operator_restored_from_its_changelog_gives_the_rows_of_one_never_stopped(
    name: str, stream: list[Event]
) -> None:
    make = OPERATORS[name]
    expected, _ = run(make, stream, set())
    relevant = [e for e in stream if any(isinstance(e, spec.record) for spec in make().inputs)]
    if not relevant:
        pytest.skip(f"the stream has no input of {name}")
    cuts = {len(stream) * k // 7 + k for k in range(1, 7)}  # mid-cycle cuts, not on cycle bounds
    restored, _ = run(make, stream, cuts)
    assert restored == expected


def with_silent_gpus() -> list[Event]:
    """The simulated cluster, where half the nodes' last GPU goes silent for the middle third of
    the stream (hours, past the samples' validity) and comes back."""
    events = simulated()
    third = len(events) // 3
    silent = {event.node for event in events if isinstance(event, GpuSampleBatch)}
    silent = set(sorted(silent)[::2])
    return [
        event.model_copy(update={"samples": event.samples[:-1]})
        if third <= index < 2 * third and isinstance(event, GpuSampleBatch) and event.node in silent
        else event
        for index, event in enumerate(events)
    ]


def test_the_idle_split_restored_gives_the_rows_of_one_never_stopped_while_gpus_fall_silent() -> None:
    """A steady sample's validity is checkpointed per node; a GPU missing from its node's batches
    keeps its own, and a restore must not give it the node's."""
    make = OPERATORS["idle"]
    events = with_silent_gpus()
    expected, _ = run(make, events, set())
    cuts = {len(events) * k // 11 + k for k in range(1, 11)}
    restored, _ = run(make, events, cuts)
    assert restored == expected


def gapped() -> list[Event]:
    """The simulated cluster, its second half a day later: one record closes 144 windows."""
    events = simulated()
    half = len(events) // 2
    later = [e.model_copy(update={"event_time": e.event_time + timedelta(days=1)}) for e in events[half:]]
    return events[:half] + later


@pytest.mark.parametrize("name", ["allocation", "workloads", "idle", "pending"])
def test_a_checkpoint_between_two_windows_of_a_gap_resumes_with_the_windows_left(name: str) -> None:
    """The worker commits between two windows an event closes, and after a crash gives the event
    again: two commits in a gap, a crash, a restore from the changelog, the event again."""
    make = OPERATORS[name]
    events = [e for e in gapped() if any(isinstance(e, spec.record) for spec in make().inputs)]
    expected, _ = run(make, events, set())
    operator, changelog, rows, crashes = make(), {}, [], 0
    for event in events:
        crashed = True
        while crashed:
            crashed = False
            for index, window in enumerate(operator.advance(event)):
                rows += window
                if index in (2, 5):  # a commit between two windows; after the second one a crash
                    save(operator, changelog)
                if index == 5:
                    operator, crashed, crashes = restored(make, changelog), True, crashes + 1
                    break
        rows += operator.process(event)
    assert crashes > 20, "the gap was cut many times"
    assert rows == expected


def test_the_changelog_holds_the_live_keys_only() -> None:
    """After the stream, the changelog has exactly the keys the operator reports live."""
    stream = simulated()
    for make in OPERATORS.values():
        operator, changelog = make(), {}
        for event in stream:
            if any(isinstance(event, spec.record) for spec in operator.inputs):
                operator.process(event)
            for key in operator.state.changed():
                value = operator.state.dump(key)
                if value is None:
                    changelog.pop(key, None)
                else:
                    changelog[key] = value
        assert set(changelog) == set(operator.state.live())


def test_input_positions_skip_what_a_cluster_processed_past_the_restart_offset() -> None:
    positions = InputPositions()
    positions.processed("a", "pods", 0, 10)  # cluster a ran ahead on the shared partition
    positions.processed("b", "pods", 0, 4)  # cluster b still waits on offset 5
    positions.advance({("pods", 0): 5})
    changelog = {key: positions.dump(key) for key in positions.changed()}
    restored = InputPositions()
    for key, value in changelog.items():
        if value is not None:
            restored.load(key, value)
    assert restored.restart == {("pods", 0): 5}
    assert restored.seen("a", "pods", 0, 10) and not restored.seen("a", "pods", 0, 11)
    assert not restored.seen("b", "pods", 0, 5)


def test_input_positions_forget_what_a_lost_log_held() -> None:
    positions = InputPositions()
    positions.processed("a", "pods", 0, 10)
    positions.processed("b", "pods", 0, 4)
    positions.advance({("pods", 0): 5})
    positions.changed()
    positions.rewound("pods", 0, 8)  # the broker lost offsets 8..10: new records go there
    assert positions.seen("a", "pods", 0, 7) and not positions.seen("a", "pods", 0, 8)
    assert not positions.seen("b", "pods", 0, 5)
    assert {key: positions.dump(key) for key in positions.changed()} == {("done", "a", "pods", 0): 7}


@pytest.fixture(scope="module")
def cluster_start() -> list[Event]:
    """What a 2,000-node cluster (16,000 GPUs) sends at its first instant: nodes, inventories,
    workloads, pods and containers all at once."""
    spec = SimulationSpec(
        nodes=2_000, gpus_per_node=8, interval_s=2.0, start=datetime(2025, 1, 1, tzinfo=UTC),
        duration_s=4, cluster="start",
    )  # fmt: skip
    events = [event for _, event in ClusterSimulation(spec).events()]
    return [event for event in events if event.event_time == events[0].event_time]


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_no_state_entry_grows_with_what_happens_at_one_instant(name: str, cluster_start: list[Event]) -> None:
    """Every entry a checkpoint writes stays the size of one thing (the largest: a node's
    inventory), far under the broker's 1 MB record. The workloads changed at the instant were
    once listed in one entry: 158 KB here, 1.1 MB at 125,000 GPUs, and the worker exited."""
    operator = OPERATORS[name]()
    for event in cluster_start:
        if any(isinstance(event, spec.record) for spec in operator.inputs):
            operator.process(event)
    sizes = [len(encode_value(operator.state.dump(key))) for key in operator.state.live()]
    assert len(sizes) >= 2_000  # an entry per node at least
    assert max(sizes) <= 8 * 1024


@pytest.mark.parametrize("name", ["allocation", "workloads", "idle", "alerts", "pending"])
def test_state_keeps_no_key_for_a_deleted_pod(name: str) -> None:
    """What a restart restores follows the pods that exist, not every pod there ever was."""
    operator, existing = OPERATORS[name](), set()
    for event in alibaba():
        if isinstance(event, PodEvent):
            (existing.discard if event.type == ChangeType.DELETED else existing.add)(event.uid)
        if any(isinstance(event, spec.record) for spec in operator.inputs):
            operator.process(event)
    pod_keys = {key[2] for key in operator.state.live() if key[0] in ("pod", "holding", "pending")}
    assert pod_keys, "the stream leaves pods running"
    assert pod_keys <= existing


def test_a_state_key_is_written_as_json_writes_it_whatever_its_characters() -> None:
    """A key's bytes name its entry in every log, older ones included: the same bytes as the
    standard library's compact JSON for every character (control, DEL, beyond ASCII) and for
    integers beyond 64 bits."""
    characters = "".join(map(chr, range(0x250))) + "\u2028\ud7ff\U0001f600"
    keys = [("pod", "c", character) for character in characters]
    keys += [("acc", "c", characters, 2**70, -(2**63), 0), ("cluster", "")]
    for key in keys:
        assert encode_key(key) == json.dumps(key, separators=(",", ":")).encode(), key
        assert decode_key(encode_key(key)) == key


def test_a_value_kept_as_json_text_is_written_as_the_value_it_holds() -> None:
    """A part that keeps a value as JSON text (a node's inventory) dumps it as such: written as
    it is, also in a batch the standard library writes (an integer beyond 64 bits beside it)."""
    inventory = {"node": "n1", "gpus": [{"device_id": "GPU-é", "vram_mib": 81_920}]}
    fragment = JsonText(orjson.dumps(inventory))
    for beside in (1, 2**70):
        pairs: list[tuple[tuple, object]] = [(("inventory", "c", "n1"), fragment), (("n", "c"), beside)]
        read = [(decode_key(key), value) for record, _ in pack(pairs) for key, value in unpack(record)]
        assert read == [(("inventory", "c", "n1"), inventory), (("n", "c"), beside)]
    assert encode_value(fragment) == fragment.text  # as it is: not parsed and written again


def test_packed_entries_come_back_as_written() -> None:
    """Values orjson does not write (integers beyond 64 bits, keys that are not strings) are
    written as the standard library writes them; a batch holding NaN, as older logs may, reads."""
    pairs: list[tuple[tuple, object]] = [
        (("slot", "c", "n", "GPU-é"), [1.5, 2**70, None, {"a": [True]}]),
        (("acc", "c", 7), {1: "one"}),
        (("gone", "c"), None),
    ]
    read = [(decode_key(key), value) for record, _ in pack(pairs) for key, value in unpack(record)]
    assert read == [(pairs[0][0], pairs[0][1]), (pairs[1][0], {"1": "one"}), (pairs[2][0], None)]
    older = PACKED_V1 + json.dumps([[["x", "c"], float("nan")]]).encode()
    [(key, value)] = list(unpack(older))
    assert decode_key(key) == ("x", "c") and value != value  # NaN
