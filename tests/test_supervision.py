"""A supervised process that exits is started again, with growing delays while it keeps failing."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from allocation_oracle import expected_rows
from prometheus_client.parser import text_string_to_metric_families
from trace_slices import head_of

from gpulens.config import load_settings
from gpulens.infra.launching import ServiceManager, ServiceSpec, State
from gpulens.infra.supervising import Supervisor, describe_exit, read_restarts
from gpulens.platform import write_private_config
from gpulens.producers.replay import alibaba_v2023
from gpulens.producers.replay.locating import traces_dir
from gpulens.schemas.model.models import PodEvent
from gpulens.testing.clocks import ManualClock


def sleeper(name: str) -> ServiceSpec:
    return ServiceSpec(name, [sys.executable, "-c", "import time; time.sleep(600)"])


def test_a_killed_service_is_restarted_and_the_restart_recorded(tmp_path: Path) -> None:
    services = ServiceManager(tmp_path)
    supervisor = Supervisor(services, [sleeper("napper")], backoff_s=0.1)
    supervisor.start_all()
    try:
        first = services.status("napper").pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while not supervisor.restarts and time.monotonic() < deadline:
            supervisor.check()
            time.sleep(0.05)
        again = services.status("napper")
        assert again.state is State.RUNNING
        assert again.pid != first
        assert [(r.name, r.count, r.exit_status) for r in read_restarts(services)] == [
            ("napper", 1, "killed by SIGKILL")
        ]
    finally:
        supervisor.stop_all()
    assert services.status("napper").state is State.STOPPED


def test_a_service_that_keeps_failing_is_retried_with_doubling_delays(tmp_path: Path) -> None:
    services = ServiceManager(tmp_path)
    failing = ServiceSpec(
        "crasher", [sys.executable, "-c", "print('attempt', flush=True); raise SystemExit(3)"]
    )
    clock = ManualClock()
    supervisor = Supervisor(services, [failing], backoff_s=1.0, max_backoff_s=4.0, clock=clock)
    for now in (0.0, 0.5, 1.0, 2.9, 3.0, 6.9, 7.0, 10.9, 11.0):
        clock.now = now
        supervisor.check()
    attempts = services.log_path("crasher").read_text().count("attempt")
    assert attempts == 5, "tries at 0, 1, 3, 7 and 11 s: delays 1, 2, 4, then capped at 4"
    assert supervisor.restarts == []


def test_supervising_goes_on_when_its_state_files_cannot_be_written(tmp_path: Path) -> None:
    services = ServiceManager(tmp_path)
    supervisor = Supervisor(services, [sleeper("napper")], backoff_s=0.1)
    supervisor.start_all()
    try:
        supervisor.restarts_file.mkdir()  # restarts.json cannot be written (as on a full disk)
        for round_ in (1, 2):
            pid = services.status("napper").pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while len(supervisor.restarts) < round_ and time.monotonic() < deadline:
                supervisor.check()
                time.sleep(0.05)
            assert services.status("napper").state is State.RUNNING
        assert [r.count for r in supervisor.restarts] == [1, 2]
        assert supervisor.state_write_failures == 2
    finally:
        supervisor.stop_all()
    assert services.status("napper").state is State.STOPPED


def test_a_supervised_log_is_rotated_once_it_passes_its_bound(tmp_path: Path) -> None:
    services = ServiceManager(tmp_path)
    chatty = ServiceSpec(
        "chatty", [sys.executable, "-c", "import time; print('x' * 9_999, flush=True); time.sleep(600)"]
    )
    supervisor = Supervisor(services, [chatty], log_max_bytes=5_000, log_backups=2)
    supervisor.start_all()
    log = services.log_path("chatty")
    try:
        deadline = time.monotonic() + 30
        while not log.with_name("chatty.log.1").exists() and time.monotonic() < deadline:
            supervisor.check()
            time.sleep(0.05)
        assert log.with_name("chatty.log.1").read_text() == "x" * 9_999 + "\n"
        assert log.stat().st_size == 0
        assert not log.with_name("chatty.log.2").exists()
        assert services.status("chatty").state is State.RUNNING
    finally:
        supervisor.stop_all()


def test_exit_statuses_are_described_for_people() -> None:
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(2) == "exit code 2"
    assert describe_exit(None) == "exited"


# --- the pipeline under `gpulens up` -------------------------------------------------------------

GPULENS = [sys.executable, "-m", "gpulens"]
PODS_CSV = traces_dir() / "alibaba-gpu-v2023/openb_pod_list_default.csv"
NODES_CSV = traces_dir() / "alibaba-gpu-v2023/openb_node_list_gpu_node.csv"
EPOCH = datetime(2023, 1, 1, tzinfo=UTC)


def gpulens(
    config: Path, *args: str, env: dict[str, str] | None = None, exits: tuple[int, ...] = (0,)
) -> str:
    """The command's output; its exit status must be one of ``exits``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPULENS_")}
    result = subprocess.run(
        [*GPULENS, "--config", str(config), *args],
        capture_output=True,
        text=True,
        env={**clean, **(env or {})},
        timeout=300,
    )
    assert result.returncode in exits, result.stderr
    return result.stdout


