"""Starting and stopping background services, each remembered by a pid file.

``start`` is idempotent (a live service is left alone), refuses a port someone else holds
with a one-line error that says what to do, and waits until the service answers. ``stop``
signals only processes this module started, identified by pid and command line, so a
recycled pid or a stranger on the same port is never touched.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from schemas.exceptions import GPULensError

log = logging.getLogger(__name__)


class LaunchError(GPULensError):
    """A service could not be started; the message says what to do."""


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    """How to run one service and how to tell it is ready."""

    name: str
    argv: Sequence[str]
    host: str = "127.0.0.1"
    port: int | None = None
    """The port it serves on; None for a worker that serves nothing (ready once it stays up)."""
    hint: str = ""
    """What to do when the port is taken (e.g. which setting moves it)."""
    env: dict[str, str] = field(default_factory=dict)
    ready: Callable[[], bool] | None = None
    """Extra readiness check after the port accepts connections."""


class State(StrEnum):
    RUNNING = "running"
    STOPPED = "stopped"
    STALE = "stale"
    """A pid file whose process is gone (crashed or killed)."""


@dataclass(frozen=True, slots=True)
class Status:
    name: str
    state: State
    pid: int | None = None
    port: int | None = None
    log: Path | None = None


PORTLESS_GRACE_S = 2.0
"""A service without a port counts as started once it has stayed up this long."""

# Children this process started, by pid, whichever manager started them: kept so that a
# stopped child is reaped here instead of lingering as a zombie.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    """Something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


class ServiceManager:
    """Services under one state directory: ``run/NAME.pid`` and ``logs/NAME.log``."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self._run = state_dir / "run"
        self._logs = state_dir / "logs"

    def _pidfile(self, name: str) -> Path:
        return self._run / f"{name}.pid"

    def log_path(self, name: str) -> Path:
        """Where a service's output goes."""
        return self._logs / f"{name}.log"

    def status(self, name: str) -> Status:
        """Whether ``name`` runs, by its pid file and the process's command line."""
        pidfile = self._pidfile(name)
        try:
            record = json.loads(pidfile.read_text())
        except (OSError, ValueError):
            return Status(name, State.STOPPED)
        pid, argv = int(record["pid"]), list(record["argv"])
        alive = _cmdline(pid)[: len(argv)] == argv and not _is_zombie(pid)
        return Status(
            name, State.RUNNING if alive else State.STALE, pid, record.get("port"), self.log_path(name)
        )

    def start(self, spec: ServiceSpec, *, timeout: float = 60.0) -> tuple[Status, bool]:
        """Start ``spec`` unless it already runs; (status, whether it was started now)."""
        current = self.status(spec.name)
        if current.state is State.RUNNING:
            return current, False
        executable = Path(spec.argv[0])
        if not executable.exists():
            raise LaunchError(f"{spec.name}: {executable} is missing; run `make install` to install it")
        if spec.port is not None and port_open(spec.host, spec.port):
            raise LaunchError(
                f"{spec.name}: port {spec.port} on {spec.host} is already in use by another program; "
                f"stop it or {spec.hint or 'choose another port'}"
            )
        self._run.mkdir(parents=True, exist_ok=True)
        self._logs.mkdir(parents=True, exist_ok=True)
        with self.log_path(spec.name).open("ab") as out:
            process = subprocess.Popen(
                list(spec.argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() signals it whole
                env={**os.environ, **spec.env},
            )
        _CHILDREN[process.pid] = process
        record = {"pid": process.pid, "argv": list(spec.argv), "port": spec.port, "started": time.time()}
        self._pidfile(spec.name).write_text(json.dumps(record))
        started = time.monotonic()
        deadline = started + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                _CHILDREN.pop(process.pid, None)
                self._pidfile(spec.name).unlink(missing_ok=True)
                raise LaunchError(
                    f"{spec.name} exited with code {process.returncode} while starting; "
                    f"last lines of {self.log_path(spec.name)}:\n{self.tail(spec.name)}"
                )
            if self._ready(spec, started):
                log.info("%s ready (pid %d)", spec.name, process.pid)
                return self.status(spec.name), True
            time.sleep(0.05)
        self.stop(spec.name)
        raise LaunchError(
            f"{spec.name} did not become ready within {timeout:.0f}s; see {self.log_path(spec.name)}"
        )

    @staticmethod
    def _ready(spec: ServiceSpec, started: float) -> bool:
        if spec.port is not None and not port_open(spec.host, spec.port):
            return False
        if spec.port is None and spec.ready is None:
            return time.monotonic() - started >= PORTLESS_GRACE_S
        return spec.ready is None or spec.ready()

    def stop(self, name: str, *, timeout: float = 15.0) -> bool:
        """Stop ``name`` if this manager started it; whether a process was stopped."""
        current = self.status(name)
        pidfile = self._pidfile(name)
        if current.state is not State.RUNNING or current.pid is None:
            pidfile.unlink(missing_ok=True)
            return False
        _signal_group(current.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.status(name).state is State.RUNNING:
            time.sleep(0.05)
        if self.status(name).state is State.RUNNING:
            log.warning("%s did not stop within %.0fs; killing it", name, timeout)
            _signal_group(current.pid, signal.SIGKILL)
        child = _CHILDREN.pop(current.pid, None)
        if child is not None:
            child.wait(timeout)
        pidfile.unlink(missing_ok=True)
        return True

    def reap(self, name: str) -> int | None:
        """The exit status of ``name`` if it was started here and has exited (its pid file is
        removed); None when unknown (started by another process, or still running)."""
        current = self.status(name)
        if current.state is State.RUNNING or current.pid is None:
            return None
        self._pidfile(name).unlink(missing_ok=True)
        child = _CHILDREN.pop(current.pid, None)
        return None if child is None else child.wait()

    def tail(self, name: str, lines: int = 15) -> str:
        """The last lines a service wrote."""
        try:
            text = self.log_path(name).read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        os.kill(pid, sig)


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"
