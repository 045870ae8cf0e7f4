"""`gpulens infra up|down|status` and `gpulens up` as a user runs them: real processes, real ports."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from sink_support import wait_for
from worker_support import nice_of, thread_named, thread_nices

from gpulens.config import GPULensSettings, load_settings
from gpulens.infra.clickhouse.allocator import ENGINE_MALLOC_CONF
from gpulens.infra.launching import LaunchError, ServiceManager, ServiceSpec, State
from gpulens.main_job import WORKER_NICE
from gpulens.platform import (
    CLICKHOUSE,
    EPHEMERAL_PORTS,
    free_port,
    manager,
    service_specs,
    write_private_config,
)
from gpulens.testing.examples import example_events

GPULENS = [sys.executable, "-m", "gpulens"]


def status_pids(status: str) -> dict[str, int]:
    """The pid of each running service, as `status` prints them."""
    return {
        line.split()[0]: int(line.split("pid")[1].split()[0]) for line in status.splitlines() if "pid" in line
    }


def run(config: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULENS_")}
    return subprocess.run(
        [*GPULENS, "--config", str(config), *args],
        capture_output=True,
        text=True,
        check=check,
        env=env,
        timeout=240,
    )


@pytest.fixture
def own_platform(tmp_path: Path):
    """A second, private platform (its own ports and state), always taken down."""
    config = write_private_config(tmp_path)
    yield config
    run(config, "down", check=False)


def test_up_twice_is_harmless_and_down_stops_exactly_what_up_started(own_platform: Path) -> None:
    first = run(own_platform, "infra", "up")
    assert first.stdout.count("started ") == 3
    second = run(own_platform, "infra", "up")
    assert second.stdout.count("already running") == 3
    pids = [int(line.split("pid")[1]) for line in first.stdout.splitlines() if "pid" in line]
    assert [int(line.split("pid")[1]) for line in second.stdout.splitlines() if "pid" in line] == pids

    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        down = run(own_platform, "infra", "down")
        assert down.stdout.count("stopped") == 3
        for pid in pids:
            assert (
                not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
            )
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()
    status = run(own_platform, "infra", "status")
    assert status.stdout.count("stopped") == 3


@pytest.mark.skipif(not EPHEMERAL_PORTS.exists(), reason="no ephemeral port range to stay below")
def test_free_ports_are_distinct_and_none_an_outgoing_connection_could_take() -> None:
    """A client's source port comes from the ephemeral range: a free port handed out there
    could be taken before its service binds it."""
    low = int(EPHEMERAL_PORTS.read_text().split()[0])
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert max(ports) < low
    assert min(ports) >= 20_000, "below: the configuration's default ports (18081, 19092, ...)"
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_recycled_pid_is_never_signalled(tmp_path: Path) -> None:
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        # A pid file left by a crashed broker whose pid now belongs to someone else.
        (run_dir / "kafka.pid").write_text(
            json.dumps({"pid": stranger.pid, "argv": ["/opt/noida-db", "start"]})
        )
        services = ServiceManager(tmp_path)
        assert services.status("kafka").state is State.STALE
        assert services.stop("kafka") is False
        assert stranger.poll() is None
        assert not (run_dir / "kafka.pid").exists()
    finally:
        stranger.kill()
        stranger.wait()


def test_a_port_in_use_is_a_one_line_error_naming_the_setting(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        config = write_private_config(tmp_path, kafka_port=port)
        result = run(config, "infra", "up", check=False)
    assert result.returncode == 1
    error = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert error == [
        f"error: kafka: port {port} on 127.0.0.1 is already in use by another program; "
        "stop it or set GPULENS_KAFKA__BOOTSTRAP_SERVERS to another host:port"
    ]


def test_a_missing_binary_says_how_to_install_it(tmp_path: Path) -> None:
    services = ServiceManager(tmp_path)
    spec = ServiceSpec("kafka", [str(tmp_path / "bin" / "noida-db"), "start"], "127.0.0.1", 1)
    with pytest.raises(LaunchError, match=r"noida-db is missing; run `make install`"):
        services.start(spec)


def test_a_service_that_dies_while_starting_shows_its_log(tmp_path: Path) -> None:
    services = ServiceManager(tmp_path)
    script = "import sys; print('bad flag --frobnicate'); sys.exit(3)"
    spec = ServiceSpec("broken", [sys.executable, "-c", script], "127.0.0.1", 1)
    with pytest.raises(LaunchError, match=r"(?s)exited with code 3.*bad flag --frobnicate"):
        services.start(spec)
    assert services.status("broken").state is State.STOPPED


def test_a_killed_service_shows_as_stale_and_up_restarts_it(own_platform: Path) -> None:
    run(own_platform, "infra", "up")
    status = run(own_platform, "infra", "status").stdout
    os.kill(status_pids(status)["registry"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while "stale" not in run(own_platform, "infra", "status").stdout and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "registry    stale" in run(own_platform, "infra", "status").stdout
    again = run(own_platform, "infra", "up").stdout
    assert "registry    started" in again
    assert again.count("already running") == 2


def test_gpulens_up_private_starts_the_pipeline_and_down_with_its_config_stops_it(tmp_path: Path) -> None:
    """`up --private DIR`: a platform of free ports under DIR, told by what it prints."""
    directory = tmp_path / "mine"
    config = directory / "gpulens.toml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULENS_")}
    try:
        result = subprocess.run(
            [*GPULENS, "up", "--private", str(directory), "--no-replay"],
            capture_output=True, text=True, check=True, env=env, timeout=240,
        )  # fmt: skip
        assert f"private platform: config {config}" in result.stdout
        settings = load_settings(config)
        assert settings.platform.state_dir == directory / "state"
        assert f"Kafka            {settings.kafka.bootstrap_servers}" in result.stdout
        assert f"schema registry  {settings.registry.url}" in result.stdout
        assert f"ClickHouse SQL   {settings.clickhouse.url}" in result.stdout
        assert f"stop with: gpulens --config {config} down" in result.stdout
        types = len(example_events())  # one per event topic
        assert f"smoke: {types} record types through broker and registry and back" in result.stdout
        assert "  supervisor  started" in result.stdout
        for service in ("worker", "sink", "exporter", "api"):
            assert f"  {service:<11} running" in result.stdout
        pid = status_pids(run(config, "status", check=False).stdout)
        assert nice_of(pid["worker"]) == nice_of(pid["sink"]) + WORKER_NICE, "the samples' path goes first"
        api = f"http://{settings.api.host}:{settings.api.port}"
        assert f"API              {api}/api/clusters" in result.stdout
        assert result.stdout.rstrip().endswith(f"console: {api}/  (the web console; open it in a browser)")
        with urllib.request.urlopen(f"{api}/api/clusters", timeout=30) as response:
            assert response.status == 200 and "data" in json.load(response)
        assert run(config, "sql", "SELECT 1 + 1", "--format", "TSV").stdout == "2\n"
        tables = run(config, "sql", "SHOW TABLES FROM gpulens", "--format", "TSV").stdout.split()
        assert {"cluster_gpu_allocation", "alerts", "workload_gpu_usage", "pod_events"} <= set(tables)
    finally:
        down = run(config, "down", check=False).stdout
    assert "supervisor  stopped" in down
    assert down.count("stopped") == 4, "the supervisor stops what it runs; nothing is left over"
    status = run(config, "status", check=False)
    assert status.returncode == 4, "status says the broker does not answer"
    assert status.stdout.count("stopped") == 4
    assert "running" not in status.stdout


def test_every_command_explains_itself() -> None:
    for args in (
        ["--help"],
        ["infra", "--help"],
        ["infra", "up", "--help"],
        ["topics", "list", "--help"],
        ["serve", "clickhouse", "--help"],
        ["up", "--help"],
        ["sql", "--help"],
    ):
        result = subprocess.run([*GPULENS, *args], capture_output=True, text=True, check=True)
        assert "Usage: " in result.stdout
        assert len(result.stdout.splitlines()) > 3


def test_a_failed_infra_up_stops_what_it_started(tmp_path: Path) -> None:
    config = write_private_config(tmp_path)
    clickhouse_port = load_settings(config).clickhouse.http_port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", clickhouse_port))
        squatter.listen()
        result = run(config, "infra", "up", check=False)
    assert result.returncode == 1
    started = [int(line.split("pid")[1]) for line in result.stdout.splitlines() if " started " in line]
    assert len(started) == 1, "the broker; the registry starts beside the ClickHouse holder"
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [
        f"error: clickhouse: port {clickhouse_port} on 127.0.0.1 is already in use by another program; "
        "stop it or set GPULENS_CLICKHOUSE__HTTP_PORT (and clickhouse.url) to another port"
    ]
    for pid in started:
        assert not Path(f"/proc/{pid}").exists(), f"pid {pid} was left running"
    assert run(config, "infra", "status").stdout.count("stopped") == 3


def test_an_unreachable_broker_is_one_clear_line_within_10_s(tmp_path: Path) -> None:
    config = write_private_config(tmp_path)  # nothing started: nobody listens on its ports
    commands = {
        "worker": ["worker"],
        "sink": ["sink"],
        "exporter": ["exporter"],
        "replay": ["replay", "genai-duty"],
        "simulate": ["simulate", "--duration", "1"],
    }
    for name, args in commands.items():
        began = time.monotonic()
        result = run(config, *args, check=False)
        took = time.monotonic() - began
        assert result.returncode == 69, f"{name}: EX_UNAVAILABLE, try again later"
        assert took < 10, f"{name} took {took:.1f} s to say the broker is unreachable"
        errors = [line for line in result.stderr.splitlines() if " INFO " not in line]
        assert len(errors) == 1, f"{name}: {result.stderr}"
        assert errors[0].startswith(
            f"error: no Kafka broker answered at {load_settings(config).kafka.bootstrap_servers} "
            "(no bootstrap server accepts connections); start the embedded one with `gpulens infra up`"
        ), name


def test_down_waits_for_a_broker_saving_its_data_and_loses_none(own_platform: Path) -> None:
    run(own_platform, "infra", "up")
    settings = load_settings(own_platform)
    servers = settings.kafka.bootstrap_servers
    admin = AdminClient({"bootstrap.servers": servers})
    admin.create_topics([NewTopic("held", 3, 1)])["held"].result()
    acked = 0

    def delivered(err: object, _message: object) -> None:
        nonlocal acked
        acked += err is None

    producer = Producer({"bootstrap.servers": servers, "linger.ms": 20})
    for i in range(
        120_000
    ):  # 120 MB: on a busy machine the broker saves it for about as long as the old 15 s limit
        while True:
            try:
                producer.produce("held", key=str(i).encode(), value=b"v" * 1000, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(120)
    assert acked == 120_000

    down = run(own_platform, "infra", "down")
    assert "kafka       stopped" in down.stdout
    assert "killing it" not in down.stderr
    run(own_platform, "infra", "up")
    consumer = Consumer({"bootstrap.servers": servers, "group.id": "held"})
    try:
        deadline = time.monotonic() + 120
        while True:  # the restarted broker accepts connections before its data is loaded
            try:
                ends = [
                    consumer.get_watermark_offsets(TopicPartition("held", p), timeout=10)[1] for p in range(3)
                ]
                break
            except KafkaException:
                assert time.monotonic() < deadline, "the restarted broker never answered"
    finally:
        consumer.close()
    assert sum(ends) == acked


def _rss_mb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) // 1024


def test_the_broker_hands_back_the_memory_of_records_it_deleted(own_platform: Path) -> None:
    """noida-db holds every record in memory; once deleted (as `gpulens retention` deletes them),
    that memory must leave the process, or its RSS stays at its high-water mark for good."""
    run(own_platform, "infra", "up")
    settings = load_settings(own_platform)
    broker = ServiceManager(settings.platform.state_dir).status("kafka").pid
    assert broker is not None
    servers = settings.kafka.bootstrap_servers
    admin = AdminClient({"bootstrap.servers": servers})
    admin.create_topics([NewTopic("deleted", 3, 1)])["deleted"].result()
    before = _rss_mb(broker)

    producer = Producer({"bootstrap.servers": servers, "linger.ms": 20})
    value = os.urandom(1000)
    for i in range(100_000):  # 100 MB
        while True:
            try:
                producer.produce("deleted", key=str(i).encode(), value=value)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0
    consumer = Consumer({"bootstrap.servers": servers, "group.id": "deleted"})
    try:
        ends = [
            TopicPartition(
                "deleted", p, consumer.get_watermark_offsets(TopicPartition("deleted", p), timeout=10)[1]
            )
            for p in range(3)
        ]
    finally:
        consumer.close()
    assert sum(tp.offset for tp in ends) == 100_000
    # The payload is 100 MB; what the broker's RSS shows of it varies a little by machine.
    assert _rss_mb(broker) > before + 80
    for done in admin.delete_records(ends).values():
        done.result()

    deadline = time.monotonic() + 60
    while _rss_mb(broker) > before + 40:  # with glibc malloc's defaults about 100 MB of it stayed
        assert time.monotonic() < deadline, (
            f"the broker still holds {_rss_mb(broker)} MB ({before} MB before)"
        )
        time.sleep(0.5)


def test_the_brokers_saving_thread_yields_to_the_threads_answering_clients(platform: GPULensSettings) -> None:
    """noida-db rewrites all it holds at every save: at the lowest priority it saves with the
    CPU the samples' path leaves (a third of a core at 100,000 GPUs before)."""
    broker = manager(platform).status("kafka").pid
    assert broker is not None
    nice: dict[str, set[int]] = {}
    for name, value in thread_nices(broker):
        nice.setdefault(name, set()).add(value)
    assert nice["autosave"] == {19}
    assert nice["noida-db"] == {0}, "the threads answering clients keep the broker's priority"