def status(config: Path) -> str:
    """``gpulens status``'s report: it exits 0 when the pipeline has drained and 3 while records
    are left, both answers here."""
    return gpulens(config, "status", exits=(0, 3))


def sql(config: Path, query: str) -> list[list[str]]:
    return [line.split("\t") for line in gpulens(config, "sql", query, "--format", "TSV").splitlines()]


def count(config: Path, query: str) -> int:
    return int(sql(config, query)[0][0])


def pid_of(config: Path, name: str) -> int:
    line = next(line for line in status(config).splitlines() if line.split()[:1] == [name])
    return int(line.split("pid")[1].split()[0])


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)


@pytest.fixture
def running_up(tmp_path: Path) -> Iterator[Path]:
    """`gpulens up --no-replay` on a private platform, always taken down."""
    config = write_private_config(tmp_path)
    try:
        gpulens(config, "up", "--no-replay")
        yield config
    finally:
        subprocess.run([*GPULENS, "--config", str(config), "down"], capture_output=True, timeout=300)


def exported(config: Path, name: str, cluster: str) -> float | None:
    """The value of ``name{cluster=...}`` on the exporter's /metrics, None while it has none."""
    exporter = load_settings(config).exporter
    with urllib.request.urlopen(f"http://{exporter.host}:{exporter.port}/metrics", timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("cluster") == cluster:
                return sample.value
    return None


def capacity_of(nodes_csv: Path) -> int:
    """GPUs of every node in the trace (all Ready and schedulable from the replay's start)."""
    with nodes_csv.open() as handle:
        return sum(int(row["gpu"]) for row in csv.DictReader(handle))


def test_processes_killed_during_up_are_restarted_and_lose_no_record(running_up: Path) -> None:
    config, cluster = running_up, "supervised"
    pods_csv = head_of(PODS_CSV, 1_000, config.parent / "pods.csv")  # spans every window, as all do
    pod_events = sum(
        isinstance(event, PodEvent)
        for _, event in alibaba_v2023.plan(
            alibaba_v2023.read_nodes(NODES_CSV),
            alibaba_v2023.read_pods(pods_csv),
            cluster=cluster,
            epoch=EPOCH,
        )
    )
    windows = expected_rows(pods_csv, 3600)
    where = f"FROM gpulens.{{table}} FINAL WHERE cluster = '{cluster}'"
    gpulens(config, "replay", "alibaba-v2023", "--pods", str(pods_csv), env={"GPULENS_CLUSTER": cluster})

    wait_for(lambda: count(config, f"SELECT count() {where.format(table='pod_events')}") > 0, 120, "pod rows")
    sink, worker = pid_of(config, "sink"), pid_of(config, "worker")
    os.kill(sink, signal.SIGKILL)
    os.kill(worker, signal.SIGKILL)
    wait_for(lambda: "restarted worker" in status(config), 60, "the worker's restart")
    wait_for(
        lambda: (
            count(config, f"SELECT count() {where.format(table='cluster_gpu_allocation')}") >= len(windows)
        ),
        300,
        "every allocation window in ClickHouse",
    )
    wait_for(
        lambda: count(config, f"SELECT count() {where.format(table='pod_events')}") >= pod_events,
        120,
        "every pod event in ClickHouse",
    )

    report = status(config)
    assert "restarted sink" in report and "killed by SIGKILL" in report
    assert pid_of(config, "sink") != sink and pid_of(config, "worker") != worker
    stored = sql(config, f"SELECT count(), uniqExact(event_id) {where.format(table='pod_events')}")
    assert stored == [[str(pod_events), str(pod_events)]], "every pod event stored exactly once"
    allocation = where.format(table="cluster_gpu_allocation")
    rows = sql(config, f"SELECT toUnixTimestamp(window_start), gpus_allocated_avg {allocation} ORDER BY 1")
    epoch = int(EPOCH.timestamp())
    assert [int(start) - epoch for start, _ in rows] == [w.window_start for w in windows]
    assert [float(avg) for _, avg in rows] == pytest.approx([w.gpus_allocated_avg for w in windows], abs=1e-6)

    # Prometheus shows the allocation rate of the newest window, as the CSV gives it.
    last_rate = windows[-1].gpus_allocated_avg / capacity_of(NODES_CSV)
    wait_for(
        lambda: exported(config, "gpu_allocation_rate", cluster) == pytest.approx(last_rate, abs=1e-9),
        60,
        f"gpu_allocation_rate{{cluster={cluster!r}}} = {last_rate:.6f} on the exporter",
    )
