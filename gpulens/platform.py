"""The embedded platform as services: Kafka broker, schema registry, ClickHouse holder."""

from __future__ import annotations

import logging
import os
import random
import socket
import sys
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

from gpulens.config import GPULensSettings, load_settings
from gpulens.infra.broker import (
    NOIDA_THREAD_NICE,
    SAVE_PACING_LIBRARY,
    noida_argv,
    noida_env,
    tansu_argv,
)
from gpulens.infra.clickhouse.allocator import engine_env
from gpulens.infra.launching import ServiceManager, ServiceSpec, Status
from gpulens.infra.log_writing import LogRotation
from gpulens.schemas.model.exceptions import ConfigError, GPULensError

log = logging.getLogger(__name__)

BROKER, REGISTRY, CLICKHOUSE = "kafka", "registry", "clickhouse"
STAGES = ((BROKER,), (REGISTRY, CLICKHOUSE))
"""Start order: the registry needs the broker; the ClickHouse engine starts beside it."""
ORDER = tuple(name for stage in STAGES for name in stage)
"""Listing order; stop runs it backwards."""
LOG_ROTATION = LogRotation(max_bytes=50_000_000, backups=2)
"""Bounds of the platform services' logs: those the supervisor keeps for the gpulens processes."""


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _single_address(settings: GPULensSettings) -> tuple[str, int]:
    servers = settings.kafka.bootstrap_servers.split(",")
    host, _, port = servers[0].rpartition(":")
    if len(servers) != 1 or not port.isdigit():
        raise ConfigError(
            "kafka.bootstrap_servers must be one host:port for the embedded broker "
            f"(got {settings.kafka.bootstrap_servers!r}); set platform.broker = 'external' to use a cluster"
        )
    return host or "127.0.0.1", int(port)


def service_specs(settings: GPULensSettings, config_file: Path | None = None) -> dict[str, ServiceSpec]:
    """The services this configuration starts itself (external parts are left out).

    Components run as ``python -m gpulens serve ...``: they read the same config file and
    inherit the environment, so they see the settings their launcher saw.
    """
    platform = settings.platform
    specs: dict[str, ServiceSpec] = {}
    python = [sys.executable, "-m", "gpulens"]
    if config_file is not None:
        python += ["--config", str(config_file.resolve())]
    if platform.broker != "external":
        host, port = _single_address(settings)
        noida = platform.broker == "noida"
        specs[BROKER] = ServiceSpec(
            BROKER,
            noida_argv(host, port, platform.state_dir / "kafka") if noida else tansu_argv(host, port),
            host,
            port,
            hint="set GPULENS_KAFKA__BOOTSTRAP_SERVERS to another host:port",
            env=_noida_env(platform.broker_save_share, platform.broker_save_pause_max_s) if noida else {},
            log_rotation=LOG_ROTATION,
            thread_nice=NOIDA_THREAD_NICE if noida else {},
        )
    if platform.registry == "embedded":
        url = urlparse(settings.registry.url)
        specs[REGISTRY] = ServiceSpec(
            REGISTRY,
            [*python, "serve", "registry"],
            url.hostname or "127.0.0.1",
            url.port or 80,
            hint="set GPULENS_REGISTRY__URL to another address",
            ready=lambda: _http_ok(f"{settings.registry.url}/subjects"),
            log_rotation=LOG_ROTATION,
        )
    if platform.clickhouse == "embedded":
        ch = settings.clickhouse
        specs[CLICKHOUSE] = ServiceSpec(
            CLICKHOUSE,
            [*python, "serve", "clickhouse"],
            ch.http_host,
            ch.http_port,
            hint="set GPULENS_CLICKHOUSE__HTTP_PORT (and clickhouse.url) to another port",
            ready=lambda: _http_ok(f"http://{ch.http_host}:{ch.http_port}/ping"),
            env=engine_env(os.environ),
            log_rotation=LOG_ROTATION,
        )
    return specs