LATE_THREAD = """
import socket, sys, threading, time
listener = socket.socket()
listener.bind(("127.0.0.1", int(sys.argv[1])))
listener.listen()
time.sleep(1.0)  # it answers a second before its background thread exists


def background() -> None:
    with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as comm:
        comm.write("autosave")
    time.sleep(600)


threading.Thread(target=background, daemon=True).start()
time.sleep(600)
"""


def test_a_thread_to_lower_that_starts_after_the_service_answers_is_lowered_too(tmp_path: Path) -> None:
    port = free_port()
    spec = ServiceSpec(
        "late",
        [sys.executable, "-c", LATE_THREAD, str(port)],
        "127.0.0.1",
        port,
        thread_nice={"autosave": 19},
    )
    services = ServiceManager(tmp_path)
    status, _ = services.start(spec)
    try:
        assert status.pid is not None
        pid = status.pid

        wait_for(lambda: thread_named(pid, "autosave") is not None, 10, "the service's late thread")
        assert nice_of(pid, thread_named(pid, "autosave")) == 19
        assert nice_of(pid) == 0, "the rest of the service keeps its priority"
    finally:
        services.stop("late")


def test_the_clickhouse_holder_runs_merges_below_inserts_and_queries(platform: GPULensSettings) -> None:
    query = urllib.parse.urlencode({
        "query": "SELECT value FROM system.server_settings WHERE name = 'os_threads_nice_value_merge_mutate'"
    })  # fmt: skip
    with urllib.request.urlopen(f"{platform.clickhouse.url}/?{query}", timeout=30) as response:
        assert response.read().decode().strip() == "19"


