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
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import BinaryIO

from gpulens.infra.log_writing import LogRotation, shift_backups
from gpulens.schemas.model.exceptions import GPULensError

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
    log_rotation: LogRotation | None = None
    """Bound its log: its output goes through a rotating writer (:mod:`gpulens.infra.log_writing`).
    None: it appends to its log file directly (a supervisor may rotate it by copying)."""
    thread_nice: Mapping[str, int] = field(default_factory=dict)
    """Threads of the service by name (their ``/proc`` comm), set to this nice value once it is
    ready: its background work yields to the samples' path (Linux nice is per thread)."""


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
NAMED_THREADS_S = 5.0
"""How long a ready service's threads named in :attr:`ServiceSpec.thread_nice` are waited for:
noida-db's saving thread usually exists once the broker answers, but once, on a busy machine, it
did not yet, and it ran at the broker's priority for the whole run."""

_TICK = os.sysconf("SC_CLK_TCK")

# Children this process started, by pid, whichever manager started them: kept so that a
# stopped child is reaped here instead of lingering as a zombie.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}
# The log writers of those children, by the child's pid: reaped once the child is.
_WRITERS: dict[int, subprocess.Popen[bytes]] = {}
WRITER_DRAIN_S = 10.0
"""How long a log writer may take to write what its exited service left in the pipe."""


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
        return self.start_many([spec], timeout=timeout)[0]

    def start_many(self, specs: Sequence[ServiceSpec], *, timeout: float = 60.0) -> list[tuple[Status, bool]]:
        """:meth:`start` for each of ``specs``, all launched before any is waited for: their
        start-up times overlap instead of adding up. A failed one stops the ones launched with it."""
        launched: dict[str, tuple[subprocess.Popen[bytes], float]] = {}
        try:
            for spec in specs:
                if self.status(spec.name).state is not State.RUNNING:
                    launched[spec.name] = self._launch(spec), time.monotonic()
            for spec in specs:
                if spec.name in launched:
                    self._await_ready(spec, *launched[spec.name], timeout=timeout)
                    _lower_threads(spec, launched[spec.name][0].pid)
        except LaunchError:
            for name in launched:
                self.stop(name)
            raise
        return [(self.status(spec.name), spec.name in launched) for spec in specs]

    def _launch(self, spec: ServiceSpec) -> subprocess.Popen[bytes]:
        """The service's process, running and recorded in its pid file."""
        executable = Path(spec.argv[0])
        if not executable.exists():
            raise LaunchError(f"{spec.name}: {executable} is missing; run `make install` to install it")
        if spec.port is not None and port_open(spec.host, spec.port):
            raise LaunchError(
                f"{spec.name}: port {spec.port} on {spec.host} is already in use by another program; "
                f"stop it or {spec.hint or 'choose another port'}"
            )
        try:
            self._run.mkdir(parents=True, exist_ok=True)
            self._logs.mkdir(parents=True, exist_ok=True)
            out, writer = self._output(spec)
        except OSError as err:
            raise LaunchError(f"{spec.name}: cannot write under {self.state_dir}: {err}") from err
        with out:  # closed here: the service (and the writer) alone hold the log then
            process = subprocess.Popen(
                list(spec.argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() signals it whole
                env={**os.environ, **spec.env},
            )
        _CHILDREN[process.pid] = process
        if writer is not None:  # it ends when the service's end of the pipe closes
            _WRITERS[process.pid] = writer
        record = {"pid": process.pid, "argv": list(spec.argv), "port": spec.port, "started": time.time()}
        try:
            self._pidfile(spec.name).write_text(json.dumps(record))
        except OSError as err:  # unrecorded, nobody could stop it: it must not run
            _signal_group(process.pid, signal.SIGKILL)
            process.wait()
            _CHILDREN.pop(process.pid, None)
            raise LaunchError(f"{spec.name}: cannot write its pid file: {err}") from err
        return process

    def _await_ready(
        self, spec: ServiceSpec, process: subprocess.Popen[bytes], started: float, *, timeout: float
    ) -> None:
        """Wait until the launched ``process`` of ``spec`` is ready; an error if it exits first
        or takes longer than ``timeout`` seconds from its launch."""
        deadline = started + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                _CHILDREN.pop(process.pid, None)
                _drain_writer(process.pid)
                self._pidfile(spec.name).unlink(missing_ok=True)
                raise LaunchError(
                    f"{spec.name} exited with code {process.returncode} while starting; "
                    f"last lines of {self.log_path(spec.name)}:\n{self.tail(spec.name)}"
                )
            if self._ready(spec, started):
                log.info("%s ready (pid %d)", spec.name, process.pid)
                return
            time.sleep(0.05)
        self.stop(spec.name)
        raise LaunchError(
            f"{spec.name} did not become ready within {timeout:.0f}s; see {self.log_path(spec.name)}"
        )

    def _output(self, spec: ServiceSpec) -> tuple[BinaryIO, subprocess.Popen[bytes] | None]:
        """Where the service writes: its log file, or the pipe into its log writer."""
        path = self.log_path(spec.name)
        if spec.log_rotation is None:
            return path.open("ab"), None
        read, write = os.pipe()
        # The writer's own errors go to the log too: a launcher's stdout or stderr held open by
        # a writer that outlives it would keep whoever reads the launcher's output waiting.
        with os.fdopen(read, "rb") as source, path.open("ab") as errors:
            writer = subprocess.Popen(
                spec.log_rotation.argv(path),
                stdin=source,
                stdout=errors,
                stderr=errors,
                start_new_session=True,  # signals meant for the service never end its writer
            )
        return os.fdopen(write, "wb"), writer

    @staticmethod
    def _ready(spec: ServiceSpec, started: float) -> bool:
        if spec.port is None and spec.ready is None:
            return time.monotonic() - started >= PORTLESS_GRACE_S
        return ServiceManager.answers(spec)

    @staticmethod
    def answers(spec: ServiceSpec) -> bool:
        """Whether ``spec``'s service answers: its port open and its readiness check passed
        (true for a service that serves nothing)."""
        if spec.port is not None and not port_open(spec.host, spec.port):
            return False
        return spec.ready is None or spec.ready()

    def stop(self, name: str, *, stall_s: float = 30.0, report_every_s: float = 5.0) -> bool:
        """Stop ``name`` if this manager started it; whether a process was stopped.

        SIGTERM, then wait for the process to exit for as long as it keeps working: a broker
        holding a gigabyte writes its snapshot for minutes, and killing it then loses what it
        holds. Only a service that has done nothing (no CPU time, no bytes written, counting
        its descendants) for ``stall_s`` is killed with SIGKILL. Progress is logged every
        ``report_every_s``.
        """
        current = self.status(name)
        pidfile = self._pidfile(name)
        if current.state is not State.RUNNING or current.pid is None:
            pidfile.unlink(missing_ok=True)
            return False
        _signal_group(current.pid, signal.SIGTERM)
        began = last_report = sampled = time.monotonic()
        activity = _Activity.of(current.pid)
        active_at = began
        while self.status(name).state is State.RUNNING:
            time.sleep(0.05)
            now = time.monotonic()
            if now - sampled < 1.0:  # reading /proc for the whole tree costs: once a second
                continue
            sampled, seen = now, _Activity.of(current.pid)
            if seen != activity:
                activity, active_at = seen, now
            elif now - active_at >= stall_s:
                log.warning("%s did nothing for %.0f s after SIGTERM; killing it", name, stall_s)
                _signal_group(current.pid, signal.SIGKILL)
                break
            if now - last_report >= report_every_s:
                last_report = now
                log.info(
                    "%s still stopping after %.0f s (pid %d: %.1f CPU s, %.2f GB written since start)",
                    name,
                    now - began,
                    current.pid,
                    activity.cpu_s,
                    activity.written / 1e9,
                )
        child = _CHILDREN.pop(current.pid, None)
        if child is not None:
            child.wait()
        _drain_writer(current.pid)
        pidfile.unlink(missing_ok=True)
        return True

    def reap(self, name: str) -> int | None:
        """The exit status of ``name`` if it was started here and has exited (its pid file is
        removed); None when unknown (started by another process, or still running)."""
        current = self.status(name)
        if current.state is State.RUNNING or current.pid is None:
            return None
        child = _CHILDREN.pop(current.pid, None)
        code = None if child is None else child.wait()
        _drain_writer(current.pid)
        self._pidfile(name).unlink(missing_ok=True)
        return code

    def rotate_log(self, name: str, *, max_bytes: int, backups: int) -> bool:
        """Rotate ``name``'s log once it exceeds ``max_bytes``: LOG -> LOG.1 -> ... -> LOG.<backups>.

        The service keeps its file open for appending and cannot be told to reopen it, so the
        log is copied and then truncated in place (logrotate's copytruncate): lines written
        between the copy and the truncation are lost, the space is bounded. Whether it rotated.
        """
        path = self.log_path(name)
        try:
            if path.stat().st_size <= max_bytes:
                return False
            shift_backups(path, backups)
            if backups > 0:
                shutil.copyfile(path, path.with_name(f"{path.name}.1"))
            os.truncate(path, 0)
        except FileNotFoundError:
            return False
        return True

    def tail(self, name: str, lines: int = 15) -> str:
        """The last lines a service wrote."""
        try:
            text = self.log_path(name).read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def _lower_threads(spec: ServiceSpec, pid: int) -> None:
    """Set the nice value of ``spec``'s named threads in process ``pid`` (:attr:`ServiceSpec.thread_nice`),
    waiting up to :data:`NAMED_THREADS_S` for those not started yet."""
    if not spec.thread_nice:
        return
    found: set[str] = set()
    deadline = time.monotonic() + NAMED_THREADS_S
    while True:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                name = (task / "comm").read_text().strip()
                if name in spec.thread_nice and name not in found:
                    os.setpriority(os.PRIO_PROCESS, int(task.name), spec.thread_nice[name])
                    found.add(name)
            except OSError:  # the thread ended meanwhile
                continue
        if found == spec.thread_nice.keys() or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    for name in sorted(found):
        log.info("%s: thread %s at nice %d", spec.name, name, spec.thread_nice[name])
    for name in sorted(spec.thread_nice.keys() - found):
        log.warning("%s: no thread named %s to lower; it runs at the service's priority", spec.name, name)


def _drain_writer(pid: int) -> None:
    """Reap the log writer of the exited service ``pid`` once it wrote what was left."""
    writer = _WRITERS.pop(pid, None)
    if writer is None:
        return
    try:
        writer.wait(WRITER_DRAIN_S)
    except subprocess.TimeoutExpired:  # a grandchild still holds the pipe: it ends with it
        log.warning("the log writer of pid %d still runs after %.0f s", pid, WRITER_DRAIN_S)


@dataclass(frozen=True, slots=True)
class _Activity:
    """The work a process tree has done so far: it is busy while this changes."""

    cpu_s: float
    written: int
    """Bytes passed to write calls (``wchar``)."""

    @classmethod
    def of(cls, pid: int) -> _Activity:
        cpu_s, written = 0.0, 0
        for member in (pid, *_descendants(pid)):
            try:
                stat = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
                io = Path(f"/proc/{member}/io").read_text()
            except OSError:
                continue
            cpu_s += (int(stat[11]) + int(stat[12])) / _TICK
            written += int(next(line for line in io.splitlines() if line.startswith("wchar:")).split()[1])
        return cls(cpu_s, written)


def _descendants(pid: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


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