def _noida_env(save_share: float, pause_max_s: float) -> dict[str, str]:
    env = noida_env(save_share, pause_max_s, os.environ)
    if save_share < 1 and "NOIDA_SAVE_SHARE" not in env:
        log.warning(
            "%s is not built (run `make install`; it needs a C compiler): the broker saves at its own "
            "pace, a second apart however much it holds (platform.broker_save_share)",
            SAVE_PACING_LIBRARY,
        )
    return env


def manager(settings: GPULensSettings) -> ServiceManager:
    """The service manager of this configuration's state directory."""
    return ServiceManager(settings.platform.state_dir)


EPHEMERAL_PORTS = Path("/proc/sys/net/ipv4/ip_local_port_range")
"""The kernel's range of source ports for outgoing connections."""
FIRST_PORT = 20_000
_handed_out: set[int] = set()


def free_port() -> int:
    """A TCP port nobody listens on right now, below the kernel's ephemeral range.

    A port the kernel picks for ``bind(0)`` comes from the range it also gives outgoing
    connections their source ports from: between being picked and being bound by the service
    it names (seconds, for a platform's last service), any client connection may take it (a
    test suite once failed so: "port 51681 is already in use"). Ports below that range are
    never taken so; they are drawn from :data:`FIRST_PORT` up, above every default port of the
    configuration (18081, 18123, 19092, ...: a platform of the defaults may start meanwhile),
    and each is handed out once per process.
    """
    try:
        low = int(EPHEMERAL_PORTS.read_text().split()[0])
    except (OSError, ValueError, IndexError):  # not Linux
        low = 0
    if low > FIRST_PORT + 1_000:
        for port in random.sample(range(FIRST_PORT, low), 100):
            if port not in _handed_out and _bindable(port):
                _handed_out.add(port)
                return port
    with socket.socket() as sock:  # no room below the range: any port the kernel has free
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def write_private_config(directory: Path, *, broker: str = "noida", kafka_port: int | None = None) -> Path:
    """A gpulens.toml for a private platform: free ports, state under ``directory``.

    For tests, benchmarks and CI smoke runs that must not touch a platform already running.
    """
    kafka = kafka_port or free_port()
    registry, clickhouse, exporter, retention, api = (free_port() for _ in range(5))
    path = directory / "gpulens.toml"
    path.write_text(
        f"""cluster = "private"

[kafka]
bootstrap_servers = "127.0.0.1:{kafka}"

[registry]
url = "http://127.0.0.1:{registry}"

[clickhouse]
url = "http://127.0.0.1:{clickhouse}"
http_port = {clickhouse}

[exporter]
port = {exporter}

[retention]
metrics_port = {retention}

[api]
port = {api}

[platform]
state_dir = "{directory / "state"}"
broker = "{broker}"
"""
    )
    return path


def start_platform(
    services: ServiceManager,
    specs: dict[str, ServiceSpec],
    *,
    timeout: float,
    report: Callable[[str, Status | None, bool], None] = lambda _name, _status, _started: None,
) -> None:
    """Start ``specs`` by :data:`STAGES`, each unless it runs already; ``report(name, status,
    started_now)`` hears of each (status None: external). When one fails, the ones started by
    this call are stopped again (last first) before the error is raised: a failed start leaves
    nothing behind that was not running before."""
    started: list[str] = []
    try:
        for stage in STAGES:
            ours = [specs[name] for name in stage if name in specs]
            outcomes = dict(
                zip([spec.name for spec in ours], services.start_many(ours, timeout=timeout), strict=True)
            )
            for name in stage:
                status, now = outcomes.get(name, (None, False))
                if now:
                    started.append(name)
                report(name, status, now)
    except GPULensError:
        for name in reversed(started):
            log.warning("%s: stopping it again, the platform did not start", name)
            services.stop(name)
        raise


@contextmanager
def private_platform(directory: Path, *, broker: str = "noida") -> Iterator[GPULensSettings]:
    """Start a private platform under ``directory``, yield its settings, stop it whatever happens."""
    config_file = write_private_config(directory, broker=broker)
    settings = load_settings(config_file)
    services = manager(settings)
    specs = service_specs(settings, config_file)
    try:
        start_platform(services, specs, timeout=settings.platform.start_timeout_s)
        yield settings
    finally:
        for name in reversed(ORDER):
            services.stop(name)