def test_the_clickhouse_holder_hands_freed_pages_back_within_half_a_second(platform: GPULensSettings) -> None:
    """chDB's jemalloc keeps freed pages 5 s by ClickHouse's build; the holder asks for 500 ms
    (its peak while sinking a fleet's backlog fell by about 70 MB)."""
    query = urllib.parse.urlencode({"query": "SELECT * FROM system.jemalloc_stats FORMAT TSVRaw"})
    with urllib.request.urlopen(f"{platform.clickhouse.url}/?{query}", timeout=30) as response:
        stats = response.read().decode()
    assert "opt.dirty_decay_ms: 500 " in stats


def test_a_users_own_jemalloc_options_for_the_holder_stand(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings = load_settings(write_private_config(tmp_path))
    assert service_specs(settings)[CLICKHOUSE].env["JE_MALLOC_CONF"] == ENGINE_MALLOC_CONF
    monkeypatch.setenv("JE_MALLOC_CONF", "dirty_decay_ms:0")
    assert "JE_MALLOC_CONF" not in service_specs(settings)[CLICKHOUSE].env


def _heap_mb(pid: int) -> float:
    """The resident size of a process's glibc heap (``[heap]`` in its smaps), MB."""
    resident_kb, in_heap = 0, False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if fields[0].endswith(":"):
            if in_heap and fields[0] == "Rss:":
                resident_kb += int(fields[1])
        else:  # a mapping's first line: range, perms, offset, device, inode[, name]
            in_heap = fields[-1] == "[heap]"
    return resident_kb / 1024


def test_the_clickhouse_holder_keeps_no_insert_body_resident_once_inserted(platform: GPULensSettings) -> None:
    """glibc's own bounds let a freed body of some MB grow the heap for good (a probe's bodies of
    3-12 MB took it from 14 to 29 MB; 62 MB through a 100,000-GPU run)."""
    pid = manager(platform).status(CLICKHOUSE).pid
    assert pid is not None
    url = platform.clickhouse.url

    def post(sql: str, body: bytes = b"") -> None:
        request = urllib.request.Request(f"{url}/?{urllib.parse.urlencode({'query': sql})}", data=body)
        with urllib.request.urlopen(request, timeout=60) as response:
            response.read()

    post("CREATE TABLE heap_probe (s String) ENGINE = MergeTree ORDER BY tuple()")
    try:
        before, after = _heap_mb(pid), []
        for megabytes in (6, 6, 12, 12, 6, 3):
            post("INSERT INTO heap_probe FORMAT TSV", (b"x" * 1023 + b"\n") * (megabytes * 1024))
            after.append(round(_heap_mb(pid), 1))
        assert max(after) - before < 4, f"the heap was {before:.1f} MB, then {after} after each insert"
    finally:
        post("DROP TABLE heap_probe SYNC")


def test_a_users_own_glibc_malloc_bounds_for_the_holder_stand(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings = load_settings(write_private_config(tmp_path))
    assert service_specs(settings)[CLICKHOUSE].env["MALLOC_MMAP_THRESHOLD_"] == "131072"
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "1048576")
    env = service_specs(settings)[CLICKHOUSE].env
    assert "MALLOC_MMAP_THRESHOLD_" not in env, "theirs reaches the holder from its environment"
    assert env["MALLOC_TRIM_THRESHOLD_"] == "131072", "the bound they left unset stays fixed"
